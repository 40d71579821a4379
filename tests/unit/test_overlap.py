"""Overlap: the commit of step N while step N+1 runs on an asynchronous device.

Everything runs the scheduler over the fake model of ``scheduler_harness`` (whose next token
depends on every KV row a sequence holds) through the engine's ``StepLoop`` with overlap on,
and compares with the same workload run step by step without it: the same tokens, the same
stop decisions, one terminal event per request, the cache's invariants after every step, and
no page left behind.
"""

from __future__ import annotations

import random
import time

import pytest

from kvserve.engine.request import CacheIdentity, GenerationRequest, RequestParams, TokenEvent
from kvserve.engine.sampling_params import SamplingParams
from tests.events import Collector
from tests.unit.scheduler_harness import Harness, reference


def _workload(h: Harness, seed: int, n: int = 10) -> list[tuple[list[int], int, Collector]]:
    rng = random.Random(seed)
    shared = [rng.randrange(1, 50) for _ in range(rng.randrange(0, 12))]
    out = []
    for _ in range(n):
        prompt = shared + [rng.randrange(1, 50) for _ in range(rng.randrange(1, 10))]
        n_predict = rng.randrange(1, 14)
        _, ev = h.submit(prompt, n_predict)
        out.append((prompt, n_predict, ev))
    return out


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("n_pages", [12, 40])
def test_overlap_gives_the_reference_tokens_under_pressure(seed: int, n_pages: int) -> None:
    h = Harness(n_pages=n_pages, page_size=4, n_slots=4, n_ctx_slot=40, overlap=True)
    reqs = _workload(h, seed)
    h.run()
    for prompt, n_predict, ev in reqs:
        assert len(ev.terminal) == 1
        assert ev.final is not None and ev.final.tokens == reference(prompt, n_predict)
    h.assert_idle()
    if n_pages == 40:  # room enough: steps were planned ahead of their predecessor's commit
        assert h.loop is not None and h.loop.n_ahead > 0 and h.runner.n_fed > 0


def test_a_stop_string_found_while_the_next_step_runs() -> None:
    """The fake decoder renders token t as chr(97 + t % 26): a stop string ends a request at the
    commit of step N while step N+1 (holding its row) is already on the device; that row is
    dropped and the text ends before the stop word, as without overlap."""
    prompt = [3, 1, 4, 1, 5]
    ref = reference(prompt, 30)
    word = "".join(chr(97 + t % 26) for t in ref[5:7])
    results = []
    for overlap in (False, True):
        h = Harness(n_pages=64, page_size=4, overlap=overlap)
        _, ev = h.submit(prompt, 30, stop=[word], stream=True)
        _, other = h.submit([2, 7, 1, 8], 20)
        h.run()
        assert ev.final is not None and ev.final.stop_type == "word"
        assert other.final is not None and other.final.tokens == reference([2, 7, 1, 8], 20)
        results.append((ev.final.content, ev.final.tokens, [e.text for e in ev.events if isinstance(e, TokenEvent)]))
        h.assert_idle()
    assert results[0] == results[1]
    assert word not in results[1][0]


def test_cancel_while_a_step_is_in_flight() -> None:
    h = Harness(n_pages=64, page_size=4, overlap=True)
    rid, ev = h.submit([1, 2, 3], 40)
    _, keep = h.submit([4, 5, 6], 12)
    for _ in range(6):
        h.step()
    assert h.loop is not None and h.loop.in_flight is not None
    h.sch.cancel(rid)
    h.run()
    assert len(ev.terminal) == 1 and ev.final is not None and ev.final.stop_type == "none"
    assert 0 < len(ev.final.tokens) < 40
    assert ev.final.tokens == reference([1, 2, 3], 40)[: len(ev.final.tokens)]
    assert keep.final is not None and keep.final.tokens == reference([4, 5, 6], 12)
    h.assert_idle()


def test_a_new_request_while_decoding_is_admitted_after_the_commit() -> None:
    h = Harness(n_pages=64, page_size=4, overlap=True)
    _, first = h.submit([9, 8, 7], 16)
    for _ in range(5):
        h.step()
    _, late = h.submit([9, 8, 7, 6], 8)
    h.run()
    assert first.final is not None and first.final.tokens == reference([9, 8, 7], 16)
    assert late.final is not None and late.final.tokens == reference([9, 8, 7, 6], 8)
    h.assert_idle()


def _seeded(h: Harness, prompt: list[int], seed: int) -> Collector:
    h._ids += 1
    ev = Collector()
    params = RequestParams(n_predict=24, sampling=SamplingParams(temperature=1.5, top_k=40, seed=seed))
    h.sch.add(GenerationRequest(h._ids, prompt, params, CacheIdentity()), ev)
    return ev


def test_seeded_sampling_draws_the_same_tokens() -> None:
    """Each row draws from its own generator once per step, in the same order either way."""
    runs = []
    for overlap in (False, True):
        h = Harness(n_pages=64, page_size=4, overlap=overlap)
        evs = [_seeded(h, [i + 1, 2, 3], seed=100 + i) for i in range(3)]
        h.run()
        runs.append([e.final.tokens for e in evs if e.final is not None])
        h.assert_idle()
    assert len(runs[1]) == 3 and runs[0] == runs[1]


def test_host_work_hides_behind_the_device_step() -> None:
    """A device step of 20 ms and 20 ms of host work per commit (a slow event consumer): step
    by step that is ~40 ms a step, overlapped ~20 ms."""
    def timed(overlap: bool) -> float:
        h = Harness(n_pages=64, page_size=4, overlap=overlap, step_s=0.02)
        evs = []
        for i in range(2):
            _, ev = h.submit([i + 1, 5, 5], 12, stream=True)
            evs.append(ev)
        for ev in evs:
            inner = ev.events

            class Slow(list):  # type: ignore[type-arg]
                def append(self, x: object) -> None:
                    time.sleep(0.01)
                    super().append(x)

            ev.events = Slow(inner)
        t0 = time.perf_counter()
        h.run()
        dt = time.perf_counter() - t0
        for i, ev in enumerate(evs):
            assert ev.final is not None and ev.final.tokens == reference([i + 1, 5, 5], 12)
        h.assert_idle()
        return dt

    seq, ovl = timed(False), timed(True)
    assert ovl < 0.8 * seq, (seq, ovl)


def test_idle_steps_leave_the_stats_alone() -> None:
    """Looking for work when there is none is not scheduler time: an idle server's /metrics stay
    the same between two scrapes (a sleeping server serves the snapshot taken on entering sleep)."""
    h = Harness(n_pages=64, page_size=4, overlap=True)
    h.submit([3, 1, 4], 5)
    h.run()
    assert h.loop is not None
    before = h.sch.stats.scheduler_s
    for _ in range(20):
        assert h.loop.step() is False
    assert h.sch.stats.scheduler_s == before
