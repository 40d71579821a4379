"""A scheduler on a fake model: no tensors of a real model, KV rows simulated by ``KVSim``.

The fake model's next token is a function of every (token, position) its KV rows hold, so a
sequence whose KV is lost, stale or misplaced (a preemption recomputed wrongly, a dropped
move) produces other tokens than the reference, and a read of an unwritten row fails at once.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any, Callable

import torch

from kvserve.cache.kv_sim import KVSim
from kvserve.cache.manager import KVCacheManager
from kvserve.engine.request import CacheIdentity, GenerationRequest, RequestParams
from kvserve.engine.sampling import Sampling
from kvserve.engine.scheduler import Scheduler, SchedulerConfig
from kvserve.engine.pipeline import StepLoop
from kvserve.plan import FED, Plan, RunOutput

from tests.events import GREEDY, Collector

V = 50
EOS = 0


def next_token(rows: list[tuple[int, int]]) -> int:
    """The fake model: a hash of the whole context, never EOS."""
    h = 17
    for tok, pos in rows:
        h = (h * 1_000_003 + tok * 31 + pos) % 2_147_483_647
    return 1 + h % (V - 1)


def reference(prompt: list[int], n_predict: int) -> list[int]:
    """Greedy output of the fake model computed from scratch (no cache, no preemption)."""
    toks = list(prompt)
    for _ in range(n_predict):
        toks.append(next_token([(t, p) for p, t in enumerate(toks)]))
    return toks[len(prompt) :]


class _Decoder:
    def feed(self, token: int) -> str:
        return chr(ord("a") + token % 26)

    def flush(self) -> str:
        return ""


class FakeTokenizer:
    n_vocab = V
    eog_ids = (EOS,)
    add_bos = False

    def stream_decoder(self, special: bool = False) -> _Decoder:
        return _Decoder()

    def encode(self, text: str, add_special: bool = False, parse_special: bool = False) -> list[int]:
        return [ord(c) % V for c in text]

    def token_bytes(self, tid: int, special: bool = True) -> bytes:
        return _Decoder().feed(tid).encode()


class FakeRunner:
    """Executes a plan on ``KVSim``: host-tier copies, then moves, then each chunk, asserting that every row
    below the chunk holds KV of its own position; logits are one-hot on ``next_token``.
    ``fail(plan)`` returning True makes the step raise (after the moves, like a forward
    that dies half-way)."""

    def __init__(self, mgr: KVCacheManager, fail: Callable[[Plan], bool] | None = None,
                 step_s: float = 0.0) -> None:
        """``step_s`` > 0: an asynchronous device (see ``run``)."""
        self.kv = KVSim(mgr.pool.n_pages, mgr.page_size, writable=mgr.pool.is_private)
        self.fail = fail
        self.n_runs = 0
        self.n_fed = 0
        self.step_s = step_s
        self.asynchronous = step_s > 0
        self._busy_until = 0.0

    @staticmethod
    def _until(t: float) -> None:
        left = t - time.perf_counter()
        if left > 0:
            time.sleep(left)

    def run(self, plan: Plan, prev_tokens: torch.Tensor | None = None) -> RunOutput:
        """Fed chunks (``plan.feed``) take their token from ``prev_tokens``. With ``step_s`` the
        step is asynchronous: it returns at once and its results are ready ``step_s`` after the
        previous step's (``RunOutput.ready`` waits for that), as a device queue would have it."""
        self.n_runs += 1
        for c in plan.copies:  # host-tier copies first, in order
            self.kv.copy(c)
        if plan.feed:
            assert len(plan.feed) == len(plan.chunks) and prev_tokens is not None
            fed = []
            for c, row in zip(plan.chunks, plan.feed):
                if row >= 0:
                    assert c.tokens == (FED,), "a fed chunk is one placeholder token"
                    c = replace(c, tokens=(int(prev_tokens[row]),))
                    self.n_fed += 1
                fed.append(c)
            plan = replace(plan, chunks=tuple(fed))
        for mv in plan.moves:
            self.kv.apply(mv)
        if self.fail is not None and self.fail(plan):
            raise RuntimeError("injected forward failure")
        logits: dict[int, object] = {}
        for c in plan.chunks:
            end = c.start_pos + len(c.tokens)
            assert len(c.page_table) * self.kv.page_size >= end, "page table too short"
            before = self.kv.read(c.page_table, 0, c.start_pos)
            for p, row in enumerate(before):
                assert row is not None and row[1] == p, f"seq {c.seq_id}: KV row {p} is {row}"
            self.kv.forward(c.page_table, [0] * c.start_pos + list(c.tokens), c.start_pos, end)
            if c.logits != "none":
                rows = self.kv.read(c.page_table, 0, end)
                x = torch.zeros(1, V)
                x[0, next_token(rows)] = 10.0  # type: ignore[arg-type]
                logits[c.seq_id] = x
        if not self.asynchronous:
            return RunOutput(logits)
        end = self._busy_until = max(time.perf_counter(), self._busy_until) + self.step_s
        return RunOutput(logits, ready=lambda: self._until(end))


class Harness:
    def __init__(self, n_pages: int, page_size: int = 4, n_slots: int = 4, n_ctx_slot: int = 64,
                 n_batch: int = 64, retain: int | None = None, fail: Callable[[Plan], bool] | None = None,
                 host: int | None | bool = False, overlap: bool = False, step_s: float = 0.0):
        """``host``: False = no host tier, else its limit in pages (None: unbounded).
        ``overlap``: steps go through the engine's ``StepLoop`` with overlap on (the commit of
        one step after the launch of the next); ``step_s``: the fake device's step time."""
        self.mgr = KVCacheManager(n_pages, page_size, retain, host_tier=host is not False,
                                  host_limit_pages=None if host is False else host)
        tok = FakeTokenizer()
        self.sch = Scheduler(
            SchedulerConfig(n_slots=n_slots, n_ctx_slot=n_ctx_slot, n_batch=n_batch, page_size=page_size),
            self.mgr, tok, Sampling(tok, V, torch.device("cpu")),
        )
        self.runner = FakeRunner(self.mgr, fail, step_s)
        self.loop = StepLoop(self.sch, self.runner, overlap) if overlap else None
        self._ids = 0

    def submit(self, prompt: list[int], n_predict: int, **params: Any) -> tuple[int, Collector]:
        self._ids += 1
        ev = Collector()
        req = GenerationRequest(self._ids, list(prompt), RequestParams(n_predict=n_predict, sampling=GREEDY,
                                                                       **params), CacheIdentity())
        self.sch.add(req, ev)
        return self._ids, ev

    def step(self) -> bool:
        """schedule → run → commit as the engine does (a failed run fails its plan)."""
        if self.loop is not None:
            ran = self.loop.step()
            self.mgr.check_integrity()
            return ran
        plan = self.sch.schedule()
        ran = plan is not None
        if plan is not None:
            try:
                out = self.runner.run(plan)
            except RuntimeError:
                self.sch.fail_plan(plan, "Compute error.")
            else:
                self.sch.commit(plan, out)
        self.mgr.check_integrity()
        return ran

    def run(self, max_steps: int = 5000) -> int:
        for n in range(max_steps):
            if not self.sch.has_work() and (self.loop is None or self.loop.in_flight is None):
                return n
            self.step()
        raise AssertionError(f"no progress after {max_steps} steps (livelock)")

    def assert_idle(self) -> None:
        assert not self.sch.running and not self.sch.waiting
        assert not any(s.busy for s in self.sch.slots)
        assert self.mgr.stats().in_use_pages == 0 and not self.mgr.seqs
        self.mgr.check_integrity()
