"""--sleep-idle-seconds over HTTP (server/sleep.py): which requests wake a sleeping server."""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

import pytest

from kvserve.config import load_config
from kvserve.engine.sleeper import SleepingEngine
from kvserve.engine.snapshot import EngineSnapshot
from kvserve.engine.stats import EngineStats

from .test_http_fake_engine import FakeEngine, client


class Sched:
    def __init__(self) -> None:
        self.stats = EngineStats(tokens_predicted_total=7)


class SleepyFake(FakeEngine):
    def __post_init__(self) -> None:
        super().__post_init__()
        self.scheduler = Sched()
        self.scraped_rates = (0, 0.0, 0, 0.0)

    def snapshot(self) -> EngineSnapshot:
        m = {**self.metrics_snapshot(), "requests_deferred": 0}
        return EngineSnapshot(self.slots_snapshot(), MappingProxyType(m), (0, 0.0, 0, 0.0),
                              MappingProxyType({}), 0.0)

    def adopt_counters(self, stats: Any, rates: Any) -> None:
        self.scheduler.stats = stats

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass


@pytest.fixture()
def asleep() -> Any:
    built: list[SleepyFake] = []

    def build() -> SleepyFake:
        built.append(SleepyFake())
        return built[-1]

    eng = SleepingEngine(build, idle_s=3600, n_slots=4)
    eng.attach(build())
    yield eng, built
    eng.stop_monitor()


def _c(eng: Any, **kw: Any) -> Any:
    c, _ = client(eng, **kw)  # type: ignore[arg-type]
    eng.sleep_now()
    assert eng.is_sleeping
    return c


def test_read_only_endpoints_answer_without_waking(asleep: Any) -> None:
    eng, built = asleep
    c = _c(eng)
    awake_models = client(SleepyFake())[0].get("/v1/models").json()
    assert c.get("/health").json() == {"status": "ok"}
    props = c.get("/props").json()
    assert props["is_sleeping"] is True and props["total_slots"] == 4
    assert props["kvserve_memory"]["weight_bytes"] == 0
    for path in ("/models", "/v1/models"):
        got = c.get(path).json()
        for d in (got, awake_models):
            d["data"][0].pop("created", None)  # the time the body was made
        assert got == awake_models
    assert "llamacpp:tokens_predicted_total 7" in c.get("/metrics").text
    assert c.options("/completion").status_code == 200  # a CORS preflight
    assert c.get("/").status_code == 200  # the web UI's page
    assert c.get("/nope").status_code == 404
    assert eng.is_sleeping and len(built) == 1


@pytest.mark.parametrize("method,path,body", [
    ("POST", "/completion", {"prompt": "x", "n_predict": 1}),
    ("POST", "/tokenize", {"content": "Hello"}),
    ("POST", "/detokenize", {"tokens": [20]}),
    ("POST", "/apply-template", {"messages": [{"role": "user", "content": "x"}]}),
    ("POST", "/chat/completions/input_tokens", {"messages": [{"role": "user", "content": "x"}]}),
    ("POST", "/v1/messages/count_tokens", {"messages": [{"role": "user", "content": "x"}]}),
    ("GET", "/slots", None),
])
def test_other_requests_wake_it(asleep: Any, method: str, path: str, body: Any) -> None:
    eng, built = asleep
    c = _c(eng)
    r = c.request(method, path, json=body)
    assert r.status_code == 200, r.text
    assert not eng.is_sleeping and len(built) == 2
    assert c.get("/props").json()["is_sleeping"] is False
    assert "llamacpp:tokens_predicted_total 7" in c.get("/metrics").text  # counters carried over


def test_a_refused_request_does_not_wake_it(asleep: Any) -> None:
    eng, built = asleep
    c = _c(eng, api_keys=("k",))
    assert c.post("/completion", json={"prompt": "x"}).status_code == 401
    assert eng.is_sleeping
    r = c.post("/completion", json={"prompt": "x", "n_predict": 1}, headers={"Authorization": "Bearer k"})
    assert r.status_code == 200 and not eng.is_sleeping


def test_flag_is_implemented() -> None:
    warnings: list[str] = []
    cfg = load_config(["--sleep-idle-seconds", "5"], {}, warn=warnings.append)
    assert cfg.engine.sleep_idle_seconds == 5 and warnings == []
    assert load_config([], {}).engine.sleep_idle_seconds == -1
