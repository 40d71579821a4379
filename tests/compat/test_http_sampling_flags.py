"""Sampling flags are server-wide defaults: argv -> config -> /props and every request's params."""

from __future__ import annotations

import dataclasses

import pytest
from starlette.testclient import TestClient

from kvserve.config import load_config
from kvserve.server.app import create_app
from kvserve.server.settings import ServerSettings
from tests.compat.test_http_fake_engine import MODEL, FakeEngine


def _client(*argv: str) -> tuple[TestClient, FakeEngine]:
    warnings: list[str] = []
    cfg = load_config(list(argv), {"HOME": "/nonexistent"}, warn=warnings.append)
    assert warnings == []  # accepted silently: the sampler is implemented
    s = dataclasses.replace(ServerSettings.from_config(cfg), model_name=MODEL, aliases=(MODEL,),
                            model_path=MODEL, n_parallel=4)
    eng = FakeEngine()
    return TestClient(create_app(eng, s), raise_server_exceptions=False), eng


def test_adaptive_p_flags_are_defaults() -> None:
    c, eng = _client("--adaptive-target", "0.35", "--adaptive-decay", "0.5")
    params = c.get("/props").json()["default_generation_settings"]["params"]
    assert params["adaptive_target"] == pytest.approx(0.35) and params["adaptive_decay"] == 0.5
    assert c.post("/completion", json={"prompt": "hi", "n_predict": 2}).status_code == 200
    p = eng.submitted[-1].params.sampling
    assert p.adaptive_target == pytest.approx(0.35) and p.adaptive_decay == 0.5
    # a request's own value still wins over the server default
    c.post("/completion", json={"prompt": "hi", "n_predict": 2, "adaptive_target": 0.7})
    assert eng.submitted[-1].params.sampling.adaptive_target == pytest.approx(0.7)


def test_adaptive_p_off_by_default() -> None:
    c, eng = _client()
    params = c.get("/props").json()["default_generation_settings"]["params"]
    assert params["adaptive_target"] == -1.0 and params["adaptive_decay"] == pytest.approx(0.9)
    c.post("/completion", json={"prompt": "hi", "n_predict": 2})
    assert eng.submitted[-1].params.sampling.adaptive_target == -1.0
