"""KV page exhaustion and failures, driven through the real scheduler and cache on a fake model
(tests/unit/scheduler_harness.py) with ``check_integrity()`` after every step."""

from __future__ import annotations

import random

import pytest

from kvserve.engine.request import FinalEvent
from kvserve.plan import Plan

from .scheduler_harness import Harness, reference


def _prompts(n: int, seed: int, lo: int = 3, hi: int = 12) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(1, 50) for _ in range(rng.randrange(lo, hi))] for _ in range(n)]


@pytest.mark.parametrize("retain", [0, None], ids=["no-prefix-cache", "prefix-cache"])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_exhaustion_preempts_and_every_request_finishes_exactly(retain: int | None, seed: int) -> None:
    """A pool far smaller than what the requests need together: sequences get preempted and
    recomputed, every request still finishes with the tokens of an unpreempted run, no page
    leaks, and the run ends in a bounded number of steps."""
    h = Harness(n_pages=14, page_size=4, n_slots=4, n_ctx_slot=48, n_batch=16, retain=retain)
    rng = random.Random(seed)
    reqs = [(p, rng.randrange(10, 30)) for p in _prompts(10, seed)]
    subs = [h.submit(p, n) for p, n in reqs]
    h.run()
    for (prompt, n), (_, ev) in zip(reqs, subs):
        assert len(ev.terminal) == 1, ev.events
        assert ev.final is not None, ev.error
        assert ev.final.tokens == reference(prompt, n)
        assert ev.final.stop_type == "limit" and ev.final.n_decoded == n
    assert h.sch.stats.preemptions > 0  # the pool really ran out
    h.assert_idle()


def test_preempted_stream_is_continuous() -> None:
    """A preempted streaming request's token events continue where they stopped: the streamed
    text is the final text, with no repeat and no gap."""
    h = Harness(n_pages=10, page_size=4, n_slots=3, n_ctx_slot=40, n_batch=8)
    subs = [h.submit(p, 24, stream=True) for p in _prompts(3, 7, 4, 8)]
    h.run()
    assert h.sch.stats.preemptions > 0
    for _, ev in subs:
        streamed = "".join(e.text for e in ev.events if hasattr(e, "text") and not isinstance(e, FinalEvent))
        assert ev.final is not None and streamed == ev.final.content
        counts = [e.n_decoded for e in ev.events if hasattr(e, "n_decoded") and not isinstance(e, FinalEvent)]
        assert counts == list(range(1, len(counts) + 1))
    h.assert_idle()


def test_a_sequence_that_cannot_fit_alone_fails_with_llama_servers_error() -> None:
    """Nothing to preempt: the request fails with llama-server's error, the others go on."""
    h = Harness(n_pages=6, page_size=4, n_slots=2, n_ctx_slot=64)  # 24 tokens of KV
    _, big = h.submit(list(range(1, 11)), 40)
    h.run()
    assert big.error is not None and len(big.terminal) == 1
    assert (big.error.code, big.error.type) == (500, "server_error")
    assert big.error.message == "Context size has been exceeded."
    _, too_long = h.submit(list(range(1, 31)), 2)  # a prompt larger than the pool never fits
    _, ok = h.submit([5, 6, 7], 5)
    h.run()
    assert too_long.error is not None and too_long.error.message == "Context size has been exceeded."
    assert ok.final is not None and ok.final.tokens == reference([5, 6, 7], 5)
    h.assert_idle()


def test_admission_waits_for_pages_instead_of_spinning() -> None:
    """A request whose prompt does not fit next to the running ones waits (holding no pages)
    and starts once they finish; the older request is never preempted by it."""
    h = Harness(n_pages=8, page_size=4, n_slots=2, n_ctx_slot=32, n_batch=64)
    _, a = h.submit(list(range(1, 17)), 8)  # 16 prompt tokens + 8: up to 6 pages
    h.step()  # a's prompt: 4 pages, then 5 with its first decode
    _, b = h.submit(list(range(20, 36)), 4)  # 16 prompt tokens: 4 pages, only 3 left
    h.step()
    seq_b = next(s for s in h.sch.running.values() if s.id != 1)
    assert seq_b.state.value == "wait_shared" and seq_b.id not in h.mgr.seqs
    h.run()
    assert a.final is not None and a.final.tokens == reference(list(range(1, 17)), 8)
    assert b.final is not None and b.final.tokens == reference(list(range(20, 36)), 4)
    assert h.sch.stats.preemptions == 0
    h.assert_idle()


