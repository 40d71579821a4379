"""``GET /tools`` and ``POST /tools`` over a ``ToolRegistry`` (llama-server's ``server_tools`` handlers).

POST body: ``{"tool": NAME, "params": {...}, "stream": false}``. Before the call, ``params``' own
``cwd``, ``runtime`` and ``resp_type`` are dropped and set from the ``x-tool-cwd``, ``x-tool-runtime``
(else ``--tools-runtime``) and ``x-resp-type`` headers: the model cannot choose them. Answers:

  200  the tool's JSON (a tool-level failure is ``{"error": "..."}``)
  200  ``text/event-stream`` with ``"stream": true``: ``data: {"chunk": ...}`` events, then
       ``data: {"done": true}`` (``"error"`` added when the call failed)
  400  malformed body or parameter: ``{"code": 400, "message": ..., "type": "invalid_request_error"}``
  404  unknown tool, or a stream asked of a tool that cannot stream
  500  the call failed (e.g. an unusable runtime): ``{"code": 500, "message": ..., "type": "server_error"}``
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from kvserve.server.agent_tools.registry import Tool, ToolNotFound, ToolParamError, ToolRegistry
from kvserve.server.errors import INVALID_REQUEST, NOT_FOUND, SERVER, ApiError
from kvserve.server.jsonio import JSONResponse, dumps, json_type, parse_json

log = logging.getLogger("kvserve.tools")

_POOL = ThreadPoolExecutor(
    max_workers=16, thread_name_prefix="kvserve-tool"
)  # concurrent blocking tool calls
_RUNNING: set[asyncio.Task[None]] = set()  # streamed calls whose client may be gone (strong references)
_INJECTED = (("cwd", "x-tool-cwd"), ("runtime", "x-tool-runtime"), ("resp_type", "x-resp-type"))


def _flat_error(message: str, type_: str, code: int) -> Response:
    """``format_error_response`` as the tools handlers send it: not wrapped in ``error``."""
    return JSONResponse({"code": code, "message": message, "type": type_}, code)


def list_tools(registry: ToolRegistry) -> Response:
    return JSONResponse(registry.list())


def _parse(raw: bytes) -> tuple[str, dict[str, Any], bool]:
    try:
        body = parse_json(raw)
    except ApiError as e:
        raise ToolParamError(e.message) from None
    if not isinstance(body, dict):
        raise ToolParamError(f"[json.exception.type_error.304] cannot use at() with {json_type(body)}")
    if "tool" not in body:
        raise ToolParamError("[json.exception.out_of_range.403] key 'tool' not found")
    name = body["tool"]
    if not isinstance(name, str):
        raise ToolParamError(f"[json.exception.type_error.302] type must be string, but is {json_type(name)}")
    params = body.get("params", {})
    if params is None:
        params = {}
    if not isinstance(params, dict):
        raise ToolParamError(f"[json.exception.type_error.304] cannot use at() with {json_type(params)}")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise ToolParamError(
            f"[json.exception.type_error.302] type must be boolean, but is {json_type(stream)}"
        )
    return name, params, stream


def _inject(params: dict[str, Any], request: Request, registry: ToolRegistry) -> dict[str, Any]:
    out = {k: v for k, v in params.items() if k not in ("cwd", "runtime", "resp_type")}
    for key, header in _INJECTED:
        value = request.headers.get(header, "")
        if value:  # header bytes arrive as latin-1: a UTF-8 path is decoded back to what was sent
            out[key] = value.encode("latin-1").decode("utf-8", "replace")
    if "runtime" not in out and registry.default_runtime is not None:
        out["runtime"] = registry.default_runtime()
    return out


async def _invoke(tool: Tool, params: dict[str, Any], emit: Any) -> Any:
    if inspect.iscoroutinefunction(tool.invoke):
        return await tool.invoke(params, emit)
    # own threads: a tool may block for a minute and must not starve asyncio's default executor
    return await asyncio.get_running_loop().run_in_executor(
        _POOL, functools.partial(tool.invoke, params, emit)
    )


async def call_tool(request: Request, registry: ToolRegistry) -> Response:
    try:
        name, params, stream = _parse(await request.body())
        params = _inject(params, request, registry)
        tool = registry.find(name, stream)
    except ToolParamError as e:
        return _flat_error(str(e), INVALID_REQUEST, 400)
    except ToolNotFound as e:
        return JSONResponse({"error": {"message": str(e), "type": NOT_FOUND, "code": 404}}, 404)
    except Exception as e:  # noqa: BLE001 - e.g. --tools-runtime's container could not be respawned
        log.error("tool call failed: %s", e)
        return _flat_error(str(e), SERVER, 500)
    if stream:
        return StreamingResponse(_stream(tool, params), media_type="text/event-stream")
    try:
        result = await _invoke(tool, params, None)
    except ToolParamError as e:
        return _flat_error(str(e), INVALID_REQUEST, 400)
    except Exception as e:  # noqa: BLE001 - the tool's failure is the answer
        log.error("tool %s failed: %s", tool.name, e)
        return _flat_error(str(e) or type(e).__name__, SERVER, 500)
    return JSONResponse(result)


def _frame(obj: dict[str, Any]) -> bytes:
    return ("data: " + dumps(obj) + "\n\n").encode("utf-8", "replace")


async def _stream(tool: Tool, params: dict[str, Any]) -> AsyncIterator[bytes]:
    """Chunks as the tool emits them; the client going away makes ``emit`` return False."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    alive = True

    def emit(chunk: str) -> bool:
        if chunk and alive:
            try:
                loop.call_soon_threadsafe(queue.put_nowait, {"chunk": chunk})
            except RuntimeError:  # the event loop is gone (shutdown)
                return False
        return alive

    async def run() -> None:
        done: dict[str, Any] = {"done": True}
        try:
            await _invoke(tool, params, emit)
        except Exception as e:  # noqa: BLE001 - reported in the final event
            done["error"] = str(e) or type(e).__name__
        queue.put_nowait(done)

    task = asyncio.ensure_future(run())
    _RUNNING.add(task)
    task.add_done_callback(_RUNNING.discard)
    try:
        while True:
            event = await queue.get()
            yield _frame(event)
            if event.get("done"):
                break
    finally:
        alive = False  # a worker still running ends at its next chunk or its timeout
