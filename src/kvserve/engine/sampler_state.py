"""Per-request sampler state: the parameters, the plan they select, and what accepted tokens change.

One ``SequenceSampler`` per generating sequence holds its parameters, its own random streams
(``mt19937``: llama.cpp's, so a fixed seed draws the uniforms llama-server draws, whatever else
is in the batch), the
penalty / DRY windows of accepted tokens (prompt + generated: llama-server accepts the prompt
tokens into its sampler before the first draw), and mirostat / adaptive-p state.
``build_plan`` turns parameters into (stages to run, final pick). No tensor work happens here:
the batched stages (``sampler_stages``) read this state, ``sampler.sample_batch`` drives them.
"""

from __future__ import annotations

import math
import os
import random
from collections import Counter, deque
from typing import TYPE_CHECKING, Iterable

from kvserve.engine.dry import DryBreakers, dry_penalties
from kvserve.engine.mt19937 import Mt19937
from kvserve.engine.sampling_params import SamplingParams

if TYPE_CHECKING:
    from kvserve.engine.reasoning_budget import BudgetState
    from kvserve.grammar import GrammarState

NEG_INF = float("-inf")
# Random seeds (seed -1) from one generator seeded by the OS once, not an OS read per request
_SEEDS = random.Random(os.urandom(16))


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


def draw_order(plan: tuple[str, ...], final: str, p: SamplingParams) -> str:
    """The order in which llama.cpp's final draw walks the candidates it is left with:
    "id" (token-id order: no stage sorted them), "desc" (by logit: top_k, top_p, dynamic
    temperature and mirostat sort them) or "chain" (as the last reordering stage left them:
    typ_p's typicality order). XTC's coin, when it hits, also sorts; that is not followed."""
    if final.startswith("mirostat"):
        return "desc"
    order = "id"
    for name in plan:
        if name == "top_k" or (name == "top_p" and order != "desc"):
            order = "desc"
        elif name == "typ_p":
            order = "chain"
        elif name == "temperature" and p.dynatemp_range > 0.0:
            order = "desc"
    return order


def _window_tail(history: Iterable[int], vocab_size: int, n: int | None) -> list[int]:
    """The tokens of ``history`` in ``[0, vocab_size)``, as ints; only the last ``n`` of them
    (None: all) when ``history`` is a list or tuple (walked from its end: a window of 64
    over a 2,000-token prompt reads 64)."""
    if n is None or not isinstance(history, (list, tuple)):
        return [t for t in map(int, history) if 0 <= t < vocab_size]
    out: list[int] = []
    if n <= 0:
        return out
    for t in reversed(history):
        t = int(t)
        if 0 <= t < vocab_size:
            out.append(t)
            if len(out) == n:
                break
    out.reverse()
    return out


