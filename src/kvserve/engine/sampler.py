"""Token sampling with llama.cpp's sampler-chain semantics, batched over sequences.

One ``SequenceSampler`` per generating sequence holds what is per request: the parameters, its
own CPU ``torch.Generator`` (a fixed seed gives the same tokens whatever else is in the batch),
the penalty / DRY windows of accepted tokens (prompt + generated: llama-server accepts the
prompt tokens into its sampler before the first draw), and mirostat / adaptive-p state.

``sample_batch(logits[B, V], samplers)`` runs, per row (``common_sampler_init`` order):

    logit_bias (+ every EOG id at -inf with ignore_eos)
    → the request's ``samplers`` in order (default: penalties dry top_n_sigma top_k typ_p
      top_p min_p xtc temperature)
    → final pick: dist (seeded draw) | adaptive_p;
    mirostat 1/2 replaces the chain by: logit_bias → temperature → mirostat.

A chain with temperature <= 0 (no dynatemp, no typ_p/xtc before it) is "greedy": the result is
exactly argmax(logits + biases) after the penalties/DRY that precede temperature.

Rows with the same plan (active stages + final pick) are sampled together: their candidates
are one [b, W] float32 tensor on the logits' device, a removed candidate is -inf, and the
truncating stages (top_k, top_p, typ_p) shrink W, so after top_k the default chain works on
~40 columns. llama.cpp shrinks its array instead of writing -inf; only dynatemp's maximum
entropy (log of the number of candidates) tells them apart, when -inf logits remain in
llama.cpp's array (logit_bias bans, top_n_sigma).
DRY, XTC's coin flip and mirostat run per row. The final draw walks the live candidates in
token-id order with one uniform from the row's generator. The "infill" sampler is accepted in
``samplers`` but not applied.

The batched stages and the final picks live in ``sampler_stages``; DRY lives in ``dry``.
"""

from __future__ import annotations

import math
import secrets
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Iterable, Sequence

import torch
from torch import Tensor

from kvserve.engine.dry import DryBreakers, build_dry_breakers, dry_penalties
from kvserve.engine.sampler_stages import (
    _STAGES,
    _WRITES_IN_PLACE,
    NEG_INF,
    _adaptive_transform,
    _Cand,
    _Group,
    _mirostat_keep,
    _pick,
    _vec,
)
from kvserve.engine.sampling_params import SamplingParams

__all__ = ["NEG_INF", "DryBreakers", "SampleResult", "SequenceSampler", "build_dry_breakers", "build_plan",
           "sample_batch"]


@dataclass(frozen=True)
class SampleResult:
    """One sampled token.

    Raw mode (default): ``logprob`` is log-softmax of the raw logits at ``token`` and ``top``
    holds the ``n_probs`` highest raw (id, logprob). With ``post_sampling_probs``
    (``is_prob``): ``logprob`` is the probability of ``token`` among the final candidates and
    ``top`` holds up to ``n_probs`` (id, prob) of those candidates, zero probabilities dropped.
    """

    token: int
    logprob: float
    top: list[tuple[int, float]] = field(default_factory=list)
    is_prob: bool = False


def _stage_active(name: str, p: SamplingParams) -> bool:
    if name == "penalties":
        return p.repeat_last_n != 0 and not (
            p.repeat_penalty == 1.0 and p.frequency_penalty == 0.0 and p.presence_penalty == 0.0
        )
    if name == "dry":
        return p.dry_multiplier != 0.0 and p.dry_base >= 1.0 and (
            p.dry_penalty_last_n > 0 or p.dry_penalty_last_n == -1
        )
    if name == "top_n_sigma":
        return p.top_n_sigma > 0.0
    if name == "top_k":
        return p.top_k > 0
    if name == "typ_p":
        return p.typical_p < 1.0
    if name == "top_p":
        return p.top_p < 1.0
    if name == "min_p":
        return p.min_p > 0.0
    if name == "xtc":
        return p.xtc_probability > 0.0 and p.xtc_threshold <= 0.5
    if name == "temperature":
        return not (p.temperature == 1.0 and p.dynatemp_range <= 0.0)
    return False  # infill: not applied; adaptive_p: a final pick


def build_plan(p: SamplingParams) -> tuple[tuple[str, ...], str]:
    """(stages to run in order, final pick) for ``p``; inactive stages are left out."""
    if p.mirostat in (1, 2):
        return (("temp",) if p.temperature != 1.0 else ()), f"mirostat{p.mirostat}"
    stages = tuple(n for n in p.samplers if _stage_active(n, p))
    final = "adaptive_p" if "adaptive_p" in p.samplers else "dist"
    if final == "dist" and "temperature" in stages and p.temperature <= 0.0 and p.dynatemp_range <= 0.0:
        before = stages[: stages.index("temperature")]
        if "typ_p" not in before and "xtc" not in before:
            return tuple(n for n in before if n in ("penalties", "dry")), "greedy"
    return stages, final


