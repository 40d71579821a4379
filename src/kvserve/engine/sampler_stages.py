"""Batched sampling stages over candidate sets, and the final picks.

Rows with the same plan form a ``Group`` and share one ``Cand``: ``vals[b, W]`` logits (-inf =
removed) and ``ids[b, W]`` their token ids (None while W == V and column == token id).
Truncating stages (top_k, top_p, typ_p) shrink W, so after top_k a default chain works on
~40 columns. All per-row numbers go to the device in one copy (``Group.table``).

``STAGES`` maps a stage name of a plan to its function, ``Stage``: ``(Cand, Group) -> Cand``
(it may write ``vals`` in place when its name is in ``WRITES_IN_PLACE``); ``mirostat_keep``,
``adaptive_transform`` and ``pick`` (the seeded draw) are the final picks. Stages read the
per-request state (``sampler_state.SequenceSampler``) and change nothing of it but draws
from its generator.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

import torch
from torch import Tensor

from kvserve.engine.sampler_state import NEG_INF, SequenceSampler

_COLS = ("u", "top_p", "min_p", "min_keep", "typical_p", "top_n_sigma", "temperature",
         "dynatemp_range", "dynatemp_exponent", "xtc_threshold", "repeat_penalty",
         "frequency_penalty", "presence_penalty")


class Group:
    """Rows sharing a plan: their samplers and their parameters as device columns."""

    def __init__(self, seqs: list[SequenceSampler], device: torch.device) -> None:
        self.seqs = seqs
        table = []
        for s in seqs:  # the row's one uniform of this call, drawn before any XTC coin
            p = s.params
            u = s.rng.uniform()
            table.append([u, p.top_p, p.min_p, p.min_keep, p.typical_p, p.top_n_sigma, p.temperature,
                          p.dynatemp_range, p.dynatemp_exponent, p.xtc_threshold, p.repeat_penalty,
                          p.frequency_penalty, p.presence_penalty])
        self.table = torch.tensor(table, dtype=torch.float64, device=device)

    def col(self, name: str, dtype: torch.dtype = torch.float32) -> Tensor:
        return self.table[:, _COLS.index(name)].to(dtype)


@dataclass
class Cand:
    vals: Tensor
    ids: Tensor | None = None

    def token_ids(self) -> Tensor:
        if self.ids is not None:
            return self.ids
        b, w = self.vals.shape
        return torch.arange(w, device=self.vals.device).expand(b, w)

    def take(self, vals: Tensor, cols: Tensor, keep: Tensor) -> Cand:
        """The columns ``cols`` (with their ``vals``) of each row; those not kept become -inf."""
        ids = cols if self.ids is None else self.ids.gather(-1, cols)
        return Cand(torch.where(keep, vals, NEG_INF), ids)


Stage = Callable[[Cand, Group], Cand]


def vec(values: Sequence[float] | Sequence[int], like: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
    return torch.tensor(values, dtype=dtype, device=like.device)


def topk_by_id(vals: Tensor, n: int, ids: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """(vals, cols) of the n best columns of float32 ``vals`` per row, descending, equal values
    by lowest token id (``ids``: each column's token id; None: the column index) — also at the
    cut, so which of several equal logits survive does not depend on n or on torch's kernel.

    One ``topk`` over a unique int64 key per column: the float's bits made monotonic (-0.0 as
    +0.0), then the id inverted below them."""
    w = vals.shape[1]
    bits = (vals + 0.0).view(torch.int32).long()
    key = torch.where(bits < 0, bits ^ 0x7FFFFFFF, bits)
    tid = torch.arange(w, device=vals.device) if ids is None else ids
    key = key * (1 << 31) + ((1 << 31) - 1 - tid)  # |key| < 2**62: no overflow
    cols = torch.topk(key, n, dim=-1).indices
    return vals.gather(-1, cols), cols


def _sorted(c: Cand, n: int) -> tuple[Tensor, Tensor]:
    """(vals, cols) of the n best columns per row, descending; equal values by token id."""
    w = c.vals.shape[1]
    if c.ids is None:
        if n >= w:
            return torch.sort(c.vals, dim=-1, descending=True, stable=True)
        return topk_by_id(c.vals, n)
    else:
        cols = c.ids.sort(dim=-1).indices
    vals, perm = c.vals.gather(-1, cols).sort(dim=-1, descending=True, stable=True)
    return vals[:, :n], cols.gather(-1, perm)[:, :n]


def _keep_prefix(below: Tensor, min_keep: Tensor) -> Tensor:
    """Keep mask for sorted columns: the first column not ``below`` and all before it, at least
    ``min_keep`` columns. ``below`` must be a prefix (True then False) along each row."""
    n = below.shape[1]
    last = torch.maximum(below.sum(-1), min_keep - 1).clamp(max=n - 1)
    return torch.arange(n, device=below.device)[None, :] <= last[:, None]


def _add_at(c: Cand, rows: list[int], toks: list[int], fn: Callable[[Tensor, Tensor], Tensor]) -> None:
    """vals[row, column of tok] = fn(old values, entry index) for each distinct (row, tok)
    present (tokens are < V: the samplers drop others on accept)."""
    if not rows:
        return
    r, t = vec(rows, c.vals, torch.long), vec(toks, c.vals, torch.long)
    e = torch.arange(len(rows), device=c.vals.device)
    if c.ids is None:
        col = t
    else:
        hit = c.ids[r] == t[:, None]
        ok = hit.any(-1)
        r, e, col = r[ok], e[ok], hit[ok].to(torch.uint8).argmax(-1)
    c.vals[r, col] = fn(c.vals[r, col], e)


def _stage_penalties(c: Cand, g: Group) -> Cand:
    rows: list[int] = []
    toks: list[int] = []
    cnts: list[int] = []
    for i, s in enumerate(g.seqs):
        counts = s.penalty_counts
        rows += [i] * len(counts)
        toks += counts.keys()
        cnts += counts.values()
    if rows:
        r, cnt = vec(rows, c.vals, torch.long), vec(cnts, c.vals)
        rp, fp, pp = (g.col(n)[r] for n in ("repeat_penalty", "frequency_penalty", "presence_penalty"))

        def apply(v: Tensor, e: Tensor) -> Tensor:
            v = torch.where(v <= 0, v * rp[e], v / rp[e])
            return v - (cnt[e] * fp[e] + pp[e])

        _add_at(c, rows, toks, apply)
    return c


def _stage_dry(c: Cand, g: Group) -> Cand:
    rows, toks, pens = [], [], []
    for i, s in enumerate(g.seqs):
        for tok, pen in s.dry_penalties().items():
            rows.append(i)
            toks.append(tok)
            pens.append(pen)
    pen = vec(pens, c.vals)
    _add_at(c, rows, toks, lambda v, e: v - pen[e])
    return c


def _stage_top_n_sigma(c: Cand, g: Group) -> Cand:
    x = c.vals
    finite = x > NEG_INF
    cnt = finite.sum(-1, keepdim=True).clamp(min=1)
    mean = torch.where(finite, x, 0.0).sum(-1, keepdim=True) / cnt
    std = (torch.where(finite, (x - mean) ** 2, 0.0).sum(-1, keepdim=True) / cnt).sqrt()
    c.vals = torch.where(x < x.amax(-1, keepdim=True) - g.col("top_n_sigma")[:, None] * std, NEG_INF, x)
    return c


def _stage_top_k(c: Cand, g: Group) -> Cand:
    w = c.vals.shape[1]
    ks = [min(s.params.top_k, w) for s in g.seqs]
    cut = [k for k in ks if k < w]
    if not cut:
        return c
    vals, cols = topk_by_id(c.vals, max(cut), c.ids)
    keep = torch.arange(max(cut), device=vals.device)[None, :] < vec(ks, vals, torch.long)[:, None]
    if len(cut) == len(ks):
        return c.take(vals, cols, keep)
    whole = vec([k >= w for k in ks], vals, torch.bool)[:, None]  # rows keeping everything
    mask = torch.zeros_like(c.vals, dtype=torch.bool).scatter_(1, cols, keep) | whole
    c.vals = torch.where(mask, c.vals, NEG_INF)
    return c


def _stage_top_p(c: Cand, g: Group) -> Cand:
    w = c.vals.shape[1]
    tp = g.col("top_p")[:, None]
    lse = torch.logsumexp(c.vals, -1, keepdim=True)
    n = w if w <= 1024 else 256  # like llama.cpp, try a sorted prefix first: most rows stop early
    while True:
        vals, cols = _sorted(c, n)
        below = torch.cumsum(torch.exp(vals - lse), -1) < tp
        if n >= w or not bool(below.all(-1).any()):
            break
        n = min(w, n * 8)
    return c.take(vals, cols, _keep_prefix(below, g.col("min_keep", torch.long)))


def _stage_min_p(c: Cand, g: Group) -> Cand:
    x = c.vals
    keep = x >= x.amax(-1, keepdim=True) + torch.log(g.col("min_p"))[:, None]
    mks = [s.params.min_keep for s in g.seqs]
    if max(mks) > 1:
        mk = g.col("min_keep", torch.long)
        need = keep.sum(-1) < mk
        if bool(need.any()):
            m = min(max(mks), x.shape[1])
            _, cols = _sorted(c, m)
            top = torch.arange(m, device=x.device)[None, :] < mk[:, None]
            keep = keep | (torch.zeros_like(keep).scatter_(1, cols, top) & need[:, None])
    c.vals = torch.where(keep, x, NEG_INF)
    return c


def _stage_typ_p(c: Cand, g: Group) -> Cand:
    vals, cols = _sorted(c, c.vals.shape[1])
    logp = vals - torch.logsumexp(vals, -1, keepdim=True)
    p = torch.exp(logp)
    live = p > 0
    ent = -torch.where(live, p * logp, 0.0).sum(-1, keepdim=True)
    score = torch.where(live, (-logp - ent).abs(), float("inf"))
    order = torch.sort(score, dim=-1, stable=True).indices
    below = torch.cumsum(p.gather(-1, order), -1) <= g.col("typical_p")[:, None]
    keep = _keep_prefix(below, g.col("min_keep", torch.long))
    return c.take(vals.gather(-1, order), cols.gather(-1, order), keep)


def _stage_xtc(c: Cand, g: Group) -> Cand:
    alive = (c.vals > NEG_INF).sum(-1).tolist()
    rows = [i for i, s in enumerate(g.seqs) if alive[i] >= 2
            and s.xtc_rng.uniform_float() <= s.params.xtc_probability]
    if not rows:
        return c
    r = vec(rows, c.vals, torch.long)
    sub = Cand(c.vals[r], None if c.ids is None else c.ids[r])
    vals, cols = _sorted(sub, sub.vals.shape[1])
    p = torch.softmax(vals, -1)
    last = ((p >= g.col("xtc_threshold")[r][:, None]).sum(-1) - 1).clamp(min=0)  # it stays
    size = vec([alive[i] for i in rows], p, torch.long)
    ok = (size - last >= g.col("min_keep", torch.long)[r]) & (last > 0)
    drop = ok[:, None] & (torch.arange(p.shape[1], device=p.device)[None, :] < last[:, None])
    c.vals[r] = torch.where(torch.zeros_like(drop).scatter_(1, cols, drop), NEG_INF, sub.vals)
    return c


def _apply_temp(c: Cand, t: Tensor, all_positive: bool) -> Cand:
    """llama.cpp's temp_impl per row: t <= 0 keeps only the first best, else logits / t."""
    x = c.vals
    if all_positive:
        c.vals = x / t[:, None]
        return c
    best = torch.arange(x.shape[1], device=x.device)[None, :] == x.argmax(-1, keepdim=True)
    scaled = x / torch.where(t > 0, t, 1.0)[:, None]
    c.vals = torch.where((t <= 0)[:, None], torch.where(best, x, NEG_INF), scaled)
    return c


