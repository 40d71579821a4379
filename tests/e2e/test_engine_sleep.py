"""Sleeping with the real engine: the loaded model is freed, a request reloads it, answers and
counters are the same as before."""

from __future__ import annotations

import gc
import time
import weakref
from typing import Any

from kvserve.engine.sleeper import SleepingEngine
from kvserve.model.loader import load_gguf

from .engine_harness import make_engine, submit


def _generate(eng: Any, tokens: list[int]) -> list[int]:
    eng.begin_request()
    try:
        _, col = submit(eng, tokens, n_predict=6)
        t0 = time.monotonic()
        # the final event, then the snapshot of the step that ended the request (published after
        # its events): the counters read next include it
        while not col.done or eng.metrics_snapshot()["requests_processing"]:
            assert time.monotonic() - t0 < 60
            time.sleep(0.01)
        assert col.final is not None, col.error
        return list(col.final.tokens)
    finally:
        eng.end_request()


def test_sleep_frees_the_model_and_a_request_reloads_it(smollm_path: str) -> None:
    loads: list[Any] = []

    def build() -> Any:
        loaded = load_gguf(smollm_path)
        loads.append(weakref.ref(loaded))
        return make_engine(loaded, n_ctx=512, n_slots=1, check_integrity=False)

    first = build()
    first.start()
    eng = SleepingEngine(build, idle_s=0.3, n_slots=1, poll_s=0.02)
    eng.attach(first)
    engine_ref = weakref.ref(first)
    del first
    try:
        prompt = eng.tokenizer.encode("The capital of France is", add_special=True, parse_special=False)
        before = _generate(eng, prompt)
        n_before = eng.metrics_snapshot()["tokens_predicted_total"]
        t0 = time.monotonic()
        # asleep and done: ``is_sleeping`` turns true as the engine starts stopping (so that a
        # request arriving then waits for the reload); ``n_sleeps`` counts once it is released
        while not (eng.is_sleeping and eng.n_sleeps == 1):
            assert time.monotonic() - t0 < 10
            time.sleep(0.02)
        gc.collect()
        assert engine_ref() is None and loads[0]() is None  # engine, weights and KV pool are gone
        assert eng.metrics_snapshot()["tokens_predicted_total"] == n_before  # kept while sleeping
        assert eng.health() is None and eng.ready
        after = _generate(eng, prompt)  # wakes: the model is loaded again
        assert len(loads) == 2 and not eng.is_sleeping
        assert after == before
        assert eng.metrics_snapshot()["tokens_predicted_total"] == 2 * n_before
    finally:
        eng.stop_monitor()
        live = eng._engine
        if live is not None:
            live.stop()
