"""Several --api-key values: requests are authenticated, and caches never cross keys."""

from __future__ import annotations

import httpx
import pytest

from .live import start_server


@pytest.fixture(scope="module")
def server():
    srv = start_server("-np", "2", "-c", "2048", "--api-key", "key-one,key-two")
    yield srv
    srv.stop()


def _complete(server, key, prompt):
    r = httpx.post(
        server.url + "/completion",
        json={"prompt": prompt, "n_predict": 2, "temperature": 0},
        headers={"Authorization": f"Bearer {key}"},
        timeout=120,
    )
    return r


def test_auth_required_but_health_public(server):
    assert httpx.get(server.url + "/health", timeout=30).status_code == 200
    r = httpx.post(server.url + "/completion", json={"prompt": "x"}, timeout=30)
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
    r = httpx.get(server.url + "/slots", headers={"X-Api-Key": "key-two"}, timeout=30)
    assert r.status_code == 200


def test_prompt_cache_is_per_tenant(server):
    prompt = "A shared system prompt that both tenants send, long enough to span pages. " * 4
    first = _complete(server, "key-one", prompt).json()
    second = _complete(server, "key-one", prompt).json()
    other = _complete(server, "key-two", prompt).json()
    assert first["timings"]["cache_n"] == 0
    assert second["timings"]["cache_n"] == second["tokens_evaluated"] - 1
    assert other["timings"]["cache_n"] == 0
    assert first["content"] == other["content"]
