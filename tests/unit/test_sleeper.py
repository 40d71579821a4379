"""engine/sleeper.py with a stand-in engine: when it sleeps, what it keeps, what wakes it."""

from __future__ import annotations

import gc
import time
import weakref
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import pytest

from kvserve.engine.sleeper import SleepingEngine
from kvserve.engine.snapshot import EngineSnapshot
from kvserve.engine.stats import EngineStats, throughput


@dataclass
class Slot:
    is_processing: bool = False


@dataclass
class Sched:
    stats: EngineStats = field(default_factory=EngineStats)


class StubEngine:
    """What SleepingEngine uses of an Engine: snapshot, counters, start/stop."""

    def __init__(self) -> None:
        self.scheduler = Sched()
        self.busy = False
        self.deferred = 0
        self.ready = False
        self.stopped = False
        self.scraped_rates: tuple[int, float, int, float] = (0, 0.0, 0, 0.0)
        self.weights = bytearray(1 << 20)  # what sleeping must free

    def snapshot(self) -> EngineSnapshot:
        st = self.scheduler.stats
        m = {**st.counters(), "requests_deferred": self.deferred}
        return EngineSnapshot((Slot(self.busy),), MappingProxyType(m), st.rates(), MappingProxyType({}), 0.0)  # type: ignore[arg-type]

    def metrics_snapshot(self) -> dict[str, float]:
        snap = self.snapshot()
        prev, self.scraped_rates = self.scraped_rates, snap.rates
        return {**snap.metrics, **throughput(snap.rates, prev)}

    def adopt_counters(self, stats: EngineStats, rates: tuple[int, float, int, float]) -> None:
        self.scheduler.stats, self.scraped_rates = stats, rates

    def start(self) -> None:
        self.ready = True

    def stop(self) -> None:
        self.stopped = True

    def health(self) -> str | None:
        return None

    def generate(self) -> str:
        st = self.scheduler.stats
        st.tokens_predicted_total += 8
        st.rate_predicted_tokens += 7
        st.rate_predicted_s += 0.5
        return "ok"


def make(idle_s: float = 0.2) -> tuple[SleepingEngine, list[StubEngine]]:
    built: list[StubEngine] = []

    def build() -> StubEngine:
        built.append(StubEngine())
        return built[-1]

    first = build()
    first.start()
    eng = SleepingEngine(build, idle_s, n_slots=1, poll_s=0.02)
    eng.attach(first)
    return eng, built


def wait_until(cond: Any, timeout: float = 5.0) -> None:
    t0 = time.monotonic()
    while not cond():
        assert time.monotonic() - t0 < timeout, "condition not reached"
        time.sleep(0.01)


def test_sleeps_after_idle_seconds_and_frees_the_engine() -> None:
    eng, built = make(0.2)
    calls: list[bool] = []
    eng.on_sleep.append(lambda: calls.append(eng._engine is not None))  # runs while the engine exists
    ref = weakref.ref(built[0])
    t0 = time.monotonic()
    wait_until(lambda: eng.n_sleeps == 1)  # the engine stopped and released (is_sleeping turns true before)
    assert time.monotonic() - t0 >= 0.2 and eng.is_sleeping
    assert calls == [True] and built[0].stopped
    del built[0]
    gc.collect()
    assert ref() is None  # nothing holds the engine (its weights) any more
    assert eng.ready and eng.health() is None and eng.n_sleeps == 1
    eng.stop_monitor()


def test_in_flight_busy_or_deferred_work_keeps_it_awake() -> None:
    eng, built = make(0.1)
    eng.begin_request()
    time.sleep(0.3)
    assert not eng.is_sleeping  # a request is in flight
    eng.end_request()
    built[0].busy = True  # a slot still generating
    time.sleep(0.3)
    assert not eng.is_sleeping
    built[0].busy, built[0].deferred = False, 1
    time.sleep(0.3)
    assert not eng.is_sleeping
    built[0].deferred = 0
    t0 = time.monotonic()
    wait_until(lambda: eng.is_sleeping)
    assert time.monotonic() - t0 >= 0.1  # the idle time counts from the last work seen
    eng.stop_monitor()


def test_a_request_wakes_it_with_the_counters_kept() -> None:
    eng, built = make(0.1)
    assert eng.generate() == "ok"  # forwarded to the live engine
    wait_until(lambda: eng.is_sleeping)
    eng.begin_request()  # reloads
    assert not eng.is_sleeping and len(built) == 2 and eng.n_wakes == 1
    assert built[1].scheduler.stats.tokens_predicted_total == 8  # counters continue
    eng.end_request()
    eng.stop_monitor()


def test_metrics_while_sleeping_report_the_window_once() -> None:
    eng, built = make(0.1)
    eng.generate()
    wait_until(lambda: eng.is_sleeping)
    first = eng.metrics_snapshot()
    assert first["predicted_tokens_seconds"] == pytest.approx(14.0) and first["tokens_predicted_total"] == 8
    again = eng.metrics_snapshot()
    assert again["predicted_tokens_seconds"] == 0 and again["tokens_predicted_total"] == 8
    assert len(built) == 1  # scraping did not wake it
    eng.begin_request()
    assert eng.metrics_snapshot()["predicted_tokens_seconds"] == 0  # not reported again after waking
    eng.end_request()
    eng.stop_monitor()


def test_scraped_before_sleeping_stays_scraped() -> None:
    eng, built = make(0.15)
    eng.generate()
    assert eng.metrics_snapshot()["predicted_tokens_seconds"] > 0
    awake = eng.metrics_snapshot()
    wait_until(lambda: eng.is_sleeping)
    assert eng.metrics_snapshot() == awake
    eng.stop_monitor()


def test_reading_anything_else_wakes_it() -> None:
    eng, built = make(0.1)
    wait_until(lambda: eng.is_sleeping)
    assert eng.generate() == "ok" and not eng.is_sleeping and len(built) == 2
    eng.stop_monitor()


def test_a_frozen_heap_is_thawed_to_free_the_engine_and_frozen_again_on_wake() -> None:
    from kvserve.model import heap

    first = StubEngine()
    first.me = first  # type: ignore[attr-defined]  # a reference cycle: only a collection frees it
    ref = weakref.ref(first)
    first.start()
    eng = SleepingEngine(lambda: StubEngine(), 60.0, n_slots=1, poll_s=0.02)
    eng.attach(first)
    del first
    try:
        heap.freeze()  # as the server's start-up does
        eng.sleep_now()
        assert eng.is_sleeping
        assert ref() is None  # thawed and collected, though it was frozen
        assert gc.get_freeze_count() == 0
        eng.begin_request()  # wakes it
        eng.end_request()
        assert not eng.is_sleeping and gc.get_freeze_count() > 0  # frozen again
    finally:
        gc.unfreeze()
        gc.collect()  # the collector's counts as a process that never froze has them
        eng.stop_monitor()


def test_an_unfrozen_heap_stays_unfrozen_across_sleep_and_wake() -> None:
    eng, _built = make(60.0)
    try:
        assert gc.get_freeze_count() == 0
        eng.sleep_now()
        eng.begin_request()
        eng.end_request()
        assert not eng.is_sleeping and gc.get_freeze_count() == 0
    finally:
        eng.stop_monitor()
