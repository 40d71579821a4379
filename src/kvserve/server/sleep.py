"""The HTTP side of ``--sleep-idle-seconds`` (spec §2.12; the engine side is engine/sleeper.py).

As llama-server: ``/health``, ``GET /props`` (``is_sleeping: true``), ``/models`` and
``/metrics`` answer a sleeping server without waking it (``/props`` and ``/models`` from the
bodies taken on entering sleep); every other API request wakes it first and waits for the
reload. The web UI's static files, the OpenAPI docs and CORS preflights never wake it.

``SleepGate`` is an ASGI middleware inside the API-key check (a refused request does not
wake the model). It brackets each request that needs the model with the engine's
``begin_request``/``end_request``, so the idle timer runs only while nothing is in flight
(a streamed answer is in flight until its last byte).
"""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi.routing import APIRoute
from starlette.routing import Match
from starlette.types import ASGIApp, Receive, Scope, Send

from kvserve.server import info
from kvserve.server.settings import ServerSettings

# answered from what was kept while sleeping (relative to --api-prefix)
READ_ONLY = {("GET", "/health"), ("GET", "/v1/health"), ("GET", "/props"), ("GET", "/models"),
             ("GET", "/v1/models"), ("GET", "/metrics")}


def sleeping(engine: Any) -> bool:
    return bool(getattr(engine, "is_sleeping", False))


def install(app: Any, engine: Any, s: ServerSettings) -> None:
    """For an engine that can sleep: keep the /props and /models bodies on entering sleep."""
    hooks = getattr(engine, "on_sleep", None)
    if hooks is None:
        return
    app.state.sleep_bodies = {}

    def keep() -> None:
        props = info.props_body(engine, s)
        props["is_sleeping"] = True
        props["kvserve_memory"] = {"weights": "unloaded", "weight_bytes": 0, "kv_pool_pages": 0,
                                   "kv_pool_bytes": 0}
        props.pop("kvserve_cache", None)
        app.state.sleep_bodies = {"props": props, "models": info.models_body(engine, s)}

    hooks.append(keep)


class SleepGate:
    def __init__(self, app: ASGIApp, engine: Any, settings: ServerSettings, routes: Any) -> None:
        self.app = app
        self.engine = engine
        self.prefix = settings.api_prefix
        self.routes = routes  # the application's routes (read at request time: some are added late)

    def _needs_model(self, scope: Scope) -> bool:
        method = scope.get("method", "GET")
        if method == "OPTIONS":
            return False
        path: str = scope.get("path", "")
        rel = path[len(self.prefix):] if self.prefix and path.startswith(self.prefix) else path
        if (method, rel) in READ_ONLY:
            return False
        if method in ("GET", "HEAD"):  # static files and docs are not API routes
            return any(isinstance(r, APIRoute) and r.matches(scope)[0] == Match.FULL for r in self.routes)
        return True

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        begin = getattr(self.engine, "begin_request", None)
        if scope["type"] != "http" or begin is None or not self._needs_model(scope):
            await self.app(scope, receive, send)
            return
        await asyncio.to_thread(begin)
        try:
            await self.app(scope, receive, send)
        finally:
            self.engine.end_request()
