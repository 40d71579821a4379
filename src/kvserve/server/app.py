"""The FastAPI app: llama-server's HTTP API over an ``EngineAPI``.

``create_app(engine, cfg)`` sets up the agent tools (``agent_tools.setup``; ``ToolSetupError`` stops
start-up), wires routes (under ``--api-prefix``), the Web UI, the pre-routing middleware
(CORS, 503 while loading, API key, ``Server: llama.cpp``), JSON error handlers (llama-server's
error body; unknown paths are a JSON 404) and the request-body documentation.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import Request
from starlette.responses import Response

import kvserve
from kvserve.mcp import McpManager
from kvserve.server import agent_tools, cors_proxy, routes_generate, routes_misc, sleep, vertex, webui
from kvserve.server.engine_api import EngineAPI
from kvserve.server.errors import ApiError, invalid, not_found_body
from kvserve.server.fast_routes import FastRoutes
from kvserve.server.jsonio import JSONResponse, error_response
from kvserve.server.middleware import LlamaMiddleware
from kvserve.server.schemas import install_openapi
from kvserve.server.settings import ServerSettings
from kvserve.server.sleep import SleepGate

log = logging.getLogger("kvserve.server")


def settings_for(engine: EngineAPI, cfg: Any) -> ServerSettings:
    if isinstance(cfg, ServerSettings):
        return cfg
    return ServerSettings.from_config(cfg, n_slots=getattr(engine, "n_slots", None))


def create_app(engine: EngineAPI, cfg: Any, mcp: McpManager | None = None) -> FastAPI:
    """``cfg``: a ``kvserve.config.ServerConfig`` (read through ``ServerSettings.from_config``)
    or a ``ServerSettings``. ``mcp``: the MCP servers, warmed up (by default a manager of the
    configured servers that has not looked for their tools yet)."""
    s = settings_for(engine, cfg)
    app = FastAPI(
        title="kvserve",
        version=kvserve.__version__,
        description="llama-server compatible HTTP API (native llama.cpp and OpenAI endpoints).",
        docs_url="/docs",
        redoc_url=None,
    )
    app.state.engine = engine
    app.state.settings = s
    app.state.t_start = time.time()
    app.state.mcp = mcp if mcp is not None else McpManager(s.mcp_servers)  # shut down by http_server
    # None: /tools answers 403; close() at shutdown
    app.state.agent_tools = agent_tools.setup(s, app.state.mcp)
    if s.mcp_proxy:  # the proxy's HTTP client, imported now rather than by its first request
        cors_proxy.client_module()

    # generation first: a request is routed by trying the routes in order, and no path of one
    # router matches the other's (tests/compat/test_http_endpoints.py)
    routers = [routes_generate.make_router(s.api_prefix), routes_misc.make_router(s.api_prefix)]
    for router in routers:
        app.include_router(router)
    if s.vertex is not None:  # before the Web UI: a --path mount must not shadow it
        paths = [r.path[len(s.api_prefix):] for router in routers for r in router.routes
                 if isinstance(r, APIRoute) and "{" not in r.path]
        vertex.install(app, s.api_prefix, s.vertex, paths)
    webui.install(app, s)  # last: a --path mount must not shadow the API

    @app.exception_handler(ApiError)
    async def on_api_error(request: Request, exc: ApiError) -> Response:
        if exc.code >= 500:
            log.warning("request failed: %d %s", exc.code, exc.type)
        return error_response(exc)

    @app.exception_handler(StarletteHTTPException)
    async def on_http_error(request: Request, exc: StarletteHTTPException) -> Response:
        if exc.status_code in (404, 405):
            return JSONResponse(not_found_body(), 404)
        return error_response(ApiError(str(exc.detail), code=exc.status_code,
                                       type="invalid_request_error" if exc.status_code < 500 else "server_error"))

    @app.exception_handler(RequestValidationError)
    async def on_validation_error(request: Request, exc: RequestValidationError) -> Response:
        return error_response(invalid(str(exc.errors()[0].get("msg", "invalid request")) if exc.errors()
                                      else "invalid request"))

    install_openapi(app)
    sleep.install(app, engine, s)
    # innermost: the generation routes' POSTs go from the sleep gate to their handlers
    app.add_middleware(FastRoutes, routes=routes_generate.generation_routes(s.api_prefix))
    app.add_middleware(SleepGate, engine=engine, settings=s, routes=app.routes)  # inside the API-key check
    app.add_middleware(LlamaMiddleware, settings=s, is_ready=lambda: bool(engine.ready))
    return app
