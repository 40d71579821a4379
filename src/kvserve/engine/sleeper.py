"""The engine behind ``--sleep-idle-seconds N``: unloaded after N idle seconds, reloaded on use.

``SleepingEngine`` stands where the engine stands (attribute access is forwarded to the live
``Engine``). A monitor thread puts it to sleep once nothing has used it for ``idle_s``
seconds: no request in flight (``begin_request``/``end_request``, called by the HTTP layer
around every request that needs the model), no slot busy and none deferred. Sleeping:

1. the ``on_sleep`` callbacks run while the engine still exists (the HTTP layer snapshots the
   ``/props`` and ``/models`` bodies there, as llama-server does);
2. the last published ``EngineSnapshot``, the cumulative counters (``EngineStats``) and the
   scraper's throughput mark are kept: ``/metrics`` keeps answering from them (the first scrape
   after the last generation still reports its throughput, later ones 0);
3. the engine thread stops and every reference to the engine goes: weights, KV pool, prompt
   cache and compiled grammars are freed (and freed memory is handed back to the OS).

``begin_request`` on a sleeping engine rebuilds it with ``build`` (the same load as at start-up)
and hands it the kept counters, so metrics continue where they were. ``health``,
``metrics_snapshot`` and ``is_sleeping`` never wake it; anything else read from a sleeping
engine wakes it first (a safety net: the HTTP layer wakes it before a request runs).

Locking: ``_lock`` orders sleep, wake and request admission; the monitor only sleeps with no
request in flight, and a request admitted while the engine sleeps waits for the reload.
"""

from __future__ import annotations

import gc
import logging
import threading
import time
from typing import Any, Callable

from ..model import heap
from .stats import EngineStats, throughput

log = logging.getLogger("kvserve.engine")

# read from the proxy itself (they must not wake a sleeping engine)
_OWN = frozenset({"ready", "is_sleeping", "health", "metrics_snapshot", "begin_request", "end_request",
                  "on_sleep", "n_slots", "attach", "sleep_now", "stop_monitor"})


class SleepingEngine:
    def __init__(self, build: Callable[[], Any], idle_s: float, n_slots: int, poll_s: float = 0.1,
                 release: Callable[[], None] | None = None) -> None:
        self._build = build
        self.idle_s = idle_s
        self.n_slots = n_slots
        self._poll_s = poll_s
        self._release = release
        self._engine: Any = None
        self._lock = threading.RLock()
        self._in_flight = 0
        self._last_used = time.monotonic()
        self._sleeping = False
        self._kept: tuple[Any, EngineStats, Any] | None = None  # (snapshot, stats, scraped rates)
        self._scrape_lock = threading.Lock()
        self.on_sleep: list[Callable[[], None]] = []
        self.n_sleeps = 0
        self._refreeze = False  # the heap was frozen (heap.freeze) when it went to sleep
        self.n_wakes = 0
        self._stop = threading.Event()
        self._monitor: threading.Thread | None = None

    # -- life cycle --------------------------------------------------------------------------
    def attach(self, engine: Any) -> None:
        """The first engine (loaded and started at start-up); starts the idle monitor."""
        with self._lock:
            self._engine = engine
            self._last_used = time.monotonic()
        self._monitor = threading.Thread(target=self._watch, name="kvserve-sleep", daemon=True)
        self._monitor.start()

    def stop_monitor(self) -> None:
        self._stop.set()
        if self._monitor is not None:
            self._monitor.join(timeout=5)

    @property
    def ready(self) -> bool:
        with self._lock:
            return self._sleeping or (self._engine is not None and bool(self._engine.ready))

    @property
    def is_sleeping(self) -> bool:
        return self._sleeping

    def begin_request(self) -> None:
        """A request that needs the model starts: wake the engine if it sleeps (blocks while it loads)."""
        with self._lock:
            self._in_flight += 1
            self._last_used = time.monotonic()
            try:
                if self._sleeping:
                    self._wake()
            except BaseException:
                self._in_flight -= 1
                raise

    def end_request(self) -> None:
        with self._lock:
            self._in_flight -= 1
            self._last_used = time.monotonic()

    def _idle(self) -> bool:
        """Engine lock held. Nothing in flight, no slot busy, nothing deferred, for idle_s seconds."""
        if self._sleeping or self._engine is None or self._in_flight:
            return False
        snap = self._engine.snapshot()
        if any(s.is_processing for s in snap.slots) or snap.metrics.get("requests_deferred", 0):
            self._last_used = time.monotonic()
            return False
        return time.monotonic() - self._last_used >= self.idle_s

    def _watch(self) -> None:
        while not self._stop.wait(self._poll_s):
            with self._lock:
                if self._idle():
                    try:
                        self._sleep()
                    except Exception:  # noqa: BLE001 - sleeping is an optimisation; keep serving
                        log.exception("entering the sleeping state failed")

    def sleep_now(self) -> None:
        """Enter the sleeping state now if nothing is in flight (tests; the monitor does it on time)."""
        with self._lock:
            if not self._sleeping and self._engine is not None and not self._in_flight:
                self._sleep()

    def _sleep(self) -> None:
        engine = self._engine
        for cb in self.on_sleep:
            cb()
        with self._scrape_lock:
            self._kept = (engine.snapshot(), engine.scheduler.stats, engine.scraped_rates)
        self._sleeping = True
        self._engine = None
        engine.stop()
        del engine
        # a frozen heap holds the engine's start-up objects out of collections: thawed, so that
        # the engine's reference cycles are freed now (frozen again once it is back)
        self._refreeze = heap.thaw()
        gc.collect()
        if self._release is not None:
            self._release()
        self.n_sleeps += 1
        log.info("server is entering sleeping state (idle for %g s): model unloaded", self.idle_s)

    def _wake(self) -> None:
        assert self._kept is not None
        log.info("server is exiting sleeping state: reloading the model")
        engine = self._build()
        _, stats, rates = self._kept
        engine.adopt_counters(stats, rates)
        engine.start()
        if self._refreeze:
            heap.freeze()
            self._refreeze = False
        self._engine = engine
        self._kept = None
        self._sleeping = False
        self._last_used = time.monotonic()
        self.n_wakes += 1

    # -- readers that never wake -------------------------------------------------------------
    def health(self) -> str | None:
        engine = self._engine
        if self._sleeping or engine is None:
            return None
        return engine.health()  # type: ignore[no-any-return]

    def metrics_snapshot(self) -> dict[str, float]:
        """The live engine's; while sleeping, the kept snapshot's counters with llama-server's
        throughput window (what was not scraped before sleeping is reported once)."""
        with self._scrape_lock:
            kept = self._kept
            if kept is None:
                if self._engine is None:
                    raise AttributeError("metrics_snapshot")  # still loading
                return self._engine.metrics_snapshot()  # type: ignore[no-any-return]
            snap, stats, prev = kept
            self._kept = (snap, stats, snap.rates)
        m = dict(snap.metrics)
        m.update(throughput(snap.rates, prev))
        return m

    # -- everything else goes to the live engine ---------------------------------------------
    def __getattr__(self, name: str) -> Any:
        if name.startswith("_") or name in _OWN:
            raise AttributeError(name)
        engine = self.__dict__.get("_engine")
        if engine is None and self.__dict__.get("_sleeping"):
            with self._lock:
                if self._sleeping:
                    self._wake()
                engine = self._engine
        if engine is None:
            raise AttributeError(name)
        return getattr(engine, name)
