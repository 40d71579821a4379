"""``/cors-proxy`` (``--ui-mcp-proxy``, ``-ag``) against a local HTTP server that records what it gets."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from kvserve.config import load_config
from kvserve.server.settings import ServerSettings

from .test_http_fake_engine import client

KEY = "sk-test"


class Target(BaseHTTPRequestHandler):
    def _answer(self) -> None:
        n = int(self.headers.get("Content-Length") or 0)
        self.server.seen.append((self.command, self.path, dict(self.headers), self.rfile.read(n)))  # type: ignore[attr-defined]
        if self.path.startswith("/empty"):
            self.send_response(204)
            self.end_headers()
            return
        if self.path.startswith("/moved"):
            self.send_response(302)
            self.send_header("Location", "/data?from=moved")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        body = json.dumps({"path": self.path}).encode()
        self.send_response(201 if self.command == "POST" else 200)
        self.send_header("Content-Type", "application/json")
        self.send_header("X-Target", "yes")
        self.send_header("Access-Control-Allow-Origin", "https://target.example")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _answer

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture()
def target() -> Iterator[ThreadingHTTPServer]:
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Target)
    srv.seen = []  # type: ignore[attr-defined]
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield srv
    srv.shutdown()
    srv.server_close()


def _proxy_client(*argv: str) -> Any:
    cfg = load_config(list(argv), {}, warn=lambda m: None)
    s = ServerSettings.from_config(cfg)
    c, _ = client(api_keys=s.api_keys, mcp_proxy=s.mcp_proxy)
    return c


def test_only_headers_named_explicitly_are_forwarded(target: ThreadingHTTPServer) -> None:
    c = _proxy_client("--ui-mcp-proxy", "--api-key", KEY)
    url = f"http://127.0.0.1:{target.server_port}/capture?q=1"
    r = c.get("/cors-proxy", params={"url": url}, headers={
        "Authorization": f"Bearer {KEY}", "Proxy-Authorization": "Basic secret", "X-Api-Key": KEY,
        "Cookie": "session=secret", "x-llama-server-proxy-header-accept": "application/json",
        "x-llama-server-proxy-header-authorization": "Bearer explicit",
    })
    assert r.status_code == 200 and r.json() == {"path": "/capture?q=1"}
    assert r.headers["x-target"] == "yes"
    assert r.headers.get("access-control-allow-origin") != "https://target.example"  # the target's CORS is dropped
    (method, path, headers, _), = target.seen  # type: ignore[attr-defined]
    got = {k.lower(): v for k, v in headers.items()}
    assert method == "GET" and got["accept"] == "application/json" and got["authorization"] == "Bearer explicit"
    assert not {"proxy-authorization", "x-api-key", "cookie"} & set(got)
    assert c.get("/cors-proxy", params={"url": url}).status_code == 401  # this server's own API key still applies


def test_post_body_status_redirects_and_empty_answers(target: ThreadingHTTPServer) -> None:
    c = _proxy_client("-ag")
    base = f"http://127.0.0.1:{target.server_port}"
    r = c.post("/cors-proxy", params={"url": base + "/rpc"}, content=b'{"jsonrpc":"2.0"}',
               headers={"x-llama-server-proxy-header-content-type": "application/json"})
    assert r.status_code == 201 and r.json() == {"path": "/rpc"}
    method, _, headers, body = target.seen[-1]  # type: ignore[attr-defined]
    assert method == "POST" and body == b'{"jsonrpc":"2.0"}' and headers["content-type"] == "application/json"
    r = c.post("/cors-proxy", params={"url": base + "/empty"}, json={})
    assert r.status_code == 204 and r.content == b""
    r = c.get("/cors-proxy", params={"url": base + "/moved"})
    assert r.status_code == 200 and r.json() == {"path": "/data?from=moved"}
    r = c.get("/cors-proxy", params={"url": base})  # no path: "/"
    assert r.json() == {"path": "/"}


@pytest.mark.parametrize("url, message", [
    (None, "missing url"),
    ("example.com/x", "no scheme"),
    ("ftp://example.com/x", "unsupported URL scheme"),
    ("http:///x", "missing host"),
    ("http://user:pw@127.0.0.1/x", "authentication in target URL"),
    ("http://127.0.0.1:notaport/x", "invalid target URL"),
])
def test_bad_target_urls_are_400(url: str | None, message: str) -> None:
    c = _proxy_client("--ui-mcp-proxy")
    r = c.get("/cors-proxy", params={} if url is None else {"url": url})
    assert r.status_code == 400 and message in r.json()["error"]["message"]


def test_unreachable_target_is_a_502_not_a_hang() -> None:
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    r = _proxy_client("--ui-mcp-proxy").get("/cors-proxy", params={"url": f"http://127.0.0.1:{port}/"})
    assert r.status_code == 502 and r.json()["error"]["message"].startswith("proxy error")


def test_props_and_flags() -> None:
    assert load_config(["--ui-mcp-proxy"], {}, warn=lambda m: None).server.mcp_proxy
    assert load_config(["-ag"], {}, warn=lambda m: None).server.mcp_proxy
    assert not load_config([], {}, warn=lambda m: None).server.mcp_proxy
    warned: list[str] = []
    load_config(["--ui-mcp-proxy"], {}, warn=warned.append)
    assert not any("proxy" in w for w in warned)
    c = _proxy_client("--ui-mcp-proxy")
    assert c.get("/props").json()["cors_proxy_enabled"] is True
    assert _proxy_client().get("/props").json()["cors_proxy_enabled"] is False


@pytest.mark.parametrize("enabled", [True, False])
def test_the_proxy_client_is_imported_at_start_only_when_enabled(enabled: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """A server without the proxy does not import its HTTP client (tests/unit/test_lazy_imports.py);
    one with it imports it when the app is built, not on the first proxied request."""
    from kvserve.server import cors_proxy

    calls: list[int] = []
    real = cors_proxy.client_module
    monkeypatch.setattr(cors_proxy, "client_module", lambda: calls.append(1) or real())
    client(mcp_proxy=enabled)
    assert calls == ([1] if enabled else [])
