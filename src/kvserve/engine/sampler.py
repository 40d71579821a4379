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


# -- candidate sets and batched stages -------------------------------------------------------
#
# Rows with the same plan form a _Group and share one _Cand: ``vals[b, W]`` logits (-inf =
# removed) and ``ids[b, W]`` their token ids (None while W == V and column == token id).
# Truncating stages (top_k, top_p, typ_p) shrink W, so after top_k a default chain works on
# ~40 columns. All per-row numbers go to the device in one copy (_Group.cols).

_COLS = ("u", "top_p", "min_p", "min_keep", "typical_p", "top_n_sigma", "temperature",
         "dynatemp_range", "dynatemp_exponent", "xtc_threshold", "repeat_penalty",
         "frequency_penalty", "presence_penalty")


class _Group:
    """Rows sharing a plan: their samplers and their parameters as device columns."""

    def __init__(self, seqs: list[SequenceSampler], device: torch.device) -> None:
        self.seqs = seqs
        table = []
        for s in seqs:  # the row's one uniform of this call, drawn before any XTC coin
            p = s.params
            u = float(torch.rand((), generator=s.rng, dtype=torch.float64))
            table.append([u, p.top_p, p.min_p, p.min_keep, p.typical_p, p.top_n_sigma, p.temperature,
                          p.dynatemp_range, p.dynatemp_exponent, p.xtc_threshold, p.repeat_penalty,
                          p.frequency_penalty, p.presence_penalty])
        self.table = torch.tensor(table, dtype=torch.float64, device=device)

    def col(self, name: str, dtype: torch.dtype = torch.float32) -> Tensor:
        return self.table[:, _COLS.index(name)].to(dtype)


@dataclass
class _Cand:
    vals: Tensor
    ids: Tensor | None = None

    def token_ids(self) -> Tensor:
        if self.ids is not None:
            return self.ids
        b, w = self.vals.shape
        return torch.arange(w, device=self.vals.device).expand(b, w)

    def take(self, vals: Tensor, cols: Tensor, keep: Tensor) -> _Cand:
        """The columns ``cols`` (with their ``vals``) of each row; those not kept become -inf."""
        ids = cols if self.ids is None else self.ids.gather(-1, cols)
        return _Cand(torch.where(keep, vals, NEG_INF), ids)


Stage = Callable[[_Cand, _Group], _Cand]