def test_failed_forward_keeps_the_moves_of_sequences_it_did_not_run() -> None:
    """B is admitted with a copy-on-write move from the cache but gets no chunk in the step
    whose forward fails: B's move must still run before B's first forward."""
    h = Harness(n_pages=32, page_size=4, n_slots=3, n_ctx_slot=64, n_batch=10)
    shared = list(range(1, 11))  # 2.5 pages: B copies the partial third page
    _, x = h.submit(shared + [40, 41], 3)
    h.run()
    assert x.final is not None
    fail_ids: set[int] = set()
    h.runner.fail = lambda plan: any(c.seq_id in fail_ids for c in plan.chunks)
    rid_a, a = h.submit(list(range(20, 30)), 3)  # fills the batch
    _, b = h.submit(shared + [45, 46, 47], 3)
    fail_ids.add(rid_a)
    h.step()  # A's forward fails; B had no chunk in it
    assert a.error is not None and (a.error.code, a.error.message) == (500, "Compute error.")
    assert not b.terminal
    h.runner.fail = None
    h.run()
    assert b.final is not None and b.final.tokens == reference(shared + [45, 46, 47], 3)
    assert b.final.n_cached > 0
    h.assert_idle()


def test_cancel_while_waiting_gets_its_final_event() -> None:
    h = Harness(n_pages=32, page_size=4, n_slots=1)
    _, a = h.submit([1, 2, 3], 6)
    rid_b, b = h.submit([4, 5, 6], 6)  # waits for the only slot
    h.step()
    h.sch.cancel(rid_b)
    h.run()
    assert len(b.terminal) == 1 and b.final is not None and b.final.stop_type == "none"
    assert b.final.tokens == [] and b.final.n_prompt == 3
    assert a.final is not None and a.final.tokens == reference([1, 2, 3], 6)
    h.assert_idle()


def test_exception_in_commit_fails_only_the_request_it_touches() -> None:
    h = Harness(n_pages=32, page_size=4, n_slots=3)
    _, a = h.submit([1, 2, 3, 4, 5], 6)
    rid_b, b = h.submit([6, 7, 8], 6)
    _, c = h.submit([9, 10], 6)
    publish = h.mgr.publish

    def broken(seq_id: int, tokens, n: int) -> int:  # type: ignore[no-untyped-def]
        if seq_id == rid_b and n > 4:
            raise ValueError("injected")
        return publish(seq_id, tokens, n)

    h.mgr.publish = broken  # type: ignore[method-assign]
    h.run()
    assert b.error is not None and len(b.terminal) == 1
    assert (b.error.code, b.error.type, b.error.message) == (500, "server_error", "got exception: injected")
    assert a.final is not None and a.final.tokens == reference([1, 2, 3, 4, 5], 6)
    assert c.final is not None and c.final.tokens == reference([9, 10], 6)
    h.assert_idle()


def test_exception_in_schedule_fails_only_the_request_it_touches() -> None:
    h = Harness(n_pages=32, page_size=4, n_slots=2)
    _, a = h.submit([1, 2, 3, 4, 5], 8)
    rid_b, b = h.submit([6, 7, 8], 8)
    reserve = h.mgr.reserve
    calls = {"n": 0}

    def broken(seq_id: int, n: int) -> list[int]:
        if seq_id == rid_b:
            calls["n"] += 1
            if calls["n"] == 3:
                raise KeyError("injected")
        return reserve(seq_id, n)

    h.mgr.reserve = broken  # type: ignore[method-assign]
    h.run()
    assert b.error is not None and b.error.code == 500 and b.error.type == "server_error"
    assert a.final is not None and a.final.tokens == reference([1, 2, 3, 4, 5], 8)
    _, later = h.submit([1, 2], 3)  # the scheduler keeps serving
    h.run()
    assert later.final is not None and later.final.tokens == reference([1, 2], 3)
    h.assert_idle()


def _broken(at_launch: bool):
    def boom(*_a):
        raise RuntimeError("sampler broke")

    return boom if at_launch else (lambda *_a: boom)  # sample_async fails, or the wait for its result


@pytest.mark.parametrize("at_launch", [True, False])
def test_exception_in_sampling_fails_the_sampled_requests_only(at_launch: bool) -> None:
    h = Harness(n_pages=32, page_size=4, n_slots=2, n_batch=6)
    _, a = h.submit([1, 2, 3], 5)
    h.step()  # a's prompt is done; a decodes from now on
    _, b = h.submit(list(range(10, 30)), 3)  # b's prompt needs several steps of chunks
    h.sch.sampling.sample_async = _broken(at_launch)
    h.step()  # samples a only (b is mid-prompt)
    del h.sch.sampling.sample_async
    h.run()
    assert a.error is not None and a.error.message == "got exception: sampler broke"
    assert b.final is not None and b.final.tokens == reference(list(range(10, 30)), 3)
    h.assert_idle()


def test_plan_holds_only_moves_of_its_own_sequences() -> None:
    h = Harness(n_pages=32, page_size=4, n_slots=3, n_batch=4)
    _, x = h.submit(list(range(1, 11)), 2)
    h.run()
    h.submit(list(range(20, 30)), 2)
    h.submit(list(range(1, 11)) + [44], 2)  # a cache hit with a copy-on-write move
    plan = h.sch.schedule()
    assert isinstance(plan, Plan)
    ids = {c.seq_id for c in plan.chunks}
    waiting_moves = [s for s in h.sch.running.values() if s.id not in ids and s.pending_moves]
    assert waiting_moves, "the second request should still hold its moves"
    h.sch.commit(plan, h.runner.run(plan))
    h.run()
    h.assert_idle()


