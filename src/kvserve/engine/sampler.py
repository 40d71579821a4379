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

Candidates stay a dense [B, V] float32 tensor on the logits' device; a removed candidate is
-inf (llama.cpp shrinks its array instead; only dynatemp's max entropy, which counts the
remaining candidates, could tell the two apart when logit_bias banned some). Rows that run the
same stage at the same step are processed by the same batched ops; DRY, XTC's coin flip and
mirostat run per row. The "infill" sampler is accepted in ``samplers`` but not applied.
"""

from __future__ import annotations

import math
import secrets
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Callable, Iterable, Mapping, Sequence

import torch
from torch import Tensor

from kvserve.engine.sampling_params import SamplingParams

NEG_INF = float("-inf")

# head token -> tails (token tuples) of the DRY sequence breakers that start with it.
DryBreakers = Mapping[int, Sequence[tuple[int, ...]]]

_DRY_MAX_CHARS = 40
_DRY_MAX_TAIL = 20


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

        hist = list(history)
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
        self.n_accepted = len(hist)

    def accept(self, token: int) -> None:
        """Record an accepted token: penalty/DRY windows, mirostat mu, adaptive-p average."""
        token = int(token)
        if self._pen_on:
            win = self._pen_win
            if win.maxlen is not None and len(win) == win.maxlen:
                old = win[0]
                self._pen_counts[old] -= 1
                if self._pen_counts[old] <= 0:
                    del self._pen_counts[old]
            win.append(token)
            self._pen_counts[token] += 1
        if self._dry_on:
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
        self.n_accepted += 1

    def sample(self, logits: Tensor) -> SampleResult:
        """Sample one token from a [V] (or [1, V]) logits row."""
        return sample_batch(logits.reshape(1, -1), [self])[0]

    # -- per-row helpers used by the stages --------------------------------------------------

    def dry_penalties(self) -> dict[int, float]:
        """token -> DRY logit penalty for the next position (llama.cpp's four steps)."""
        p = self.params
        allowed = p.dry_allowed_length
        rat = list(reversed(self._dry_win))  # rat[i]: i-th most recent token
        n = len(rat)
        if n <= allowed:
            return {}
        rep_limit = n  # step 1: the most recent restart sequence bounds the repeat length
        for i, tok in enumerate(rat):
            tails = self.dry_breakers.get(tok)
            if not tails:
                continue
            longest = -1
            for tail in tails:
                m = len(tail)
                if longest < m <= i and all(tail[o] == rat[i - o - 1] for o in range(m)):
                    longest = m
            if longest >= 0:
                rep_limit = i - longest
                break
        if rep_limit < allowed:
            return {}
        z = _z_function(rat)  # step 2: z[k] = length of the suffix repeated ending k tokens back
        best: dict[int, int] = {}
        for k in range(1, n):  # step 3: the token after each repeat would extend it
            length = min(z[k], rep_limit)
            if length >= allowed:
                tok = rat[k - 1]
                if best.get(tok, -1) < length:
                    best[tok] = length
        max_exp = int(88.7228391 / math.log(p.dry_base)) if p.dry_base > 1.000001 else 0
        out: dict[int, float] = {}
        for tok, length in best.items():  # step 4: single-token breakers are never penalised
            if () in self.dry_breakers.get(tok, ()):
                continue
            e = length - allowed
            if max_exp > 0 and e > max_exp:
                e = max_exp
            out[tok] = p.dry_multiplier * p.dry_base**e
        return out


def _z_function(s: Sequence[int]) -> list[int]:
    n = len(s)
    z = [0] * n
    if n:
        z[0] = n
    lt = rt = 0
    for k in range(1, n):
        if k < rt:
            z[k] = min(rt - k, z[k - lt])
        while k + z[k] < n and s[z[k]] == s[k + z[k]]:
            z[k] += 1
        if k + z[k] > rt:
            lt, rt = k, k + z[k]
    return z


def build_dry_breakers(
    breakers: Iterable[str],
    token_bytes: Sequence[bytes],
    tokenize: Callable[[str], list[int]],
) -> dict[int, tuple[tuple[int, ...], ...]]:
    """DRY restart sequences over a vocabulary (llama.cpp's ``get_overlapping_token_sequences``).

    A token whose text contains a breaker is a single-token breaker (empty tail). A token whose
    text ends with a prefix of a breaker is a head; the tail is the tokenization (no specials)
    of the rest of the breaker, at most 20 tokens. Breakers are cut to 40 bytes. This scans the
    whole vocabulary: build it once per distinct breaker list and reuse it.
    """
    out: dict[int, list[tuple[int, ...]]] = {}
    for raw in breakers:
        brk = raw.encode("utf-8")[:_DRY_MAX_CHARS]
        if not brk:
            continue
        first = brk[0:1]
        for tok, word in enumerate(token_bytes):
            if brk in word:
                out.setdefault(tok, [])
                if () not in out[tok]:
                    out[tok].append(())
                continue
            pos = word.find(first)
            while pos != -1:
                rest = len(word) - pos
                if rest < len(brk) and word[pos:] == brk[:rest]:
                    tail = tuple(tokenize(brk[rest:].decode("utf-8", "ignore"))[:_DRY_MAX_TAIL])
                    lst = out.setdefault(tok, [])
                    if tail not in lst:
                        lst.append(tail)
                pos = word.find(first, pos + 1)
    return {t: tuple(v) for t, v in out.items()}


# -- batched stages: f(x[b, V], seqs, ub) -> x; ub[i] bounds row i's live candidates ----------


def _vec(values: list[float] | list[int], x: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
    return torch.tensor(values, dtype=dtype, device=x.device)


def _sorted_top(x: Tensor, n: int) -> tuple[Tensor, Tensor]:
    """The n largest of each row, descending; equal values ordered by token id."""
    if n >= x.shape[1]:
        return torch.sort(x, dim=-1, descending=True, stable=True)
    vals, idx = torch.topk(x, n, dim=-1, sorted=True)
    idx, perm = idx.sort(dim=-1)
    vals, perm2 = vals.gather(-1, perm).sort(dim=-1, descending=True, stable=True)
    return vals, idx.gather(-1, perm2)


def _rebuild(x: Tensor, idx: Tensor, vals: Tensor, keep: Tensor) -> Tensor:
    """A row set holding only the kept (idx, vals); everything else -inf."""
    return torch.full_like(x, NEG_INF).scatter_(1, idx, torch.where(keep, vals, NEG_INF))


def _stage_penalties(x: Tensor, seqs: list[SequenceSampler], ub: list[int]) -> Tensor:
    rows: list[int] = []
    toks: list[int] = []
    cnts: list[int] = []
    for i, s in enumerate(seqs):
        for tok, c in s._pen_counts.items():
            if 0 <= tok < x.shape[1]:
                rows.append(i)
                toks.append(tok)
                cnts.append(c)
    if not rows:
        return x
    r, t = _vec(rows, x, torch.long), _vec(toks, x, torch.long)
    rp = _vec([seqs[i].params.repeat_penalty for i in rows], x)
    fp = _vec([seqs[i].params.frequency_penalty for i in rows], x)
    pp = _vec([seqs[i].params.presence_penalty for i in rows], x)
    v = x[r, t]
    v = torch.where(v <= 0, v * rp, v / rp) - (_vec(cnts, x) * fp + pp)
    x[r, t] = v
    return x


def _stage_dry(x: Tensor, seqs: list[SequenceSampler], ub: list[int]) -> Tensor:
    rows: list[int] = []
    toks: list[int] = []
    pens: list[float] = []
    for i, s in enumerate(seqs):
        for tok, pen in s.dry_penalties().items():
            if 0 <= tok < x.shape[1]:
                rows.append(i)
                toks.append(tok)
                pens.append(pen)
    if rows:
        x.index_put_((_vec(rows, x, torch.long), _vec(toks, x, torch.long)), -_vec(pens, x), accumulate=True)
    return x


def _stage_top_n_sigma(x: Tensor, seqs: list[SequenceSampler], ub: list[int]) -> Tensor:
    n = _vec([s.params.top_n_sigma for s in seqs], x)[:, None]
    finite = torch.isfinite(x)
    cnt = finite.sum(-1, keepdim=True).clamp(min=1)
    mean = torch.where(finite, x, 0.0).sum(-1, keepdim=True) / cnt
    std = (torch.where(finite, (x - mean) ** 2, 0.0).sum(-1, keepdim=True) / cnt).sqrt()
    return torch.where(x < x.amax(-1, keepdim=True) - n * std, NEG_INF, x)


def _stage_top_k(x: Tensor, seqs: list[SequenceSampler], ub: list[int]) -> Tensor:
    V = x.shape[1]
    ks = [min(s.params.top_k, V) for s in seqs]
    if min(ks) >= V:
        return x
    vals, idx = torch.topk(x, max(ks), dim=-1)
    keep = torch.arange(max(ks), device=x.device)[None, :] < _vec(ks, x, torch.long)[:, None]
    for i, k in enumerate(ks):
        ub[i] = min(ub[i], k)
    return _rebuild(x, idx, vals, keep)


def _first_true(cond: Tensor, default: int) -> Tensor:
    """Index of the first True per row, ``default`` where there is none."""
    return torch.where(cond.any(-1), cond.to(torch.uint8).argmax(-1), default)


def _stage_top_p(x: Tensor, seqs: list[SequenceSampler], ub: list[int]) -> Tensor:
    n_all = min(x.shape[1], max(ub))
    tp = _vec([s.params.top_p for s in seqs], x)[:, None]
    mk = _vec([s.params.min_keep for s in seqs], x, torch.long)[:, None]
    lse = torch.logsumexp(x, -1, keepdim=True)
    n = n_all if n_all <= 1024 else 256  # llama.cpp's heuristic: most rows stop early
    while True:
        vals, idx = _sorted_top(x, n)
        cum = torch.cumsum(torch.exp(vals - lse), -1)
        pos = torch.arange(n, device=x.device)[None, :]
        cond = (cum >= tp) & (pos + 1 >= mk)
        if n >= n_all or bool(cond.any(-1).all()):
            break
        n = n_all
    last = _first_true(cond, n - 1)
    for i in range(len(ub)):
        ub[i] = min(ub[i], n)
    return _rebuild(x, idx, vals, pos <= last[:, None])


def _stage_min_p(x: Tensor, seqs: list[SequenceSampler], ub: list[int]) -> Tensor:
    logp = _vec([math.log(s.params.min_p) for s in seqs], x)[:, None]
    keep = x >= x.amax(-1, keepdim=True) + logp
    mks = [s.params.min_keep for s in seqs]
    if max(mks) > 1:
        need = keep.sum(-1) < _vec(mks, x, torch.long)
        if bool(need.any()):
            m = min(max(mks), x.shape[1])
            _, idx = _sorted_top(x, m)
            top = torch.arange(m, device=x.device)[None, :] < _vec(mks, x, torch.long)[:, None]
            extra = torch.zeros_like(keep).scatter_(1, idx, top)
            keep = keep | (extra & need[:, None])
    return torch.where(keep, x, NEG_INF)


def _stage_typ_p(x: Tensor, seqs: list[SequenceSampler], ub: list[int]) -> Tensor:
    n = min(x.shape[1], max(ub))
    vals, idx = _sorted_top(x, n)
    logp = vals - torch.logsumexp(x, -1, keepdim=True)
    p = torch.exp(logp)
    live = p > 0
    ent = -torch.where(live, p * logp, 0.0).sum(-1, keepdim=True)
    score = torch.where(live, (-logp - ent).abs(), float("inf"))
    order = torch.sort(score, dim=-1, stable=True).indices
    p_o, vals_o, idx_o = p.gather(-1, order), vals.gather(-1, order), idx.gather(-1, order)
    cum = torch.cumsum(p_o, -1)
    tp = _vec([s.params.typical_p for s in seqs], x)[:, None]
    mk = _vec([s.params.min_keep for s in seqs], x, torch.long)[:, None]
    pos = torch.arange(n, device=x.device)[None, :]
    last = _first_true((cum > tp) & ((mk == 0) | (pos >= mk - 1)), n - 1)
    for i in range(len(ub)):
        ub[i] = min(ub[i], n)
    return _rebuild(x, idx_o, vals_o, pos <= last[:, None])


def _stage_xtc(x: Tensor, seqs: list[SequenceSampler], ub: list[int]) -> Tensor:
    alive = torch.isfinite(x).sum(-1).tolist()
    rows = []
    for i, s in enumerate(seqs):
        if alive[i] < 2:
            continue
        chance = float(torch.rand((), generator=s.rng))
        if chance <= s.params.xtc_probability:
            rows.append(i)
    if not rows:
        return x
    r = _vec(rows, x, torch.long)
    sub = x[r]
    n = min(x.shape[1], max(ub[i] for i in rows))
    vals, idx = _sorted_top(sub, n)
    p = torch.exp(vals - torch.logsumexp(sub, -1, keepdim=True))
    thr = _vec([seqs[i].params.xtc_threshold for i in rows], x)[:, None]
    pos_last = ((p >= thr).sum(-1) - 1).clamp(min=0)
    size = _vec([alive[i] for i in rows], x, torch.long)
    mk = _vec([seqs[i].params.min_keep for i in rows], x, torch.long)
    ok = (size - pos_last >= mk) & (pos_last > 0)
    pos = torch.arange(n, device=x.device)[None, :]
    drop = ok[:, None] & (pos < pos_last[:, None])
    x[r] = _rebuild(sub, idx, vals, (vals > NEG_INF) & ~drop)
    return x


def _apply_temp(x: Tensor, t: Tensor) -> Tensor:
    """llama.cpp's temp_impl per row: t <= 0 keeps only the (first) argmax, else logits / t."""
    greedy = (t <= 0)[:, None]
    only_max = torch.arange(x.shape[1], device=x.device)[None, :] != x.argmax(-1, keepdim=True)
    scaled = x / torch.where(t > 0, t, 1.0)[:, None]
    return torch.where(greedy, torch.where(only_max, NEG_INF, x), scaled)


def _stage_temperature(x: Tensor, seqs: list[SequenceSampler], ub: list[int]) -> Tensor:
    t = _vec([s.params.temperature for s in seqs], x)
    delta = _vec([s.params.dynatemp_range for s in seqs], x)
    if bool((delta > 0).any()):
        alive = torch.isfinite(x).sum(-1)
        logp = torch.log_softmax(x, -1)
        p = logp.exp()
        ent = -torch.where(p > 0, p * logp, 0.0).sum(-1)
        norm = ent / torch.log(alive.clamp(min=2).to(x.dtype))
        expo = _vec([s.params.dynatemp_exponent for s in seqs], x)
        lo, hi = (t - delta).clamp(min=0.0), t + delta
        dyn = lo + (hi - lo) * norm.pow(expo)
        t = torch.where(delta > 0, torch.where(alive > 1, dyn, 1.0), t)
    return _apply_temp(x, t)


def _stage_temp_plain(x: Tensor, seqs: list[SequenceSampler], ub: list[int]) -> Tensor:
    return _apply_temp(x, _vec([s.params.temperature for s in seqs], x))


_STAGES: dict[str, Callable[[Tensor, list[SequenceSampler], list[int]], Tensor]] = {
    "penalties": _stage_penalties,
    "dry": _stage_dry,
    "top_n_sigma": _stage_top_n_sigma,
    "top_k": _stage_top_k,
    "typ_p": _stage_typ_p,
    "top_p": _stage_top_p,
    "min_p": _stage_min_p,
    "xtc": _stage_xtc,
    "temperature": _stage_temperature,
    "temp": _stage_temp_plain,
}


# -- final picks ------------------------------------------------------------------------------


def _mirostat_row(x: Tensor, s: SequenceSampler) -> Tensor:
    """Truncate one row [V] as mirostat v1/v2 does before its draw."""
    vals, idx = torch.sort(x, descending=True, stable=True)
    p = torch.softmax(vals, -1).double()
    if s.params.mirostat == 1:
        m = min(99, x.shape[0] - 1)
        i = torch.arange(m, dtype=torch.float64, device=x.device)
        t_i = torch.log((i + 2) / (i + 1))
        b_i = torch.log(p[:m] / p[1 : m + 1])
        s_hat = float((t_i * b_i).sum() / (t_i * t_i).sum())
        eps = s_hat - 1.0
        try:
            k = ((eps * 2.0**s.mu) / (1.0 - float(x.shape[0]) ** (-eps))) ** (1.0 / s_hat)
        except (OverflowError, ZeroDivisionError):
            k = float("nan")
        keep_n = max(int(k), 1) if isinstance(k, float) and math.isfinite(k) else 1
    else:
        surprise = -torch.log2(p)
        keep_n = max(int(_first_true((surprise > s.mu)[None, :], x.shape[0])[0]), 1)
    keep = torch.arange(x.shape[0], device=x.device) < keep_n
    return torch.full_like(x, NEG_INF).scatter_(0, idx, torch.where(keep, vals, NEG_INF))


def _adaptive_transform(x: Tensor, seqs: list[SequenceSampler]) -> tuple[Tensor, Tensor]:
    """adaptive-p: logits from the distance of each prob to the adapted target; (x, p_orig)."""
    p = torch.softmax(x, -1)
    targets: list[float] = []
    for s in seqs:
        tgt = min(max(s.params.adaptive_target, 0.0), 1.0)
        a = tgt if s._ap_weight == 0.0 else 2.0 * tgt - s._ap_sum / s._ap_weight
        targets.append(min(max(a, 0.0), 1.0))
    on = _vec([float(s.params.adaptive_target >= 0.0) for s in seqs], x)[:, None] > 0
    d = (p - _vec(targets, x)[:, None]).abs() / 0.3
    new = 5.0 - 10.0 * d * d / (1.0 + d)
    return torch.where(on & torch.isfinite(x), new, x), p


@dataclass
class _Picked:
    token: list[int]
    prob: list[float]
    top: list[list[tuple[int, float]]]


def _draw(x: Tensor, seqs: list[SequenceSampler], n_top: list[int]) -> _Picked:
    """The seeded draw over each row's live candidates (descending order, like llama.cpp)."""
    alive = torch.isfinite(x).sum(-1)
    n = max(1, int(alive.max()))
    vals, ids = _sorted_top(x, min(n, x.shape[1]))
    probs = torch.nan_to_num(torch.softmax(vals, -1), nan=0.0)
    cum = torch.cumsum(probs.double(), -1)
    u = torch.cat([torch.rand(1, generator=s.rng, dtype=torch.float64) for s in seqs]).to(x.device)
    pos = torch.searchsorted(cum, (u * cum[:, -1])[:, None]).squeeze(-1)
    pos = torch.minimum(pos, (alive - 1).clamp(min=0))
    token = ids.gather(-1, pos[:, None]).squeeze(-1).tolist()
    prob = probs.gather(-1, pos[:, None]).squeeze(-1).tolist()
    k = min(max(n_top), vals.shape[1])
    top: list[list[tuple[int, float]]] = [[] for _ in seqs]
    if k > 0:
        top_p, top_i = probs[:, :k].tolist(), ids[:, :k].tolist()
        for i, m in enumerate(n_top):
            top[i] = [(t, q) for t, q in zip(top_i[i][:m], top_p[i][:m]) if q > 0.0]
    return _Picked(token, prob, top)


def _run_stages(x: Tensor, samplers: list[SequenceSampler]) -> Tensor:
    B, V = x.shape
    ub = [V] * B
    for step in range(max(len(s.plan) for s in samplers)):
        groups: dict[str, list[int]] = {}
        for i, s in enumerate(samplers):
            if step < len(s.plan):
                groups.setdefault(s.plan[step], []).append(i)
        for name, rows in groups.items():
            fn = _STAGES[name]
            if len(rows) == B:
                x = fn(x, samplers, ub)
                continue
            r = torch.tensor(rows, device=x.device)
            sub_ub = [ub[i] for i in rows]
            x[r] = fn(x[r], [samplers[i] for i in rows], sub_ub)
            for i, b in zip(rows, sub_ub):
                ub[i] = b
    return x


def sample_batch(logits: Tensor, samplers: Sequence[SequenceSampler]) -> list[SampleResult]:
    """Sample one token per row of ``logits`` [B, V'] (V' >= vocab_size; extra columns ignored).

    Rows are independent: row i uses only ``samplers[i]`` (its parameters, history and RNG).
    Every row draws exactly one uniform from its generator per call (plus one per XTC coin
    flip), so a seeded sequence is reproducible whatever shares its batch. ``accept`` is not
    called here: the caller accepts the token it keeps.
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
    x = raw.clone()

    rows = [i for i, s in enumerate(samplers) for _ in s.bias]
    if rows:
        toks = [t for s in samplers for t, _ in s.bias]
        vals = [b for s in samplers for _, b in s.bias]
        x.index_put_((_vec(rows, x, torch.long), _vec(toks, x, torch.long)), _vec(vals, x), accumulate=True)

    if any(s.plan for s in samplers):
        x = _run_stages(x, samplers)

    tokens: list[int] = [0] * B
    post_prob: list[float] = [1.0] * B
    post_top: list[list[tuple[int, float]]] = [[] for _ in samplers]
    greedy = [i for i, s in enumerate(samplers) if s.final == "greedy"]
    drawn = [i for i, s in enumerate(samplers) if s.final != "greedy"]
    if greedy:
        for s in (samplers[i] for i in greedy):
            torch.rand(1, generator=s.rng, dtype=torch.float64)  # one draw per call, always
        g = torch.tensor(greedy, device=x.device)
        for i, t in zip(greedy, x[g].argmax(-1).tolist()):
            tokens[i] = t
            post_top[i] = [(t, 1.0)] if samplers[i].params.n_probs > 0 else []
    if drawn:
        r = torch.tensor(drawn, device=x.device)
        sub = x[r] if len(drawn) < B else x
        seqs = [samplers[i] for i in drawn]
        for j, s in enumerate(seqs):
            if s.final in ("mirostat1", "mirostat2"):
                sub[j] = _mirostat_row(sub[j], s)
        ap = [j for j, s in enumerate(seqs) if s.final == "adaptive_p"]
        p_orig = None
        if ap:
            a = torch.tensor(ap, device=x.device)
            sub[a], p_orig = _adaptive_transform(sub[a], [seqs[j] for j in ap])
        n_top = [s.params.n_probs if s.params.post_sampling_probs else 0 for s in seqs]
        picked = _draw(sub, seqs, n_top)
        for j, i in enumerate(drawn):
            tokens[i], post_prob[i], post_top[i] = picked.token[j], picked.prob[j], picked.top[j]
            s = seqs[j]
            if s.final in ("mirostat1", "mirostat2") and picked.prob[j] > 0.0:
                surprise = -math.log2(picked.prob[j])
                s._pending_mu = s.mu - s.params.mirostat_eta * (surprise - s.params.mirostat_tau)
        if p_orig is not None:
            chosen = torch.tensor([picked.token[j] for j in ap], device=x.device)
            po = p_orig.gather(-1, chosen[:, None]).squeeze(-1).tolist()
            for j, q in zip(ap, po):
                if seqs[j].params.adaptive_target >= 0.0:
                    seqs[j]._ap_pending = (picked.token[j], q)

    return _results(raw, samplers, tokens, post_prob, post_top)


def _results(
    raw: Tensor,
    samplers: list[SequenceSampler],
    tokens: list[int],
    post_prob: list[float],
    post_top: list[list[tuple[int, float]]],
) -> list[SampleResult]:
    tok = torch.tensor(tokens, device=raw.device)
    lse = torch.logsumexp(raw, -1)
    chosen = (raw.gather(-1, tok[:, None]).squeeze(-1) - lse).tolist()
    raw_rows = [i for i, s in enumerate(samplers) if s.params.n_probs > 0 and not s.params.post_sampling_probs]
    raw_top: dict[int, list[tuple[int, float]]] = {}
    if raw_rows:
        k = min(max(samplers[i].params.n_probs for i in raw_rows), raw.shape[1])
        r = torch.tensor(raw_rows, device=raw.device)
        vals, ids = torch.topk(raw[r], k, dim=-1)
        lp = (vals - lse[r][:, None]).tolist()
        for j, i in enumerate(raw_rows):
            m = samplers[i].params.n_probs
            raw_top[i] = list(zip(ids[j, :m].tolist(), lp[j][:m]))
    out: list[SampleResult] = []
    for i, s in enumerate(samplers):
        if s.params.post_sampling_probs:
            out.append(SampleResult(tokens[i], post_prob[i], post_top[i], True))
        else:
            out.append(SampleResult(tokens[i], chosen[i], raw_top.get(i, [])))
    return out