class SequenceSampler:
    """Sampler state of one sequence; feed every accepted token to ``accept``.

    ``history``: tokens already accepted (the prompt), as llama-server feeds them.
    ``dry_breakers``: from ``build_dry_breakers`` (None: DRY runs without restart sequences).
    ``n_ctx_train``: bounds DRY's window (llama.cpp's total context size); 0 = unbounded.
    """

    def __init__(
        self,
        params: SamplingParams,
        vocab_size: int,
        eog_ids: Iterable[int] = (),
        history: Iterable[int] = (),
        *,
        dry_breakers: DryBreakers | None = None,
        n_ctx_train: int = 0,
    ) -> None:
        self.params = params
        self.vocab_size = int(vocab_size)
        self.eog_ids = tuple(int(t) for t in eog_ids)
        self.seed = secrets.randbits(32) if params.is_random_seed else params.seed_u32
        self.rng = torch.Generator(device="cpu")
        self.rng.manual_seed(self.seed)
        self.plan, self.final = build_plan(params)

        bias = list(params.logit_bias)
        if params.ignore_eos:
            bias += [(t, NEG_INF) for t in self.eog_ids]
        self.bias = [(t, b) for t, b in bias if 0 <= t < self.vocab_size]

        hist = [t for t in map(int, history) if 0 <= t < self.vocab_size]
        n_pen = params.repeat_last_n
        self._pen_on = "penalties" in self.plan
        self._pen_win: deque[int] = deque(maxlen=n_pen if n_pen > 0 else None)
        self._pen_counts: Counter[int] = Counter()
        if self._pen_on:
            self._pen_win.extend(hist)
            self._pen_counts = Counter(self._pen_win)

        n_dry = params.dry_penalty_last_n
        if n_dry == -1:
            n_dry = n_ctx_train
        if n_ctx_train > 0 and n_dry > 0:
            n_dry = min(n_dry, n_ctx_train)
        self._dry_on = "dry" in self.plan
        self._dry_win: deque[int] = deque(maxlen=n_dry if n_dry > 0 else None)
        self.dry_breakers: DryBreakers = dry_breakers or {}
        if self._dry_on:
            self._dry_win.extend(hist)

        self.mu = 2.0 * params.mirostat_tau
        self._pending_mu: float | None = None
        decay = min(max(params.adaptive_decay, 0.0), 0.99)
        self._ap_decay = decay
        self._ap_sum = params.adaptive_target / (1.0 - decay)
        self._ap_weight = 1.0 / (1.0 - decay)
        self._ap_pending: tuple[int, float] | None = None

    def accept(self, token: int) -> None:
        """Record an accepted token: penalty/DRY windows, mirostat mu, adaptive-p average."""
        token = int(token)
        if self._pen_on and 0 <= token < self.vocab_size:
            win = self._pen_win
            if win.maxlen is not None and len(win) == win.maxlen:
                old = win[0]
                self._pen_counts[old] -= 1
                if self._pen_counts[old] <= 0:
                    del self._pen_counts[old]
            win.append(token)
            self._pen_counts[token] += 1
        if self._dry_on and 0 <= token < self.vocab_size:
            self._dry_win.append(token)
        if self._pending_mu is not None:
            self.mu = self._pending_mu
            self._pending_mu = None
        if self._ap_pending is not None:
            tok, p_orig = self._ap_pending
            if tok == token:
                self._ap_sum = p_orig + self._ap_decay * self._ap_sum
                self._ap_weight = 1.0 + self._ap_decay * self._ap_weight
            self._ap_pending = None

    def sample(self, logits: Tensor) -> SampleResult:
        """Sample one token from a [V] (or [1, V]) logits row."""
        return sample_batch(logits.reshape(1, -1), [self])[0]

    # -- per-row helpers used by the stages --------------------------------------------------

    def dry_penalties(self) -> dict[int, float]:
        """token -> DRY logit penalty for the next position (llama.cpp's four steps)."""
        return dry_penalties(self.params, self._dry_win, self.dry_breakers)