def test_metrics_throughput_covers_the_time_since_the_previous_scrape() -> None:
    """llama-server resets its throughput gauges on each /metrics read; kvserve takes the
    growth of cumulative counters between reads (the snapshot itself is never mutated)."""
    from kvserve.engine.stats import EngineStats, throughput

    st = EngineStats()
    first = st.rates()
    st.rate_prompt_tokens, st.rate_prompt_s = 100, 0.5
    st.rate_predicted_tokens, st.rate_predicted_s = 30, 1.5
    second = st.rates()
    assert throughput(second, first) == {"prompt_tokens_seconds": 200.0, "predicted_tokens_seconds": 20.0}
    assert throughput(second, second) == {"prompt_tokens_seconds": 0.0, "predicted_tokens_seconds": 0.0}


@pytest.mark.parametrize("n_pages", [40, 13])
def test_context_shift_under_page_pressure(n_pages: int) -> None:
    """Context shifts (which copy shared pages) in a pool that runs out: every request still
    generates all its tokens, the prompt head (n_keep) stays, KV rows stay consistent (the
    fake runner checks every row's position) and nothing leaks."""
    from kvserve.engine.scheduler import SchedulerConfig

    h = Harness(n_pages=n_pages, page_size=4, n_slots=3, n_ctx_slot=24)
    h.sch.cfg = SchedulerConfig(n_slots=3, n_ctx_slot=24, n_batch=16, page_size=4, context_shift=True)
    subs = [h.submit(p, 40, n_keep=3) for p in _prompts(3, 11, 6, 10)]
    heads = {rid: list(h.sch.waiting[i][0].prompt_tokens[:3]) for i, (rid, _) in enumerate(subs)}

    def step_and_check() -> None:
        h.step()
        for s in h.sch.running.values():
            assert s.tokens[:3] == heads[s.id]

    for _ in range(3000):
        if not h.sch.has_work():
            break
        step_and_check()
    for _, ev in subs:
        assert ev.final is not None and ev.final.n_decoded == 40 and ev.final.truncated, ev.error
    assert (h.sch.stats.preemptions > 0) == (n_pages < 20)
    h.assert_idle()


def test_random_cancels_under_pressure_give_one_terminal_event_each() -> None:
    """Cancels at any point (waiting for a slot, waiting for pages, preempted, mid-prompt,
    mid-stream) in a pool that runs out: exactly one terminal event per request, uncancelled
    ones produce their reference tokens, nothing leaks."""
    rng = random.Random(5)
    h = Harness(n_pages=12, page_size=4, n_slots=3, n_ctx_slot=40, n_batch=12)
    reqs = {}
    for p in _prompts(40, 9):
        n = rng.randrange(4, 20)
        rid, ev = h.submit(p, n)
        reqs[rid] = (p, n, ev)
    cancelled: set[int] = set()
    for _ in range(5000):
        if not h.sch.has_work():
            break
        for rid in list(reqs):
            if rid not in cancelled and not reqs[rid][2].terminal and rng.random() < 0.01:
                h.sch.cancel(rid)
                cancelled.add(rid)
        h.step()
    assert cancelled and h.sch.stats.preemptions > 0
    for rid, (p, n, ev) in reqs.items():
        assert len(ev.terminal) == 1, (rid, ev.events)
        if rid not in cancelled:
            assert ev.final is not None and ev.final.tokens == reference(p, n)
    h.assert_idle()


def test_time_to_first_token_by_stage() -> None:
    """Each request's first token adds its stages once: intake (server receipt to the engine's
    queue), queue (to admission) and prefill (admission to the first token); a request that
    did not come through the server counts no intake."""
    import time

    h = Harness(n_pages=40, page_size=4, n_slots=1)
    t0 = time.perf_counter()
    rid, ev = h.submit(list(range(1, 9)), 3)
    h.sch.waiting[0][0].t_received, h.sch.waiting[0][0].t_submitted = t0 - 0.5, t0 - 0.2
    _, ev2 = h.submit(list(range(11, 19)), 2)  # waits for the one slot
    h.sch.waiting[1][0].t_submitted = t0
    h.run()
    assert ev.final is not None and ev2.final is not None
    st = h.sch.stats
    assert st.first_tokens == 2
    s = st.stage_s
    assert abs(s["intake"] - 0.3) < 1e-6
    assert s["queue"] >= 0.2  # the first waited 0.2 s before this test admitted it
    assert s["prefill"] > 0 and s["prefill"] < time.perf_counter() - t0
    from kvserve.engine.snapshot import build_snapshot

    m = build_snapshot(h.sch, h.mgr, 64).metrics
    assert m["kvserve:first_tokens_total"] == 2
    assert m['kvserve:first_token_seconds_total{stage="queue"}'] == s["queue"]
