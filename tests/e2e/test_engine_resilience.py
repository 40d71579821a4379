"""The engine on the real SmolLM2: snapshots never wait for a forward pass, failures fail
requests (not the server) and are reported by /health, preemption keeps greedy outputs."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from starlette.testclient import TestClient

from kvserve.server.app import create_app
from kvserve.server.settings import ServerSettings

from ..conftest import TEXTS
from .engine_harness import assert_idle, make_engine, run, submit


@pytest.fixture(scope="module")
def tok(smollm):
    from kvserve.model.tokenizer import Tokenizer

    return Tokenizer.from_metadata(smollm.metadata)


def _ids(tok, text):
    return tok.encode(text, add_special=True, parse_special=True)


def _client(eng) -> TestClient:
    s = ServerSettings(model_name="m", aliases=("m",), model_path="m", endpoint_metrics=True,
                       n_parallel=eng.n_slots)
    return TestClient(create_app(eng, s), raise_server_exceptions=False)


def _wait(cond, timeout: float = 60.0) -> None:
    t = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < t, "timed out"
        time.sleep(0.01)


def test_snapshots_answer_during_a_long_forward(smollm, tok):
    """/health, /metrics, /slots and /props answer in well under a second while a step of
    the engine thread takes 3 s (a slow runner), and /slots shows the request in progress."""
    eng = make_engine(smollm, n_slots=2, check_integrity=False)
    real_run = eng.runner.run
    inside = threading.Event()

    def slow_run(plan: Any) -> Any:
        inside.set()
        time.sleep(3.0)
        return real_run(plan)

    eng.runner.run = slow_run  # type: ignore[method-assign]
    eng.start()
    try:
        c = _client(eng)
        _, col = submit(eng, _ids(tok, "Tell me a story."), n_predict=2)
        assert inside.wait(30)
        t_enter = time.monotonic()
        took = {}
        for path in ("/health", "/metrics", "/slots", "/props"):
            t0 = time.monotonic()
            r = c.get(path)
            took[path] = time.monotonic() - t0
            assert r.status_code == 200, (path, r.text)
        assert time.monotonic() - t_enter < 2.5  # all of it happened inside the 3 s forward
        assert all(t < 0.5 for t in took.values()), took
        slots = c.get("/slots").json()
        assert any(s["is_processing"] for s in slots)
        _wait(lambda: col.done)
        assert col.final is not None
    finally:
        eng.stop()


def test_failed_forward_fails_its_requests_and_the_engine_goes_on(smollm, tok):
    eng = make_engine(smollm, n_slots=2)
    real_run = eng.runner.run
    state = {"fail": True}

    def flaky(plan: Any) -> Any:
        if state["fail"]:
            state["fail"] = False
            raise RuntimeError("device lost")
        return real_run(plan)

    eng.runner.run = flaky  # type: ignore[method-assign]
    _, a = submit(eng, _ids(tok, "Hello"), n_predict=3)
    run(eng, [a])
    assert a.error is not None and (a.error.code, a.error.type, a.error.message) == (
        500, "server_error", "Compute error.")
    _, b = submit(eng, _ids(tok, "Hello"), n_predict=3)
    run(eng, [b])
    assert b.final is not None and b.final.n_decoded == 3
    assert eng.health() is None
    assert_idle(eng)


def test_exception_escaping_a_step_fails_requests_and_serving_continues(smollm, tok):
    eng = make_engine(smollm, n_slots=2)
    real = eng.scheduler.schedule
    state = {"fail": True}

    def broken() -> Any:
        plan = real()
        if state["fail"] and plan is not None:
            state["fail"] = False
            raise RuntimeError("scheduler bug")
        return plan

    eng.scheduler.schedule = broken  # type: ignore[method-assign]
    _, a = submit(eng, _ids(tok, "One"), n_predict=3)
    run(eng, [a])
    assert a.error is not None and a.error.code == 500 and "scheduler bug" in a.error.message
    assert eng.health() is None  # the cache's invariants held: the engine goes on
    _, b = submit(eng, _ids(tok, "Two"), n_predict=3)
    run(eng, [b])
    assert b.final is not None
    assert_idle(eng)


def test_engine_that_cannot_continue_says_so_on_health(smollm, tok):
    """A failure that leaves the cache inconsistent: every request fails, /health answers 503
    with the error, and new requests fail at once instead of hanging."""
    eng = make_engine(smollm, n_slots=2)
    eng.start()
    try:
        c = _client(eng)
        assert c.get("/health").json() == {"status": "ok"}

        def corrupt(*_: Any, **__: Any) -> Any:
            raise AssertionError("page 3: ref 2 != 1 holders")

        eng.cache.check_integrity = corrupt  # type: ignore[method-assign]
        def broken() -> Any:
            raise RuntimeError("scheduler bug")

        eng.scheduler.schedule = broken  # type: ignore[method-assign]
        _, a = submit(eng, _ids(tok, "One"), n_predict=3)
        _wait(lambda: a.done)
        assert a.error is not None and a.error.code >= 500
        _wait(lambda: eng.health() is not None)
        r = c.get("/health")
        assert r.status_code == 503
        err = r.json()["error"]
        assert err["type"] == "unavailable_error" and "page 3" in err["message"]
        r = c.post("/completion", json={"prompt": "Hi", "n_predict": 2})
        assert r.status_code == 503 and r.json()["error"]["type"] == "unavailable_error"
    finally:
        eng.stop()


def test_preempted_outputs_equal_unpreempted_greedy_outputs(smollm_dense, tok):
    """A pool of 12 pages (192 tokens) for three requests that need ~100 tokens each: the
    scheduler preempts and recomputes, and every output equals the one of a roomy pool.
    On the dequantized fp32 reference weights: the int4 CPU matmul rounds differently for a
    recomputed prefill than for one-token decode steps, which can flip a near-tie."""
    smollm = smollm_dense
    prompts = [_ids(tok, t[:160]) for t in TEXTS]
    n_predict = 48

    def outputs(**kw: Any) -> tuple[list[list[int]], int]:
        eng = make_engine(smollm, n_slots=3, n_batch=64, **kw)
        cols = [submit(eng, p, n_predict=n_predict)[1] for p in prompts]
        run(eng, cols)
        assert all(c.final is not None for c in cols), [c.error for c in cols]
        assert_idle(eng)
        return [c.final.tokens for c in cols], eng.scheduler.stats.preemptions

    roomy, n0 = outputs(n_ctx=4096)
    tight, n1 = outputs(n_ctx=64, n_ctx_slot=160)
    assert n0 == 0 and n1 > 0
    assert tight == roomy


def test_exception_at_intake_fails_that_request_only(smollm, tok):
    eng = make_engine(smollm, n_slots=1)
    real_add = eng.scheduler.add
    bad = _ids(tok, "One")

    def add(req: Any, emit: Any) -> None:
        if req.prompt_tokens == bad:
            raise ValueError("unreadable request")
        real_add(req, emit)

    eng.scheduler.add = add  # type: ignore[method-assign]
    _, a = submit(eng, _ids(tok, "One"), n_predict=2)
    _, b = submit(eng, _ids(tok, "Two"), n_predict=2)
    run(eng, [a, b])
    assert a.error is not None and a.error.message == "got exception: unreadable request"
    assert b.final is not None and eng.health() is None
    assert_idle(eng)
