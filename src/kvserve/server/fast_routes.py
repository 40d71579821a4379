"""The generation routes answered without FastAPI's routing stack.

A ``POST`` to one of the routes that run the model goes through the app's outer layers as every
request does (the pre-routing middleware: CORS, loading, API key; the sleep gate), then straight
to its handler: no exception middleware, exit stack, route matching over every route, endpoint
wrappers or dependency solving: a quarter of the HTTP side's Python for a burst's request
before it (bench/http_intake.py, docs/benchmarks.md). The handler and its response are the
route's own (the same function FastAPI would call); its ``ApiError`` becomes the error response of
the app's handler, anything else goes on to the pre-routing middleware's 500, as from FastAPI.
The routes stay registered with FastAPI (the API description, other methods' 404).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from kvserve.server.errors import ApiError
from kvserve.server.jsonio import error_response

log = logging.getLogger("kvserve.server")

Handler = Callable[[Request], Awaitable[Response]]


class FastRoutes:
    """``routes``: full path (with the API prefix) -> the handler of its ``POST``."""

    def __init__(self, app: ASGIApp, routes: dict[str, Handler]) -> None:
        self.app = app
        self.routes = routes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        handler = self.routes.get(scope.get("path", "")) if scope["type"] == "http" else None
        if handler is None or scope.get("method") != "POST":
            await self.app(scope, receive, send)
            return
        try:
            response = await handler(Request(scope, receive, send))
        except ApiError as exc:
            if exc.code >= 500:
                log.warning("request failed: %d %s", exc.code, exc.type)
            response = error_response(exc)
        await response(scope, receive, send)
