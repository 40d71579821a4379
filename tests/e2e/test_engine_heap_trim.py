"""Freed memory goes back to the OS once the engine has been idle after a prefill, not during
a burst of requests (``engine.TRIM_IDLE_S``, ``model/heap.py``)."""

from __future__ import annotations

import time
from typing import Any

import pytest

from kvserve.engine import engine as engine_mod
from kvserve.model import heap

from .engine_harness import make_engine, submit


def _rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2**20


def _wait(col: Any) -> None:
    t0 = time.monotonic()
    while not col.done:
        assert time.monotonic() - t0 < 120
        time.sleep(0.005)
    assert col.final is not None, col.error


def test_idle_engine_returns_a_prefill_s_freed_memory(smollm: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    if heap._glibc() is None:
        pytest.skip("not glibc")
    trims: list[tuple[float, float]] = []  # (RSS before, after) of each trim
    real = heap.trim

    def counting() -> bool:
        before = _rss_mib()
        released = real()
        trims.append((before, _rss_mib()))
        return released

    monkeypatch.setattr(heap, "trim", counting)
    monkeypatch.setattr(engine_mod, "TRIM_IDLE_S", 0.5)
    eng = make_engine(smollm, n_slots=1, check_integrity=False)
    eng.start()
    try:
        text = " ".join(f"word{i} and some more text" for i in range(120))
        prompts = [eng.tokenizer.encode(f"{k}: {text}", add_special=True, parse_special=False) for k in range(3)]
        assert all(len(p) > 500 for p in prompts)
        for p in prompts:  # back to back: no trim between them
            _, col = submit(eng, p, n_predict=2)
            _wait(col)
        assert trims == []
        t0 = time.monotonic()
        while not trims:
            assert time.monotonic() - t0 < 10
            time.sleep(0.05)
        time.sleep(1.5)  # idle on: nothing more to give back
        assert len(trims) == 1
        before, after = trims[0]
        assert before - after > 8, trims  # the prefills' temporaries (~100 MiB here)
        _, col = submit(eng, [prompts[0][0], *prompts[1][1:40]], n_predict=2)  # the next request is served
        _wait(col)
    finally:
        eng.stop()