def _stage_temperature(c: Cand, g: Group) -> Cand:
    t = g.col("temperature")
    if all(s.params.dynatemp_range <= 0 for s in g.seqs):
        return _apply_temp(c, t, all(s.params.temperature > 0 for s in g.seqs))
    x, delta = c.vals, g.col("dynatemp_range")
    alive = (x > NEG_INF).sum(-1)
    logp = torch.log_softmax(x, -1)
    p = logp.exp()
    norm = -torch.where(p > 0, p * logp, 0.0).sum(-1) / torch.log(alive.clamp(min=2).to(x.dtype))
    lo, hi = (t - delta).clamp(min=0.0), t + delta
    dyn = lo + (hi - lo) * norm.pow(g.col("dynatemp_exponent"))
    t = torch.where(delta > 0, torch.where(alive > 1, dyn, 1.0), t)
    return _apply_temp(c, t, False)  # a dynamic temperature may reach 0


WRITES_IN_PLACE = frozenset({"penalties", "dry", "xtc"})
STAGES: dict[str, Stage] = {
    "penalties": _stage_penalties,
    "dry": _stage_dry,
    "top_n_sigma": _stage_top_n_sigma,
    "top_k": _stage_top_k,
    "typ_p": _stage_typ_p,
    "top_p": _stage_top_p,
    "min_p": _stage_min_p,
    "xtc": _stage_xtc,
    "temperature": _stage_temperature,
    "temp": lambda c, g: _apply_temp(c, g.col("temperature"), all(s.params.temperature > 0 for s in g.seqs)),
}


