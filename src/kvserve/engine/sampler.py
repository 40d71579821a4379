"""Token sampling with llama.cpp's sampler-chain semantics, batched over sequences.

One ``SequenceSampler`` (``sampler_state``) per generating sequence holds what is per request.

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
llama.cpp's order (by logit once a stage has sorted them, as top_k does; else by token id) with
one uniform from the row's ``std::mt19937`` stream (``mt19937``), as llama.cpp draws it: a
seeded request draws the token llama-server draws wherever the probabilities agree. The "infill" sampler is accepted in
``samplers`` but not applied.

Layers (each imports only the ones below it):

    sampler          sample_batch: groups rows by plan, runs the chain, one host copy per group
    sampler_fast     the common chains (greedy; top_k/top_p/min_p/temperature + dist) for the
                     whole batch at once, one host copy per step: taken when every row fits
    sampler_stages   the batched tensor stages over candidate sets, and the final picks
    sampler_state    SequenceSampler (per-request parameters and state), build_plan
    dry              DRY penalties and sequence breakers

Grammars (a sequence's ``grammar`` state) follow llama.cpp's ``common_sampler_sample``: the
chain runs unmasked; a row whose token its grammar rejects is sampled again from its raw logits
with the grammar's mask applied first (every disallowed logit -inf, before logit_bias and the
chain), drawing a new uniform. The masks of all rejected rows are computed together into one
bitmask tensor and applied on the logits' device in one copy. Raw logprobs (``n_probs``) stay
those of the unmasked logits, as llama-server reports them. A row whose grammar leaves no token
with a finite logit (the grammar cannot go on, or only banned tokens remain) gets
``grammar_stop``: its token must not be used and the sequence ends.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Sequence

import torch
from torch import Tensor

from kvserve.engine import sampler_fast
from kvserve.engine.dry import DryBreakers, build_dry_breakers
from kvserve.engine.sampler_stages import (
    STAGES,
    WRITES_IN_PLACE,
    Cand,
    Group,
    adaptive_transform,
    mirostat_keep,
    pick,
    vec,
)
from kvserve.engine.sampler_state import NEG_INF, SequenceSampler, build_plan
from kvserve.grammar.mask import alloc_bitmask, apply_bitmask_, fill_bitmask

__all__ = ["NEG_INF", "DryBreakers", "SampleResult", "SequenceSampler", "build_dry_breakers", "build_plan",
           "sample_batch", "sample_one"]


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
    grammar_stop: bool = False  # the grammar allows no sampleable token: end the sequence


def _chain_input(raw: Tensor, rows: list[int], g: Group) -> Tensor:
    """The group's rows of ``raw`` (raw logits, or grammar-masked ones) as the chain starts on
    them: logit_bias added (and every EOG id at -inf with ignore_eos). A copy whenever anything
    will write in place."""
    seqs, plan, final = g.seqs, g.seqs[0].plan, g.seqs[0].final
    bias = [(j, t, b) for j, s in enumerate(seqs) for t, b in s.bias]
    if len(rows) < raw.shape[0]:
        x = raw[vec(rows, raw, torch.long)]
    elif bias or WRITES_IN_PLACE.intersection(plan) or final.startswith("mirostat"):
        x = raw.clone()
    else:
        x = raw  # every stage of this plan returns new tensors
    if bias:
        r, t, b = zip(*bias)
        x.index_put_((vec(r, x, torch.long), vec(t, x, torch.long)), vec(b, x), accumulate=True)
    return x


def _run_group(raw: Tensor, rows: list[int], g: Group, src: Tensor | None = None) -> list[SampleResult]:
    """Sample ``rows``; the chain starts from ``src`` (default ``raw``; same shape), raw
    logprobs come from ``raw``."""
    seqs, plan, final = g.seqs, g.seqs[0].plan, g.seqs[0].final
    c = Cand(_chain_input(raw if src is None else src, rows, g))
    for name in plan:
        c = STAGES[name](c, g)
    prob_orig = None
    if final == "greedy":
        col = c.vals.argmax(-1)
        token = c.token_ids().gather(-1, col[:, None]).squeeze(-1)
        prob = torch.ones_like(c.vals[:, 0])
        c = Cand(torch.ones_like(c.vals[:, :1]), token[:, None])
    else:
        if final.startswith("mirostat"):
            for i, s in enumerate(seqs):
                c.vals[i] = mirostat_keep(c.vals[i], s)
        if final == "adaptive_p":
            p_orig, ids_before = adaptive_transform(c, g), c.token_ids()
        token, prob = pick(c, g)
        if final == "adaptive_p":
            col = (ids_before == token[:, None]).to(torch.uint8).argmax(-1)
            prob_orig = p_orig.gather(-1, col[:, None]).squeeze(-1)
    return _finish(raw, rows, g, c, token, prob, prob_orig)


def _finish(raw: Tensor, rows: list[int], g: Group, post: Cand, token: Tensor, prob: Tensor,
            prob_orig: Tensor | None) -> list[SampleResult]:
    """One device-to-host copy per group: token, probabilities and logprobs of every row.

    Row layout: token, prob, raw logprob[, adaptive-p original prob], post-sampling top ids and
    probs (kp each), raw top ids and logprobs (kr each).
    """
    seqs = g.seqs
    rr = raw if len(rows) == raw.shape[0] else raw[vec(rows, raw, torch.long)]
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
        s.note_pick(tok, p_tok, row[3] if prob_orig is not None else None)
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
    if sampler_fast.applies(samplers):
        return [SampleResult(t, 0.0) for t in sampler_fast.sample_tokens(raw, samplers)]
    results = _sample_groups(raw, samplers)
    redo = [i for i, s in enumerate(samplers)
            if s.grammar is not None and s.grammar.constrained and not s.grammar.allows(results[i].token)]
    if redo:
        for i, r in zip(redo, _resample_masked(raw, [samplers[i] for i in redo], redo)):
            results[i] = r
    return results


def _sample_groups(raw: Tensor, samplers: list[SequenceSampler], src: Tensor | None = None) -> list[SampleResult]:
    groups: dict[tuple[tuple[str, ...], str], list[int]] = {}
    for i, s in enumerate(samplers):
        groups.setdefault((s.plan, s.final), []).append(i)
    by_row: dict[int, SampleResult] = {}
    for rows in groups.values():
        g = Group([samplers[i] for i in rows], raw.device)
        by_row.update(zip(rows, _run_group(raw, rows, g, src)))
    return [by_row[i] for i in range(len(samplers))]


def _resample_masked(raw: Tensor, samplers: list[SequenceSampler], rows: list[int]) -> list[SampleResult]:
    """Sample ``rows`` of ``raw`` again with each row's grammar mask applied first."""
    states = [s.grammar for s in samplers if s.grammar is not None]
    bitmask = alloc_bitmask(len(rows), raw.shape[1], pin=raw.is_cuda)
    fill_bitmask(states, bitmask)
    sub = raw[vec(rows, raw, torch.long)]
    masked = sub.clone()
    apply_bitmask_(masked, bitmask)
    dead = (~bitmask.bool().any(-1)).tolist()
    for j, s in enumerate(samplers):
        banned = [t for t, b in s.bias if b == NEG_INF]
        if banned and not dead[j]:  # the grammar may allow only banned tokens (ignore_eos at its end)
            row = masked[j].clone()
            row[vec(banned, row, torch.long)] = NEG_INF
            dead[j] = bool(torch.isneginf(row).all())
    out = _sample_groups(sub, samplers, masked)
    return [replace(r, grammar_stop=True) if d or not st.allows(r.token) else r
            for st, r, d in zip(states, out, dead)]


def sample_one(sampler: SequenceSampler, logits: Tensor) -> SampleResult:
    """Sample one token from a [V] (or [1, V]) logits row."""
    return sample_batch(logits.reshape(1, -1), [sampler])[0]
