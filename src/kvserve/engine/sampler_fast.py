"""The fast path of the sampler: the common chains over the whole batch in a few tensor ops,
with one device-to-host copy per step.

It serves a step when every row's chain is one of:

    [penalties] greedy                                   (no DRY before it)
    [penalties] top_k [top_p] [min_p] [temperature] dist (in this order, 1 <= top_k <= FAST_TOP_K,
                                                          temperature > 0, no dynatemp,
                                                          min_keep <= 1)

and no row has a grammar or ``n_probs``. Logit biases (``ignore_eos`` included) are added first,
as the chain adds them, then the repeat / frequency / presence penalties over each row's window
of the last ``repeat_last_n`` accepted tokens (llama.cpp's ``penalties`` sampler: a logit <= 0
is multiplied by ``repeat_penalty``, a positive one divided, then ``count * frequency_penalty +
presence_penalty`` subtracted), all rows in one sparse update. Any other step takes the full
chain (``sampler.sample_batch``'s groups), which stays the reference.

Same arithmetic and the same draw as the chain: the rows' stages run side by side (a row
whose stage is inactive gets its neutral parameter: top_p 1 keeps everything, min_p 0 keeps
everything, temperature 1 divides by one), candidates are ordered by logit, ties by token id,
as the chain orders them for top_k's cut and top_p (``sampler_stages.topk_by_id``), and the final
draw walks the live candidates in that order with the one uniform the row draws from its own
generator per call. So a seeded request
gives the same tokens on either path (up to float rounding in reductions over a different
number of -inf columns when the batch's largest top_k differs from the row's group's).

``logprob`` of a result is not computed here (rows that want probabilities take the chain).
"""

from __future__ import annotations

import operator
import os
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from .sampler_stages import topk_by_id
from .sampler_state import NEG_INF, SequenceSampler

FAST_TOP_K = 256  # candidates kept per row at most: top_k above this (or off) takes the chain
_DIST_ORDER = ("top_k", "top_p", "min_p", "temperature")


def _is_subsequence(plan: tuple[str, ...], order: tuple[str, ...]) -> bool:
    it = iter(order)
    return all(name in it for name in plan)


def eligible(s: SequenceSampler) -> bool:
    """Whether the fast path computes exactly this row's chain."""
    p = s.params
    if s.grammar is not None or p.n_probs > 0:
        return False
    plan = s.plan[1:] if s.plan[:1] == ("penalties",) else s.plan
    if s.final == "greedy":
        return not plan
    if s.final != "dist" or not plan or plan[0] != "top_k" or not _is_subsequence(plan, _DIST_ORDER):
        return False
    if not 1 <= p.top_k <= FAST_TOP_K or p.min_keep > 1:
        return False
    return "temperature" not in s.plan or (p.temperature > 0.0 and p.dynatemp_range <= 0.0)


def enabled() -> bool:
    return os.environ.get("KVSERVE_FAST_SAMPLER", "1") != "0"


def _eligible(s: SequenceSampler) -> bool:
    """``eligible(s)``, kept on the sampler: what it reads (the parameters, the grammar, the
    plan they made) is fixed for the sampler's life; it is worked out again if ``params`` or
    ``grammar`` is replaced."""
    c = s.__dict__.get("_fast_eligible")
    if c is not None and c[0] is s.params and c[1] is s.grammar:
        return c[2]
    ok = eligible(s)
    s._fast_eligible = (s.params, s.grammar, ok)  # type: ignore[attr-defined]
    return ok


def applies(samplers: Sequence[SequenceSampler]) -> bool:
    """Whether a step over these rows takes the fast path (``KVSERVE_FAST_SAMPLER=0``: never)."""
    return enabled() and bool(samplers) and all(map(_eligible, samplers))


def sample_tokens(raw: Tensor, samplers: Sequence[SequenceSampler]) -> list[int]:
    """One token per row of ``raw`` [B, V] (float32) for rows that are all ``eligible``.
    Draws one uniform from each sampling (non-greedy) row's generator."""
    return launch(raw, samplers).tolist()


