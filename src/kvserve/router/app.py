"""The router's HTTP API (llama-server's ``server_models_routes``).

Own routes: ``GET /health``, ``GET /props`` (the router's, or with ``?model=`` the model's),
``GET /models`` (``/v1/models``; ``?reload=1`` rescans ``--models-dir`` and re-reads ``--models-preset``), ``POST /models/load``,
``POST /models/unload``, ``GET /models/sse`` (status events), ``DELETE /models?model=``,
``POST /models`` (downloading: not supported, 501), and, as llama-server's router serves them
itself, ``GET/POST /tools`` (the built-in tools and MCP servers' tools of the router's own flags)
and ``GET/POST /cors-proxy``.

Every other API route of a single-model kvserve is proxied to the child serving the request's
model: ``model`` from the JSON body (POST) or the query (GET). A missing or unknown model, or one
not loaded when autoload is off (``--no-models-autoload``, or ``?autoload=false`` per request),
is llama-server's 400; with autoload the request waits while the model loads. The child's answer
(status, headers, streamed body) is passed through as it comes.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import httpx
from fastapi import FastAPI, Request
from fastapi.routing import APIRoute
from starlette.background import BackgroundTask
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response, StreamingResponse

from kvserve.router.catalog import catalog
from kvserve.router.pool import Instance, ModelPool, RouterError
from kvserve.router.preset import PresetError
from kvserve.server import routes_generate, routes_misc
from kvserve.server.agent_tools import ToolRegistry
from kvserve.server.errors import ApiError, not_found_body
from kvserve.server.jsonio import JSONResponse, error_response, read_object
from kvserve.server.middleware import LlamaMiddleware
from kvserve.server.settings import ServerSettings

log = logging.getLogger("kvserve.router")

# answered by the router itself (everything else a single-model server serves is proxied)
_OWN = {("GET", "/health"), ("GET", "/v1/health"), ("GET", "/props"), ("GET", "/models"), ("GET", "/v1/models"),
        ("GET", "/tools"), ("POST", "/tools"), ("GET", "/cors-proxy"), ("POST", "/cors-proxy")}
_HOP = {"host", "content-length", "connection", "keep-alive", "transfer-encoding", "te", "upgrade",
        "proxy-connection", "accept-encoding"}


def proxied_routes() -> list[tuple[str, str]]:
    """(method, path) of the single-model API, minus what the router answers itself."""
    out: list[tuple[str, str]] = []
    for router in (routes_misc.make_router(""), routes_generate.make_router("")):
        for r in router.routes:
            if isinstance(r, APIRoute):
                for m in sorted(r.methods or ()):
                    if m in ("GET", "POST") and (m, r.path) not in _OWN and (m, r.path) not in out:
                        out.append((m, r.path))
    return out


def _err(e: RouterError) -> Response:
    return error_response(ApiError(e.message, e.type, e.code))


class Router:
    def __init__(self, pool: ModelPool, s: ServerSettings, models_dir: str | None, models_max: int,
                 autoload: bool, models_preset: str | None = None) -> None:
        self.pool = pool
        self.s = s
        self.models_dir = models_dir
        self.models_preset = models_preset
        self.models_max = models_max
        self.autoload = autoload
        self.client = httpx.AsyncClient(timeout=httpx.Timeout(None, connect=10.0))

    def resolve(self, name: Any, autoload: bool) -> str:
        """llama-server's ``router_validate_model``: the model's name (``name`` may be an alias)."""
        if not isinstance(name, str) or not name:
            raise RouterError("model name is missing from the request")
        inst = self.pool.get(name)
        if inst is None:
            raise RouterError(f"model '{name}' not found")
        if not autoload and not inst.running:
            raise RouterError("model is not loaded")
        return inst.name

    def autoload_for(self, request: Request) -> bool:
        v = request.query_params.get("autoload")
        return self.autoload if not v else v in ("true", "1")

    async def proxy(self, request: Request, name: str, body: bytes | None) -> Response:
        autoload = self.autoload_for(request)
        inst = self.pool.instances[name]
        inst.in_flight += 1
        released = False

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                inst.in_flight -= 1
                inst.last_used = time.monotonic()

        try:
            if autoload and inst.status != "loaded":
                await self.pool.load(name)
                await self.pool.wait_loaded(name)
            elif inst.status != "loaded":
                await self.pool.wait_loaded(name)
            headers = [(k, v) for k, v in request.headers.items() if k.lower() not in _HOP]
            url = inst.url + request.url.path  # the child has the same --api-prefix
            if request.url.query:
                url += "?" + request.url.query
            req = self.client.build_request(request.method, url, headers=headers, content=body)
            upstream = await self.client.send(req, stream=True)
        except RouterError as e:
            release()
            return _err(e)
        except httpx.HTTPError as e:
            release()
            return error_response(ApiError(f"model '{name}' is not reachable: {type(e).__name__}", "unavailable_error", 503))
        except BaseException:
            release()
            raise

        async def close() -> None:
            await upstream.aclose()
            release()

        out_headers = {k: v for k, v in upstream.headers.items() if k.lower() not in _HOP}
        return StreamingResponse(upstream.aiter_raw(), upstream.status_code, out_headers,
                                 background=BackgroundTask(close))

    # -- own bodies -----------------------------------------------------------------------------
    def props(self) -> dict[str, Any]:
        return {
            "role": "router", "max_instances": self.models_max, "models_autoload": self.autoload,
            "model_alias": "llama-server", "model_path": "none",
            "default_generation_settings": {"params": {}, "n_ctx": 0},
            "ui_settings": self.s.ui_settings, "build_info": self.s.build_info,
            "cors_proxy_enabled": self.s.mcp_proxy,
        }

    def models(self) -> dict[str, Any]:
        t = int(time.time())
        data = []
        for inst in self.pool.instances.values():
            status: dict[str, Any] = {"value": inst.status, "args": inst.args}
            if inst.failed:
                status.update(exit_code=inst.exit_code, failed=True)
            status["preset"] = self.pool.preset_ini(inst.entry)
            data.append({
                "id": inst.name, "aliases": list(inst.entry.aliases), "tags": list(inst.entry.tags),
                "object": "model", "owned_by": "llamacpp", "created": t, "status": status,
                "architecture": {"input_modalities": ["text"], "output_modalities": ["text"]},
                "source": inst.entry.source, "can_remove": False, "path": inst.entry.path,
            })
        return {"data": data, "object": "list"}

    async def reload(self) -> None:
        """``?reload=1``: the models dir and preset file again. A running model that is gone or
        whose options changed is stopped first; new models appear unloaded. ValueError or
        PresetError when they cannot be read (the models stay as they were)."""
        entries = catalog(self.models_dir, self.models_preset)
        pool = self.pool
        for name, inst in list(pool.instances.items()):
            new = entries.get(name)
            if inst.running and (new is None or pool.child_options(new) != pool.child_options(inst.entry)):
                log.info("(reload) unloading model name=%s (source updated or removed)", name)
                await pool.unload(name, wait=True)
        for name in list(pool.instances):
            if name not in entries and not pool.instances[name].running:
                del pool.instances[name]
        for name, entry in entries.items():
            if name in pool.instances:
                pool.instances[name].entry = entry
            else:
                pool.instances[name] = Instance(entry)
        pool.notify("models_reload", "*", None)


def create_router_app(router: Router, agent_tools: ToolRegistry | None = None) -> FastAPI:
    """``agent_tools``: the registry ``/tools`` serves (None: 403, as without ``--tools``)."""
    s = router.s
    app = FastAPI(title="kvserve router", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.router = router
    app.state.settings = s
    app.state.agent_tools = agent_tools
    p = s.api_prefix
    app.add_api_route(p + "/tools", routes_generate.tools_endpoint, methods=["GET", "POST"])
    app.add_api_route(p + "/cors-proxy", routes_generate.cors_proxy_endpoint, methods=["GET", "POST"])

    @app.get(p + "/health")
    @app.get(p + "/v1/health")
    async def health() -> Response:
        return JSONResponse({"status": "ok"})

    @app.get(p + "/props")
    async def props(request: Request) -> Response:
        name = request.query_params.get("model", "")
        if not name:
            return JSONResponse(router.props())
        return await _proxy(request, name, None)

    @app.get(p + "/models")
    @app.get(p + "/v1/models")
    async def models(request: Request) -> Response:
        if request.query_params.get("reload"):
            try:
                await router.reload()
            except (ValueError, PresetError) as e:
                return error_response(ApiError(str(e), "server_error", 500))
        return JSONResponse(router.models())

    async def _model_of(request: Request) -> tuple[Any, Any]:
        body = await read_object(request)
        return body, body.get("model")

    @app.post(p + "/models/load")
    async def load(request: Request) -> Response:
        _, name = await _model_of(request)
        inst = router.pool.get(name) if isinstance(name, str) else None
        if inst is None:
            return error_response(ApiError("model is not found", "not_found_error", 404))
        if inst.running:
            return error_response(ApiError("model is already running"))
        try:
            await router.pool.load(inst.name)
        except RouterError as e:
            return _err(e)
        return JSONResponse({"success": True})

    @app.post(p + "/models/unload")
    async def unload(request: Request) -> Response:
        _, name = await _model_of(request)
        inst = router.pool.get(name) if isinstance(name, str) else None
        if inst is None:
            return error_response(ApiError("model is not found"))
        if not inst.running:
            return error_response(ApiError("model is not running"))
        await router.pool.unload(inst.name)
        return JSONResponse({"success": True})

    @app.get(p + "/models/sse")
    async def sse(request: Request) -> Response:
        q = router.pool.subscribe()

        async def events() -> Any:
            import json

            try:
                yield b": connected\n\n"
                while True:
                    try:
                        ev = await asyncio.wait_for(q.get(), 15)
                    except asyncio.TimeoutError:
                        yield b": ping\n\n"
                        continue
                    yield ("data: " + json.dumps(ev, separators=(",", ":")) + "\n\n").encode()
            finally:
                router.pool.unsubscribe(q)

        return StreamingResponse(events(), media_type="text/event-stream")

    @app.post(p + "/models")
    async def download(request: Request) -> Response:
        body, name = await _model_of(request)
        if not isinstance(name, str) or not name:
            return error_response(ApiError("model must be a non-empty string"))
        return error_response(ApiError(
            "downloading models is not supported: kvserve never downloads; put the GGUF file in --models-dir",
            "not_supported_error", 501))

    @app.delete(p + "/models")
    async def delete(request: Request) -> Response:
        name = request.query_params.get("model", "")
        if not name:
            return error_response(ApiError("model must be a non-empty string"))
        inst = router.pool.get(name)
        if inst is None:
            return error_response(ApiError(f"model name={name} is not found", "not_found_error", 404))
        return error_response(ApiError(f"model name={name} is not removable (not from cache)"))

    async def _proxy(request: Request, name: Any, body: bytes | None) -> Response:
        try:
            resolved = router.resolve(name, router.autoload_for(request))
        except RouterError as e:
            return _err(e)
        return await router.proxy(request, resolved, body)

    def make_get() -> Any:
        async def proxy_get(request: Request) -> Response:
            return await _proxy(request, request.query_params.get("model", ""), None)
        return proxy_get

    def make_post() -> Any:
        async def proxy_post(request: Request) -> Response:
            raw = await request.body()
            body = await read_object(request) if raw.strip() else {}
            return await _proxy(request, body.get("model", ""), raw)
        return proxy_post

    for method, path in proxied_routes():
        app.add_api_route(p + path, make_get() if method == "GET" else make_post(), methods=[method])

    @app.exception_handler(ApiError)
    async def on_api_error(request: Request, exc: ApiError) -> Response:
        return error_response(exc)

    @app.exception_handler(StarletteHTTPException)
    async def on_http_error(request: Request, exc: StarletteHTTPException) -> Response:
        return JSONResponse(not_found_body(), 404)

    app.add_middleware(LlamaMiddleware, settings=s, is_ready=lambda: True)
    return app
