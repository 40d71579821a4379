"""The generation routes' POSTs skip FastAPI's routing stack (``server/fast_routes.py``) and answer
as the routed handlers did: results, errors, the pre-routing middleware's headers and checks."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.routing import APIRoute

from kvserve.server.routes_generate import GENERATION
from tests.compat.test_http_fake_engine import FakeEngine, client, sse_events


@pytest.fixture
def routed(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The paths FastAPI's router handled."""
    seen: list[str] = []
    handle = APIRoute.handle

    async def spy(self: APIRoute, scope: Any, receive: Any, send: Any) -> None:
        seen.append(scope["path"])
        await handle(self, scope, receive, send)

    monkeypatch.setattr(APIRoute, "handle", spy)
    return seen


def test_generation_posts_skip_the_router(routed: list[str]) -> None:
    c, eng = client(api_prefix="/api")
    r = c.post("/api/completion", json={"prompt": "hi", "n_predict": 3})
    assert r.status_code == 200 and r.json()["tokens_predicted"] == 3
    assert r.headers["Server"] == "llama.cpp"
    s = c.post("/api/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}],
                                                 "max_tokens": 2, "stream": True})
    assert s.status_code == 200 and sse_events(s.text)[-1] == "[DONE]"
    assert routed == []
    # everything else is routed as before, the generation paths' other methods included
    assert c.get("/api/health").status_code == 200
    g = c.get("/api/completion")
    assert g.status_code == 404 and g.json()["error"]["type"] == "not_found_error"
    assert routed == ["/api/health", "/api/completion"]
    assert len(eng.submitted) == 2


def test_every_generation_route_is_fast_and_documented(routed: list[str]) -> None:
    c, _ = client()
    for path, _, _, _, documented in GENERATION:
        r = c.post(path, content=b"{not json")
        assert r.status_code == 400, path
        assert r.json()["error"]["type"] == "invalid_request_error"
        assert (path in c.get("/openapi.json").json()["paths"]) is documented, path
    assert routed == []


def test_errors_are_the_routed_ones() -> None:
    c, _ = client()
    r = c.post("/completion", json={"prompt": "hi", "n_predict": "many"})
    assert r.status_code == 400 and "n_predict" in r.json()["error"]["message"]
    r = c.post("/v1/completions", json=[1, 2])
    assert r.status_code == 400 and "cannot use value()" in r.json()["error"]["message"]


def test_an_engine_failure_is_a_json_500_and_the_server_goes_on() -> None:
    class Broken(FakeEngine):
        fail = True

        def submit(self, req: Any, emit: Any) -> None:
            if self.fail:
                self.fail = False
                raise RuntimeError("boom")
            super().submit(req, emit)

    c, _ = client(Broken())
    r = c.post("/completion", json={"prompt": "hi", "n_predict": 2})
    assert r.status_code == 500 and r.json()["error"]["type"] == "server_error"
    assert "boom" not in r.text
    assert c.post("/completion", json={"prompt": "hi", "n_predict": 2}).status_code == 200


def test_api_key_and_loading_checks_still_apply() -> None:
    c, eng = client(api_keys=("k1",))
    assert c.post("/completion", json={"prompt": "hi"}).status_code == 401
    assert c.post("/completion", json={"prompt": "hi"}, headers={"Authorization": "Bearer k1"}).status_code == 200
    eng.ready = False
    assert c.post("/completion", json={"prompt": "hi"}, headers={"Authorization": "Bearer k1"}).status_code == 503
