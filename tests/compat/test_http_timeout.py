"""--timeout: a request that produces nothing for that long is cancelled and answered 503."""

from __future__ import annotations

from typing import Any

from kvserve.engine.request import GenerationRequest

from .test_http_fake_engine import FakeEngine, client


class SilentEngine(FakeEngine):
    def submit(self, req: GenerationRequest, emit: Any) -> None:
        self.submitted.append(req)  # accepted, never answered


def test_silent_request_times_out_and_is_cancelled():
    c, eng = client(SilentEngine(), timeout=1)
    r = c.post("/completion", json={"prompt": "hello", "n_predict": 4})
    assert r.status_code == 503 and r.json()["error"]["type"] == "unavailable_error"
    assert "timeout" in r.json()["error"]["message"]
    assert eng.cancelled == {eng.submitted[0].id}


def test_streams_that_keep_producing_do_not_time_out():
    c, eng = client(FakeEngine(delay=0.3), timeout=1)
    r = c.post("/completion", json={"prompt": "hello", "n_predict": 8, "stream": True})
    assert r.status_code == 200 and '"stop": true' in r.text.replace('"stop":true', '"stop": true')