# -- final picks ------------------------------------------------------------------------------


def mirostat_keep(x: Tensor, s: SequenceSampler) -> Tensor:
    """Row [W] as mirostat v1/v2 truncates it before its draw."""
    vals, cols = torch.sort(x, descending=True, stable=True)
    p = torch.softmax(vals, -1).double()
    if s.params.mirostat == 1:
        m = min(99, x.shape[0] - 1)
        i = torch.arange(m, dtype=torch.float64, device=x.device)
        t_i = torch.log((i + 2) / (i + 1))
        s_hat = float((t_i * torch.log(p[:m] / p[1 : m + 1])).sum() / (t_i * t_i).sum())
        try:
            eps = s_hat - 1.0
            k = ((eps * 2.0**s.mu) / (1.0 - float(s.vocab_size) ** (-eps))) ** (1.0 / s_hat)
        except (OverflowError, ZeroDivisionError):
            k = float("nan")
        n = max(int(k), 1) if isinstance(k, float) and math.isfinite(k) else 1
    else:
        n = max(int((-torch.log2(p) <= s.mu).to(torch.int32).cumprod(0).sum()), 1)
    keep = torch.arange(x.shape[0], device=x.device) < n
    return torch.full_like(x, NEG_INF).scatter_(0, cols, torch.where(keep, vals, NEG_INF))


