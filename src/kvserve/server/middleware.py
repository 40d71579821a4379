"""llama-server's pre-routing handler as one pure ASGI middleware (streaming-safe).

Order (``server-http.cpp``):
1. CORS: ``Access-Control-Allow-Origin`` on every response. ``--cors-origins *`` with
   credentials echoes the request's Origin (empty when none); ``localhost`` echoes only
   localhost/127.0.0.1/::1 origins (else no header); anything else is sent verbatim.
2. OPTIONS (any path): 200, empty text/html body, Allow-Credentials/-Methods/-Headers. No auth.
3. Not ready: 503 ``Loading model`` for everything but the UI's front-end paths, ``/health``
   included.
4. API key (when keys are configured): ``Authorization: Bearer <k>`` (or ``X-Api-Key`` when
   Authorization is empty); ``/health``, ``/v1/health`` and the front-end paths are public; else 401.
Every response carries ``Server: llama.cpp``. An unhandled exception becomes a 500 JSON error.
Header names go out capitalized as llama-server (cpp-httplib) writes them (``Content-Type``,
``Access-Control-Allow-Origin``, ``Process-Start-Time-Unix``): some clients compare them exactly.
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Callable
from urllib.parse import urlsplit

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from kvserve.server.errors import auth_body, loading_body
from kvserve.server.http_wire import canonical_header
from kvserve.server.jsonio import JSON_CONTENT_TYPE, dumps
from kvserve.server.settings import ServerSettings
from kvserve.server.webui import frontend_paths

log = logging.getLogger("kvserve.server")

_LOCALHOSTS = ("localhost", "127.0.0.1", "::1")
# Served without auth and while loading (besides /health): the API description.
_DOC_PATHS = ("/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc")


class LlamaMiddleware:
    def __init__(self, app: ASGIApp, settings: ServerSettings, is_ready: Callable[[], bool]):
        self.app = app
        self.s = settings
        self.is_ready = is_ready
        p = settings.api_prefix
        self.public = {p + "/health", p + "/v1/health"}
        # answered while loading and without a key: the API description and the UI's files
        self.docs = set(_DOC_PATHS) | frontend_paths(p)

    def allow_origin(self, origin: str) -> str | None:
        s = self.s
        if s.cors_origins == "*" and s.cors_credentials:
            return origin
        if s.cors_origins == "localhost":
            try:
                host = urlsplit(origin).hostname
            except ValueError:
                host = None
            if host in _LOCALHOSTS:
                return origin
            if origin:
                log.warning("CORS: origin not allowed (cors-origins=localhost)")
            return None
        return s.cors_origins

    def api_key(self, headers: dict[bytes, bytes]) -> str:
        value = headers.get(b"authorization", b"").decode("latin-1")
        if not value:
            value = headers.get(b"x-api-key", b"").decode("latin-1")
        value = value.removeprefix("Bearer ")
        return value

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.lower(): v for k, v in scope.get("headers", [])}
        origin = headers.get(b"origin", b"").decode("latin-1")
        acao = self.allow_origin(origin)
        extra: list[tuple[bytes, bytes]] = [(b"server", b"llama.cpp")]
        if acao is not None:
            extra.append((b"access-control-allow-origin", acao.encode("latin-1", "replace")))
        started = False

        async def send_with_headers(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                drop = {b"server", b"access-control-allow-origin"}
                hs = [(k, v) for k, v in message.get("headers", []) if k.lower() not in drop]
                message = {**message, "headers": [(canonical_header(k), v) for k, v in hs + extra]}
            await send(message)

        async def reply(status: int, body: bytes, content_type: str,
                        more: list[tuple[bytes, bytes]] | None = None) -> None:
            hs = [(b"content-type", content_type.encode()), (b"content-length", str(len(body)).encode())]
            await send_with_headers({"type": "http.response.start", "status": status, "headers": hs + (more or [])})
            await send_with_headers({"type": "http.response.body", "body": body})

        path = scope.get("path", "")
        if scope.get("method") == "OPTIONS":
            s = self.s
            await reply(200, b"", "text/html", [
                (b"access-control-allow-credentials", b"true" if s.cors_credentials else b"false"),
                (b"access-control-allow-methods", s.cors_methods.encode("latin-1", "replace")),
                (b"access-control-allow-headers", s.cors_headers.encode("latin-1", "replace")),
            ])
            return
        if path not in self.docs and not self.is_ready():
            await reply(503, dumps(loading_body()).encode(), JSON_CONTENT_TYPE)
            return
        if self.s.api_keys and path not in self.public and path not in self.docs:
            key = self.api_key(headers)
            if not any(hmac.compare_digest(key.encode(), k.encode()) for k in self.s.api_keys):
                await reply(401, dumps(auth_body()).encode(), JSON_CONTENT_TYPE)
                return
            scope.setdefault("state", {})["api_key"] = key
        try:
            await self.app(scope, receive, send_with_headers)
        except Exception:
            log.exception("unhandled error on %s", path)
            if not started:
                body = {"error": {"code": 500, "message": "Internal Server Error", "type": "server_error"}}
                await reply(500, dumps(body).encode(), JSON_CONTENT_TYPE)
