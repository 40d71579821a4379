"""Vertex AI prediction (llama-server's ``register_gcp_compat``), on with ``AIP_MODE=PREDICTION``.

Environment (read at start-up): ``AIP_HTTP_PORT`` (default 8080) replaces ``--port``;
``AIP_PREDICT_ROUTE`` (default ``/predict``) is the predict route; ``AIP_HEALTH_ROUTE``, when
set, also answers like ``/health``. A route without a leading slash gets one.

``POST <predict route>`` takes ``{"instances": [...]}`` (at most 128). Each instance is the body of
another route, named by ``@requestFormat``: the route's camelCase alias (``/v1/chat/completions`` ->
``chatCompletions``, ``/apply-template`` -> ``applyTemplate``) or its path. The instances run
concurrently, never streamed, and the answer is ``{"predictions": [...]}`` with each route's JSON
body in order (an error body for an instance that failed; the HTTP status stays 200).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import Response

from kvserve.server.errors import SERVER, ApiError, invalid
from kvserve.server.jsonio import JSONResponse, dumps, parse_json

log = logging.getLogger("kvserve.server")
MAX_INSTANCES = 128


@dataclass(frozen=True)
class VertexSettings:
    predict_route: str = "/predict"
    health_route: str = ""  # "": only the usual /health
    http_port: int = 8080


def _route_env(env: Mapping[str, str], name: str, default: str) -> str:
    v = env.get(name, "")
    if not v:
        return default
    return v if v.startswith("/") else "/" + v


def from_env(env: Mapping[str, str] | None = None) -> VertexSettings | None:
    """The Vertex AI settings when ``AIP_MODE=PREDICTION``, else None."""
    env = os.environ if env is None else env
    if env.get("AIP_MODE", "") != "PREDICTION":
        return None
    raw_port = env.get("AIP_HTTP_PORT", "") or "8080"
    try:
        port = int(raw_port)
    except ValueError:
        raise ValueError(f"AIP_HTTP_PORT is not a port number: {raw_port!r}") from None
    return VertexSettings(_route_env(env, "AIP_PREDICT_ROUTE", "/predict"),
                          _route_env(env, "AIP_HEALTH_ROUTE", ""), port)


def format_alias(path: str) -> str:
    """``/v1/chat/completions`` -> ``chatCompletions`` (a leading ``/v1`` dropped, separators
    ``/ - _`` capitalise the next letter, path parameters cut)."""
    s = path[3:] if len(path) > 3 and path.startswith("/v1") else path
    s = s[1:] if s.startswith("/") else s
    out: list[str] = []
    cap = False
    for c in s:
        if c in ":{":
            break
        if c in "/-_":
            cap = True
        else:
            out.append(c.upper() if cap else c)
            cap = False
    return "".join(out)


def _error(message: str, type_: str = "invalid_request_error") -> dict[str, Any]:
    return ApiError(message, type_).body()


class _Predict:
    """Runs each instance as an internal request through the whole app (its checks, its errors)."""

    def __init__(self, app: Any, prefix: str, paths: list[str]):
        self.app = app
        self.prefix = prefix
        self.paths = set(paths)
        self.aliases: dict[str, str] = {}
        for path in paths:  # the first registration wins, as in llama-server
            self.aliases.setdefault(format_alias(path), path)

    async def one(self, outer: Request, instance: Any) -> Any:
        if not isinstance(instance, dict):
            return _error("each instance must be a JSON object")
        fmt = instance.get("@requestFormat")
        if not isinstance(fmt, str):
            return _error("each instance must include a string @requestFormat")
        payload = {k: v for k, v in instance.items() if k != "@requestFormat"}
        if "stream" in payload:
            if payload["stream"] not in (False, None):
                log.warning("predict route: the instance's stream field is ignored (no streaming here)")
            payload["stream"] = False
        path = self.aliases.get(fmt, fmt)
        if path not in self.paths:
            return _error("no handler registered for @requestFormat: " + fmt)
        try:
            status, body = await self.call(outer, "POST", self.prefix + path, dumps(payload).encode())
        except Exception as e:  # noqa: BLE001 - one instance failing must not fail the others
            log.warning("predict instance failed: %s", e)
            return ApiError(str(e) or type(e).__name__, SERVER).body()
        if not body:
            return None
        try:
            return parse_json(body)
        except ApiError:
            return body.decode("utf-8", "replace")

    async def call(self, outer: Request, method: str, path: str, body: bytes = b"") -> tuple[int, bytes]:
        """``method path`` with ``body`` inside the app, with the outer request's headers:
        (status, response body)."""
        scope = dict(outer.scope)
        scope.update(path=path, raw_path=path.encode(), method=method, query_string=b"", root_path="")
        scope["headers"] = [(k, v) for k, v in outer.scope.get("headers", [])
                            if k not in (b"content-length", b"content-type", b"accept")] + [
            (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        sent = False
        chunks: list[bytes] = []
        streamed = False

        async def receive() -> Any:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await outer.receive()  # a disconnect of the real client

        status = 500

        async def send(message: Any) -> None:
            nonlocal streamed, status
            if message["type"] == "http.response.start":
                status = int(message["status"])
                headers = dict(message.get("headers", []))
                streamed = headers.get(b"content-type", b"").startswith(b"text/event-stream")
            elif message["type"] == "http.response.body":
                chunks.append(message.get("body", b""))

        await self.app(scope, receive, send)
        if streamed:
            raise ValueError("predict route does not support streaming responses")
        return status, b"".join(chunks)


def install(app: FastAPI, prefix: str, vs: VertexSettings, paths: list[str]) -> None:
    """Add the predict route (and the health alias). ``paths``: the API routes (without the
    prefix) an instance may name."""
    if vs.predict_route in paths:
        raise ValueError(f"AIP_PREDICT_ROUTE={vs.predict_route} conflicts with an existing route")
    predictor = _Predict(app, prefix, paths)

    async def predict(request: Request) -> Response:
        """Vertex AI: ``{"instances": [{"@requestFormat": "chatCompletions", ...}]}`` -> predictions."""
        data = parse_json(await request.body())
        if not isinstance(data, dict):
            raise invalid("request body must be a JSON object")
        instances = data.get("instances")
        if not isinstance(instances, list):
            raise invalid("request body must include an array field named instances")
        if len(instances) > MAX_INSTANCES:
            raise invalid(f"instances array exceeds maximum size of {MAX_INSTANCES}")
        predictions = await asyncio.gather(*(predictor.one(request, i) for i in instances))
        return JSONResponse({"predictions": list(predictions)})

    app.add_api_route(prefix + vs.predict_route, predict, methods=["POST"], tags=["Vertex AI"])
    if vs.health_route:
        async def health(request: Request) -> Response:
            """``AIP_HEALTH_ROUTE``: answers as ``/health``."""
            status, body = await predictor.call(request, "GET", prefix + "/health")
            return Response(body, status, media_type="application/json; charset=utf-8")

        app.add_api_route(prefix + vs.health_route, health, methods=["GET"], include_in_schema=False)