def adaptive_transform(c: Cand, g: Group) -> Tensor:
    """adaptive-p: logits from each prob's distance to the adapted target; returns the old probs."""
    p = torch.softmax(c.vals, -1)
    targets, on = [], []
    for s in g.seqs:
        targets.append(s.adaptive_target())
        on.append(s.params.adaptive_target >= 0.0)
    d = (p - vec(targets, p)[:, None]).abs() / 0.3
    new = 5.0 - 10.0 * d * d / (1.0 + d)
    c.vals = torch.where(vec(on, p, torch.bool)[:, None] & (c.vals > NEG_INF), new, c.vals)
    return p


def _in_draw_order(c: Cand, g: Group) -> tuple[Tensor, Tensor]:
    """(ids, vals) of each row's candidates in the order llama.cpp's draw walks them
    (``SequenceSampler.draw_order``): by logit, ties by token id; by token id; as they are."""
    ids, vals = c.token_ids(), c.vals
    orders = [s.draw_order for s in g.seqs]
    if "id" in orders and c.ids is not None:
        by_id = ids.sort(dim=-1).indices
        ids_i, vals_i = ids.gather(-1, by_id), vals.gather(-1, by_id)
        rows = vec([o == "id" for o in orders], vals, torch.bool)[:, None]
        ids, vals = torch.where(rows, ids_i, ids), torch.where(rows, vals_i, vals)
    if "desc" in orders:
        by_id = ids.sort(dim=-1).indices  # the stable sort below then orders ties by token id
        ids_d, vals_d = ids.gather(-1, by_id), vals.gather(-1, by_id)
        vals_d, perm = vals_d.sort(dim=-1, descending=True, stable=True)
        ids_d = ids_d.gather(-1, perm)
        rows = vec([o == "desc" for o in orders], vals, torch.bool)[:, None]
        ids, vals = torch.where(rows, ids_d, ids), torch.where(rows, vals_d, vals)
    return ids, vals


def pick(c: Cand, g: Group) -> tuple[Tensor, Tensor]:
    """The seeded draw over the live candidates in llama.cpp's order: (token, its prob). As
    llama.cpp's ``dist``: the first candidate whose cumulative probability reaches u·Σp.

    Leaves ``c`` holding the final candidates as probabilities (for post-sampling probs)."""
    ids, vals = _in_draw_order(c, g)
    probs = torch.nan_to_num(torch.softmax(vals, -1), nan=0.0)
    cum = torch.cumsum(probs.double(), -1)
    pos = torch.searchsorted(cum, (g.col("u", torch.float64) * cum[:, -1])[:, None])
    pos = pos.clamp(max=vals.shape[1] - 1)
    pos = torch.where(probs.gather(-1, pos) > 0, pos, probs.argmax(-1, keepdim=True))
    c.vals, c.ids = probs, ids
    return ids.gather(-1, pos).squeeze(-1), probs.gather(-1, pos).squeeze(-1)