class Pending:
    """Tokens on their way to the host: ``tokens()`` waits for them (the only wait)."""

    def __init__(self, dev_tokens: Tensor) -> None:
        if dev_tokens.is_cuda:
            self._host = torch.empty(dev_tokens.shape, dtype=dev_tokens.dtype, pin_memory=True)
            self._host.copy_(dev_tokens, non_blocking=True)
            self._event: torch.cuda.Event | None = torch.cuda.Event()
            self._event.record()
        else:
            self._host, self._event = dev_tokens, None

    def tokens(self) -> list[int]:
        if self._event is not None:
            self._event.synchronize()
        return self._host.tolist()


def to_device(values: Any, dtype: torch.dtype, device: torch.device) -> Tensor:
    """A host list as a tensor on ``device`` without waiting for the device: on CUDA through
    pinned memory and a non-blocking copy (``torch.tensor(..., device=cuda)`` synchronizes the
    stream, which would stall the host behind the queued steps)."""
    t = torch.tensor(values, dtype=dtype)
    if device.type == "cuda":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)


# the latest step's (samplers, their summed biases) and (summed biases, key, tensors); each
# entry is replaced whole, so a reader never sees half of one step and half of another
_rows_last: list[Any] = [((), {})]
_bias_last: list[Any] = [(None, None, None)]


def _summed_biases(samplers: Sequence[SequenceSampler]) -> dict[tuple[int, int], float]:
    """(row, token) -> bias, a token's biases summed. A sampler's ``bias`` is fixed when it is
    made, so the same samplers in the same rows as the step before (every decode step of a
    steady batch) have the same sums: the previous step's dict is returned (the samplers are
    held until then, so none of them is another object at a reused address)."""
    prev, summed = _rows_last[0]
    if len(prev) == len(samplers) and all(map(operator.is_, prev, samplers)):
        return summed
    summed = {}
    for i, s in enumerate(samplers):
        for t, b in s.bias:
            summed[(i, t)] = summed.get((i, t), 0.0) + b
    _rows_last[0] = (tuple(samplers), summed)
    return summed


def _bias_tensors(summed: dict[tuple[int, int], float], dtype: torch.dtype,
                  dev: torch.device) -> tuple[Tensor, Tensor, Tensor]:
    """Rows, tokens and values of the biases on the device. Steps of the same rows with the
    same biases (every decode step of a steady batch) reuse the previous step's tensors: no
    copy and fewer operations on the host, whose every torch call gives up the interpreter.
    The same dict as the step before (``_summed_biases``) is that without comparing it."""
    last_summed, last_key, last_out = _bias_last[0]
    if summed is last_summed and last_key[0] == dev and last_key[1] == dtype:
        return last_out
    key = (dev, dtype, tuple(summed.items()))
    if last_key == key:
        _bias_last[0] = (summed, key, last_out)
        return last_out
    r, t = zip(*summed)
    idx = to_device([r, t], torch.int64, dev)
    out = (idx[0], idx[1], to_device(list(summed.values()), dtype, dev))
    _bias_last[0] = (summed, key, out)
    return out


def launch(raw: Tensor, samplers: Sequence[SequenceSampler]) -> Tensor:
    """``sample_tokens`` without the wait: the tokens as a device tensor [B] (int64)."""
    dev = raw.device
    summed = _summed_biases(samplers)  # (row, token) -> bias, a token's biases summed
    bias = bool(summed)
    if all(s.final == "greedy" and not (s.plan[:1] == ("penalties",) and s.penalty_counts) for s in samplers):
        # greedy rows, no penalty to apply: straight to argmax (no copy of the logits)
        if not bias:
            return raw.argmax(-1)
        return _biased_argmax(raw, *_bias_tensors(summed, raw.dtype, dev))
    if bias:  # as the chain's input: the biases added to a copy of the logits
        # one (row, token) index per entry: a plain gather and scatter (accumulate=True would sort
        # on the device and cost the host a millisecond a step)
        ri, ti, vals = _bias_tensors(summed, raw.dtype, dev)
        raw = raw.clone()
        raw[ri, ti] = raw[ri, ti] + vals
    raw = _penalize(raw, samplers, cloned=bias)
    dist = [i for i, s in enumerate(samplers) if s.final == "dist"]
    if len(dist) < len(samplers):
        tokens = raw.argmax(-1)
    if dist:
        x = raw if len(dist) == len(samplers) else raw[to_device(dist, torch.int64, dev)]
        table = []
        for i in dist:
            s = samplers[i]
            p, plan = s.params, s.plan
            u = s.rng.uniform()
            table.append([u, min(p.top_k, x.shape[1]),
                          p.top_p if "top_p" in plan else float("inf"),
                          p.min_p if "min_p" in plan else 0.0,
                          p.temperature if "temperature" in plan else 1.0])
        cols = to_device(table, torch.float64, dev)
        picked = _dist(x, cols, int(max(r[1] for r in table)))
        if len(dist) == len(samplers):
            tokens = picked
        else:
            tokens[to_device(dist, torch.int64, dev)] = picked
    return tokens


