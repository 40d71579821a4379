"""A client that goes away makes the server cancel its engine requests (stream and non-stream).

Driven through raw ASGI so the disconnect can happen mid-response."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from kvserve.server import dispatch
from kvserve.server.app import create_app
from tests.compat.test_http_fake_engine import FakeEngine, settings


async def call(app: Any, path: str, body: dict[str, Any], *, gone_after_chunks: int | None = None,
               gone_after_s: float | None = None) -> list[dict[str, Any]]:
    scope = {
        "type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
        "method": "POST", "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"",
        "root_path": "", "headers": [(b"content-type", b"application/json"), (b"host", b"test")],
        "client": ("127.0.0.1", 5000), "server": ("127.0.0.1", 8080),
    }
    gone = asyncio.Event()
    sent: list[dict[str, Any]] = []
    first = True

    async def receive() -> dict[str, Any]:
        nonlocal first
        if first:
            first = False
            return {"type": "http.request", "body": json.dumps(body).encode(), "more_body": False}
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(msg: dict[str, Any]) -> None:
        sent.append(msg)
        chunks = [m for m in sent if m["type"] == "http.response.body" and m.get("body")]
        if gone_after_chunks is not None and len(chunks) >= gone_after_chunks:
            gone.set()

    if gone_after_s is not None:
        asyncio.get_running_loop().call_later(gone_after_s, gone.set)
    await asyncio.wait_for(app(scope, receive, send), 10)
    return sent


def run(coro: Any) -> Any:
    return asyncio.run(coro)


@pytest.mark.parametrize("path,body", [
    ("/completion", {"prompt": "x"}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}]}),
])
def test_stream_disconnect_cancels(path: str, body: dict[str, Any]) -> None:
    eng = FakeEngine(endless=True, delay=0.01)
    app = create_app(eng, settings())
    run(call(app, path, {**body, "stream": True}, gone_after_chunks=3))
    ids = [r.id for r in eng.submitted]
    assert ids and set(ids) <= eng.cancelled


def test_stream_disconnect_cancels_all_fanned_out_requests() -> None:
    eng = FakeEngine(endless=True, delay=0.01)
    app = create_app(eng, settings())
    run(call(app, "/completion", {"prompt": ["a", "b"], "n": 2, "stream": True}, gone_after_chunks=2))
    assert len(eng.submitted) == 4 and {r.id for r in eng.submitted} <= eng.cancelled


def test_non_stream_disconnect_cancels(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dispatch, "POLL_S", 0.05)
    eng = FakeEngine(endless=True, delay=0.01)
    app = create_app(eng, settings())
    run(call(app, "/v1/completions", {"prompt": "x"}, gone_after_s=0.2))
    assert eng.submitted and {r.id for r in eng.submitted} <= eng.cancelled


def test_finished_requests_are_not_cancelled() -> None:
    eng = FakeEngine()
    app = create_app(eng, settings())
    sent = run(call(app, "/completion", {"prompt": "x", "n_predict": 2, "stream": True}))
    assert sent[0]["status"] == 200
    run(call(app, "/completion", {"prompt": "x", "n_predict": 2}))
    assert eng.cancelled == set()


def test_error_cancels_siblings() -> None:
    eng = FakeEngine(endless=True, delay=0.01, n_ctx_slot=8)
    app = create_app(eng, settings())
    # the second prompt overflows the context: its error ends the request and cancels the first
    sent = run(call(app, "/completion", {"prompt": ["a", "x" * 20]}))
    assert sent[0]["status"] == 400
    first = next(r for r in eng.submitted if r.index == 0)
    assert first.id in eng.cancelled