class SequenceSampler:
    """Sampler state of one sequence; feed every accepted token to ``accept``.

    ``history``: tokens already accepted (the prompt), as llama-server feeds them.
    ``dry_breakers``: from ``build_dry_breakers`` (None: DRY runs without restart sequences).
    ``n_ctx_train``: bounds DRY's window (llama.cpp's total context size); 0 = unbounded.
    ``grammar``: the sequence's own grammar state (``kvserve.grammar.GrammarState``) or None;
    ``accept`` advances it, ``sample_batch`` keeps every drawn token inside it.
    """

    @property
    def rng(self) -> Mt19937:
        """The final draw's uniforms (dist, mirostat, adaptive-p): ``std::mt19937(seed)``."""
        r = self._rng
        if r is None:
            r = self._rng = Mt19937(self.seed)
        return r

    @property
    def xtc_rng(self) -> Mt19937:
        """XTC's coin: a generator of its own, seeded the same, as in llama.cpp."""
        r = self._xtc_rng
        if r is None:
            r = self._xtc_rng = Mt19937(self.seed)
        return r

    def __init__(
        self,
        params: SamplingParams,
        vocab_size: int,
        eog_ids: Iterable[int] = (),
        history: Iterable[int] = (),
        *,
        dry_breakers: DryBreakers | None = None,
        n_ctx_train: int = 0,
        grammar: GrammarState | None = None,
    ) -> None:
        self.params = params
        self.grammar = grammar
        # kvserve.engine.reasoning_budget.BudgetState or None (set by Sampling.make)
        self.budget: BudgetState | None = None
        self.vocab_size = int(vocab_size)
        self.eog_ids = tuple(int(t) for t in eog_ids)
        self.seed = _SEEDS.getrandbits(32) if params.is_random_seed else params.seed_u32
        # the streams are made on first use (a greedy request never draws): same seed, same draws
        self._rng: Mt19937 | None = None
        self._xtc_rng: Mt19937 | None = None
        self.plan, self.final = build_plan(params)
        self.draw_order = draw_order(self.plan, self.final, params)

        bias = list(params.logit_bias)
        if params.ignore_eos:
            bias += [(t, NEG_INF) for t in self.eog_ids]
        self.bias = [(t, b) for t, b in bias if 0 <= t < self.vocab_size]

        n_pen = params.repeat_last_n
        self._pen_on = "penalties" in self.plan
        self._dry_on = "dry" in self.plan
        self._pen_win: deque[int] = deque(maxlen=n_pen if n_pen > 0 else None)
        self._pen_counts: Counter[int] = Counter()
        n_dry = params.dry_penalty_last_n
        if n_dry == -1:
            n_dry = n_ctx_train
        if n_ctx_train > 0 and n_dry > 0:
            n_dry = min(n_dry, n_ctx_train)
        self._dry_win: deque[int] = deque(maxlen=n_dry if n_dry > 0 else None)
        # the accepted history matters only to the penalty and DRY windows, and of it only
        # the last tokens the windows keep
        wins = [w.maxlen for w, on in ((self._pen_win, self._pen_on), (self._dry_win, self._dry_on)) if on]
        hist = _window_tail(history, self.vocab_size, None if None in wins else max(wins)) if wins else []
        if self._pen_on:
            self._pen_win.extend(hist)
            self._pen_counts = Counter(self._pen_win)
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
        """Record an accepted token: penalty/DRY windows, mirostat mu, adaptive-p average, grammar."""
        token = int(token)
        if self.grammar is not None:
            self.grammar.accept(token)
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

    # -- what the batched stages read, and what the final pick reports back ------------------

    @property
    def penalty_counts(self) -> Counter[int]:
        """token -> occurrences in the penalty window (last ``repeat_last_n`` accepted)."""
        return self._pen_counts

    def dry_penalties(self) -> dict[int, float]:
        """token -> DRY logit penalty for the next position (llama.cpp's four steps)."""
        return dry_penalties(self.params, self._dry_win, self.dry_breakers)

    def adaptive_target(self) -> float:
        """adaptive-p's target for this draw, corrected by the running average of the
        original probabilities of accepted tokens; in [0, 1]."""
        tgt = min(max(self.params.adaptive_target, 0.0), 1.0)
        a = tgt if self._ap_weight == 0.0 else 2.0 * tgt - self._ap_sum / self._ap_weight
        return min(max(a, 0.0), 1.0)

    def note_pick(self, token: int, prob: float, prob_orig: float | None) -> None:
        """The final pick drew ``token`` with probability ``prob`` among the final candidates
        (``prob_orig``: adaptive-p's original probability). Mirostat's mu and adaptive-p's
        average take effect on ``accept`` of the same token."""
        if self.final.startswith("mirostat") and prob > 0.0:
            p = self.params
            self._pending_mu = self.mu - p.mirostat_eta * (-math.log2(prob) - p.mirostat_tau)
        if prob_orig is not None and self.params.adaptive_target >= 0.0:
            self._ap_pending = (int(token), prob_orig)
