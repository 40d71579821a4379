"""The real engine behind the real server, against the bodies recorded from llama-server for
both models (started with the goldens' flags: one slot, -c 4096, --metrics): same status
codes, same keys in the same order, same JSON types."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from tests.conftest import GOLDEN_DIR

from .live import start_server
from .test_http_golden import CASES, expected, same_shape

pytestmark = pytest.mark.slow

# Cases whose request depends on the context size of the fake engine used in test_http_golden.
REQUEST_OVERRIDES = {"ERR prompt exceeds context": {"prompt": "word " * 5000}}


@pytest.fixture(scope="module", params=["smollm2", "gemma3"])
def live(request, gemma_path):
    args = ["-np", "1", "-c", "4096", "--metrics"]
    if request.param == "gemma3":
        args += ["-m", gemma_path]
    srv = start_server(*args)
    gold = json.loads((GOLDEN_DIR / f"responses-{request.param}.json").read_text())["responses"]
    yield srv, gold
    srv.stop()


@pytest.mark.parametrize("name,method,path,body", CASES, ids=[c[0] for c in CASES])
def test_real_body_shapes(live, name: str, method: str, path: str, body: Any) -> None:
    srv, gold = live
    status, want = expected(name, gold)
    body = REQUEST_OVERRIDES.get(name, body)
    if isinstance(body, bytes):
        r = httpx.request(method, srv.url + path, content=body, timeout=120)
    else:
        r = httpx.request(method, srv.url + path, json=body, timeout=120)
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == "application/json; charset=utf-8"
    ours = r.json()
    if name == "GET /props":
        assert ours.pop("kvserve_cache")["cache_ram_budget_bytes"] > 0  # kvserve's extra keys
        assert ours.pop("kvserve_memory")["weights"] == "quant"
    if name in ("GET /slots", "GET /v1/models"):
        same_shape(want[0] if isinstance(want, list) else want, ours[0] if isinstance(ours, list) else ours)
    else:
        same_shape(want, ours)


def test_real_metrics_names(live) -> None:
    srv, gold = live
    r = httpx.get(srv.url + "/metrics", timeout=30)
    ours = [ln.rsplit(" ", 1)[0] for ln in r.text.splitlines() if "llamacpp:" in ln]
    assert ours == [ln.rsplit(" ", 1)[0] for ln in gold["GET /metrics"][1].splitlines()]