def _vec(values: Sequence[float] | Sequence[int], like: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
    return torch.tensor(values, dtype=dtype, device=like.device)


def _sorted(c: _Cand, n: int) -> tuple[Tensor, Tensor]:
    """(vals, cols) of the n best columns per row, descending; equal values by token id."""
    w = c.vals.shape[1]
    if c.ids is None:
        if n >= w:
            return torch.sort(c.vals, dim=-1, descending=True, stable=True)
        _, cols = torch.topk(c.vals, n, dim=-1)
        cols = cols.sort(dim=-1).values
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


def _add_at(c: _Cand, rows: list[int], toks: list[int], fn: Callable[[Tensor, Tensor], Tensor]) -> None:
    """vals[row, column of tok] = fn(old values, entry index) for each distinct (row, tok)
    present (tokens are < V: the samplers drop others on accept)."""
    if not rows:
        return
    r, t = _vec(rows, c.vals, torch.long), _vec(toks, c.vals, torch.long)
    e = torch.arange(len(rows), device=c.vals.device)
    if c.ids is None:
        col = t
    else:
        hit = c.ids[r] == t[:, None]
        ok = hit.any(-1)
        r, e, col = r[ok], e[ok], hit[ok].to(torch.uint8).argmax(-1)
    c.vals[r, col] = fn(c.vals[r, col], e)


def _stage_penalties(c: _Cand, g: _Group) -> _Cand:
    rows: list[int] = []
    toks: list[int] = []
    cnts: list[int] = []
    for i, s in enumerate(g.seqs):
        rows += [i] * len(s._pen_counts)
        toks += s._pen_counts.keys()
        cnts += s._pen_counts.values()
    if rows:
        r, cnt = _vec(rows, c.vals, torch.long), _vec(cnts, c.vals)
        rp, fp, pp = (g.col(n)[r] for n in ("repeat_penalty", "frequency_penalty", "presence_penalty"))

        def apply(v: Tensor, e: Tensor) -> Tensor:
            v = torch.where(v <= 0, v * rp[e], v / rp[e])
            return v - (cnt[e] * fp[e] + pp[e])

        _add_at(c, rows, toks, apply)
    return c


def _stage_dry(c: _Cand, g: _Group) -> _Cand:
    rows, toks, pens = [], [], []
    for i, s in enumerate(g.seqs):
        for tok, pen in s.dry_penalties().items():
            rows.append(i)
            toks.append(tok)
            pens.append(pen)
    pen = _vec(pens, c.vals)
    _add_at(c, rows, toks, lambda v, e: v - pen[e])
    return c


def _stage_top_n_sigma(c: _Cand, g: _Group) -> _Cand:
    x = c.vals
    finite = x > NEG_INF
    cnt = finite.sum(-1, keepdim=True).clamp(min=1)
    mean = torch.where(finite, x, 0.0).sum(-1, keepdim=True) / cnt
    std = (torch.where(finite, (x - mean) ** 2, 0.0).sum(-1, keepdim=True) / cnt).sqrt()
    c.vals = torch.where(x < x.amax(-1, keepdim=True) - g.col("top_n_sigma")[:, None] * std, NEG_INF, x)
    return c


def _stage_top_k(c: _Cand, g: _Group) -> _Cand:
    w = c.vals.shape[1]
    ks = [min(s.params.top_k, w) for s in g.seqs]
    cut = [k for k in ks if k < w]
    if not cut:
        return c
    vals, cols = torch.topk(c.vals, max(cut), dim=-1)
    keep = torch.arange(max(cut), device=vals.device)[None, :] < _vec(ks, vals, torch.long)[:, None]
    if len(cut) == len(ks):
        return c.take(vals, cols, keep)
    whole = _vec([k >= w for k in ks], vals, torch.bool)[:, None]  # rows keeping everything
    mask = torch.zeros_like(c.vals, dtype=torch.bool).scatter_(1, cols, keep) | whole
    c.vals = torch.where(mask, c.vals, NEG_INF)
    return c


def _stage_top_p(c: _Cand, g: _Group) -> _Cand:
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


def _stage_min_p(c: _Cand, g: _Group) -> _Cand:
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


def _stage_typ_p(c: _Cand, g: _Group) -> _Cand:
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


def _stage_xtc(c: _Cand, g: _Group) -> _Cand:
    alive = (c.vals > NEG_INF).sum(-1).tolist()
    rows = [i for i, s in enumerate(g.seqs) if alive[i] >= 2
            and float(torch.rand((), generator=s.rng)) <= s.params.xtc_probability]
    if not rows:
        return c
    r = _vec(rows, c.vals, torch.long)
    sub = _Cand(c.vals[r], None if c.ids is None else c.ids[r])
    vals, cols = _sorted(sub, sub.vals.shape[1])
    p = torch.softmax(vals, -1)
    last = ((p >= g.col("xtc_threshold")[r][:, None]).sum(-1) - 1).clamp(min=0)  # it stays
    size = _vec([alive[i] for i in rows], p, torch.long)
    ok = (size - last >= g.col("min_keep", torch.long)[r]) & (last > 0)
    drop = ok[:, None] & (torch.arange(p.shape[1], device=p.device)[None, :] < last[:, None])
    c.vals[r] = torch.where(torch.zeros_like(drop).scatter_(1, cols, drop), NEG_INF, sub.vals)
    return c


def _apply_temp(c: _Cand, t: Tensor, all_positive: bool) -> _Cand:
    """llama.cpp's temp_impl per row: t <= 0 keeps only the first best, else logits / t."""
    x = c.vals
    if all_positive:
        c.vals = x / t[:, None]
        return c
    best = torch.arange(x.shape[1], device=x.device)[None, :] == x.argmax(-1, keepdim=True)
    scaled = x / torch.where(t > 0, t, 1.0)[:, None]
    c.vals = torch.where((t <= 0)[:, None], torch.where(best, x, NEG_INF), scaled)
    return c


def _stage_temperature(c: _Cand, g: _Group) -> _Cand:
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


_WRITES_IN_PLACE = frozenset({"penalties", "dry", "xtc"})
_STAGES: dict[str, Stage] = {
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


def _mirostat_keep(x: Tensor, s: SequenceSampler) -> Tensor:
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


def _adaptive_transform(c: _Cand, g: _Group) -> Tensor:
    """adaptive-p: logits from each prob's distance to the adapted target; returns the old probs."""
    p = torch.softmax(c.vals, -1)
    targets, on = [], []
    for s in g.seqs:
        tgt = min(max(s.params.adaptive_target, 0.0), 1.0)
        a = tgt if s._ap_weight == 0.0 else 2.0 * tgt - s._ap_sum / s._ap_weight
        targets.append(min(max(a, 0.0), 1.0))
        on.append(s.params.adaptive_target >= 0.0)
    d = (p - _vec(targets, p)[:, None]).abs() / 0.3
    new = 5.0 - 10.0 * d * d / (1.0 + d)
    c.vals = torch.where(_vec(on, p, torch.bool)[:, None] & (c.vals > NEG_INF), new, c.vals)
    return p


def _pick(c: _Cand, g: _Group) -> tuple[Tensor, Tensor]:
    """The seeded draw over the live candidates in token-id order: (token, its prob).

    Leaves ``c`` holding the final candidates as probabilities (for post-sampling probs)."""
    ids, vals = c.token_ids(), c.vals
    if c.ids is not None:
        ids, perm = ids.sort(dim=-1)
        vals = vals.gather(-1, perm)
    probs = torch.nan_to_num(torch.softmax(vals, -1), nan=0.0)
    cum = torch.cumsum(probs.double(), -1)
    pos = torch.searchsorted(cum, (g.col("u", torch.float64) * cum[:, -1])[:, None], right=True)
    pos = pos.clamp(max=vals.shape[1] - 1)
    pos = torch.where(probs.gather(-1, pos) > 0, pos, probs.argmax(-1, keepdim=True))
    c.vals, c.ids = probs, ids
    return ids.gather(-1, pos).squeeze(-1), probs.gather(-1, pos).squeeze(-1)


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