def _run_group(raw: Tensor, rows: list[int], g: _Group) -> list[SampleResult]:
    seqs, plan, final = g.seqs, g.seqs[0].plan, g.seqs[0].final
    bias = [(j, t, b) for j, s in enumerate(seqs) for t, b in s.bias]
    if len(rows) < raw.shape[0]:
        x = raw[_vec(rows, raw, torch.long)]
    elif bias or _WRITES_IN_PLACE.intersection(plan) or final.startswith("mirostat"):
        x = raw.clone()
    else:
        x = raw  # every stage of this plan returns new tensors
    if bias:
        r, t, b = zip(*bias)
        x.index_put_((_vec(r, x, torch.long), _vec(t, x, torch.long)), _vec(b, x), accumulate=True)
    c = _Cand(x)
    for name in plan:
        c = _STAGES[name](c, g)
    prob_orig = None
    if final == "greedy":
        col = c.vals.argmax(-1)
        token = c.token_ids().gather(-1, col[:, None]).squeeze(-1)
        prob = torch.ones_like(c.vals[:, 0])
        c = _Cand(torch.ones_like(c.vals[:, :1]), token[:, None])
    else:
        if final.startswith("mirostat"):
            for i, s in enumerate(seqs):
                c.vals[i] = _mirostat_keep(c.vals[i], s)
        if final == "adaptive_p":
            p_orig, ids_before = _adaptive_transform(c, g), c.token_ids()
        token, prob = _pick(c, g)
        if final == "adaptive_p":
            col = (ids_before == token[:, None]).to(torch.uint8).argmax(-1)
            prob_orig = p_orig.gather(-1, col[:, None]).squeeze(-1)
    return _finish(raw, rows, g, c, token, prob, prob_orig)


def _finish(raw: Tensor, rows: list[int], g: _Group, post: _Cand, token: Tensor, prob: Tensor,
            prob_orig: Tensor | None) -> list[SampleResult]:
    """One device-to-host copy per group: token, probabilities and logprobs of every row.

    Row layout: token, prob, raw logprob[, adaptive-p original prob], post-sampling top ids and
    probs (kp each), raw top ids and logprobs (kr each).
    """
    seqs = g.seqs
    rr = raw if len(rows) == raw.shape[0] else raw[_vec(rows, raw, torch.long)]
    lse = torch.logsumexp(rr, -1)
    parts = [token.double(), prob.double(), (rr.gather(-1, token[:, None]).squeeze(-1) - lse).double()]
    if prob_orig is not None:
        parts.append(prob_orig.double())
    cols = [torch.stack(parts, -1)]
    kp = min(max([s.params.n_probs for s in seqs if s.params.post_sampling_probs] or [0]), post.vals.shape[1])
    kr = min(max([s.params.n_probs for s in seqs if not s.params.post_sampling_probs] or [0]), rr.shape[1])
    if kp:
        vals, at = torch.topk(post.vals, kp, dim=-1)
        cols += [post.token_ids().gather(-1, at).double(), vals.double()]
    if kr:
        vals, ids = torch.topk(rr, kr, dim=-1)
        cols += [ids.double(), (vals - lse[:, None]).double()]
    base = len(parts)
    results = []
    for s, row in zip(seqs, torch.cat(cols, -1).tolist()):
        tok, p_tok, lp_tok, m = int(row[0]), row[1], row[2], s.params.n_probs
        if s.final.startswith("mirostat") and p_tok > 0.0:
            s._pending_mu = s.mu - s.params.mirostat_eta * (-math.log2(p_tok) - s.params.mirostat_tau)
        if prob_orig is not None and s.params.adaptive_target >= 0.0:
            s._ap_pending = (tok, row[3])
        if s.params.post_sampling_probs:
            ids, ps = row[base : base + kp], row[base + kp : base + 2 * kp]
            top = [(int(t), q) for t, q in zip(ids, ps) if q > 0.0][:m]
            results.append(SampleResult(tok, p_tok, top, True))
        else:
            at0 = base + 2 * kp
            ids, lps = row[at0 : at0 + kr], row[at0 + kr : at0 + 2 * kr]
            results.append(SampleResult(tok, lp_tok, [(int(t), lp) for t, lp in zip(ids, lps)][:m]))
    return results


def sample_batch(logits: Tensor, samplers: Sequence[SequenceSampler]) -> list[SampleResult]:
    """Sample one token per row of ``logits`` [B, V'] (V' >= vocab_size; extra columns ignored).

    Rows are independent: row i uses only ``samplers[i]`` (its parameters, history and RNG).
    Each row draws exactly one uniform from its generator per call (plus one per XTC coin
    flip), so a seeded sequence is reproducible whatever shares its batch. Rows with the same
    plan are sampled together. ``accept`` is not called here: the caller accepts the token.
    """
    samplers = list(samplers)
    B = len(samplers)
    if B == 0:
        return []
    if logits.dim() != 2 or logits.shape[0] != B:
        raise ValueError(f"logits must be [{B}, V], got {tuple(logits.shape)}")
    V = samplers[0].vocab_size
    if any(s.vocab_size != V for s in samplers) or logits.shape[1] < V:
        raise ValueError("all samplers must share vocab_size <= logits.shape[1]")
    raw = logits[:, :V].float()
    groups: dict[tuple[tuple[str, ...], str], list[int]] = {}
    for i, s in enumerate(samplers):
        groups.setdefault((s.plan, s.final), []).append(i)
    by_row: dict[int, SampleResult] = {}
    for rows in groups.values():
        g = _Group([samplers[i] for i in rows], raw.device)
        by_row.update(zip(rows, _run_group(raw, rows, g)))
    return [by_row[i] for i in range(B)]