def _biased_argmax(raw: Tensor, ri: Tensor, ti: Tensor, vals: Tensor) -> Tensor:
    """``(raw + biases).argmax(-1)`` without copying the logits: the biased entries are written
    in place, the argmax taken, and their values put back bit for bit (the logits are the
    runner's; nothing else reads them in between). Same sums, same ties as the copy. The
    runner makes its logits under ``torch.inference_mode`` and the engine samples outside it:
    writing into such a tensor is allowed only inside that mode."""
    with torch.inference_mode():
        old = raw[ri, ti]
        raw[ri, ti] = old + vals
        tokens = raw.argmax(-1)
        raw[ri, ti] = old
    return tokens


def _penalize(x: Tensor, samplers: Sequence[SequenceSampler], cloned: bool) -> Tensor:
    """The ``penalties`` stage of every row that has it, on the full-vocabulary logits ``x``.

    Each row's window counts (token -> occurrences, kept up to date by ``accept``) become one
    flat (row, token, count) table sent in one copy; the stage's arithmetic is the chain's, in
    float32: the same values for the same tokens."""
    rows: list[int] = []
    toks: list[int] = []
    cnts: list[int] = []
    pen: list[list[float]] = []
    for i, s in enumerate(samplers):
        if s.plan[:1] != ("penalties",):
            continue
        counts = s.penalty_counts
        if not counts:
            continue
        p = s.params
        rows += [len(pen)] * len(counts)
        toks += counts.keys()
        cnts += counts.values()
        pen.append([i, p.repeat_penalty, p.frequency_penalty, p.presence_penalty])
    if not rows:
        return x
    dev = x.device
    table = torch.tensor([rows, toks, cnts], dtype=torch.int64)
    params = torch.tensor(pen, dtype=torch.float64)
    if dev.type == "cuda":
        table, params = table.pin_memory(), params.pin_memory()
    table, params = table.to(dev, non_blocking=True), params.to(dev, non_blocking=True)
    e, t = table[0], table[1]
    r = params[:, 0].long()[e]
    rp, fp, pp = (params[:, j].float()[e] for j in (1, 2, 3))
    if not cloned:
        x = x.clone()
    v = x[r, t]
    v = torch.where(v <= 0, v * rp, v / rp)
    x[r, t] = v - (table[2].float() * fp + pp)
    return x


def _dist(x: Tensor, cols: Tensor, k_max: int) -> Tensor:
    """top_k → top_p → min_p → temperature → seeded draw, per row (``cols``: u, k, top_p,
    min_p, temperature)."""
    u, k, top_p, min_p, temp = (cols[:, j] for j in range(5))
    vals, ids = topk_by_id(x, k_max)  # ordered by logit, ties by token id (the chain's order)
    ar = torch.arange(k_max, device=x.device)[None, :]
    vals = torch.where(ar < k[:, None], vals, NEG_INF)
    # top_p over the candidates in that order
    lse = torch.logsumexp(vals, -1, keepdim=True)
    below = torch.cumsum(torch.exp(vals - lse), -1) < top_p[:, None].float()
    last = below.sum(-1).clamp(max=k_max - 1)
    vals = torch.where(ar <= last[:, None], vals, NEG_INF)
    # min_p, then temperature
    vals = torch.where(vals >= vals.amax(-1, keepdim=True) + torch.log(min_p.float())[:, None], vals, NEG_INF)
    vals = vals / temp.float()[:, None]
    # the draw over the live candidates in the order top_k left them (by logit, ties by id)
    probs = torch.nan_to_num(torch.softmax(vals, -1), nan=0.0)
    cum = torch.cumsum(probs.double(), -1)
    pos = torch.searchsorted(cum, (u * cum[:, -1])[:, None]).clamp(max=k_max - 1)
    pos = torch.where(probs.gather(-1, pos) > 0, pos, probs.argmax(-1, keepdim=True))
    return ids.gather(-1, pos).squeeze(-1)
