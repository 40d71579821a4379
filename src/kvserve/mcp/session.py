"""The MCP client side of one server: the ``initialize`` handshake, ``tools/list`` and
``tools/call``, and the ``/tools`` result shape a call is answered with.

``initialize`` runs once per process (the first request after a spawn; callers that arrive
meanwhile wait for it), announcing protocol version 2024-11-05, then sends
``notifications/initialized``. A failed handshake is retried by the next call. Every request
has the server's ``timeout_ms`` (at most until the caller's deadline).

A call's answer (HTTP 200 either way, as llama-server's ``POST /tools``): the text parts of
``result.content`` joined by newlines as ``{"plain_text_response": TEXT}``, or ``{"error": MSG}``
for an error reply, an ``isError`` result, a timeout or a closed transport.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, NamedTuple

from kvserve.mcp.stdio import RpcError, StdioTransport

PROTOCOL_VERSION = "2024-11-05"
CLIENT_INFO = {"name": "kvserve", "version": "1.0"}


class McpTool(NamedTuple):
    server: str
    name: str  # the server's own name for it (exposed as "<server>_<name>")
    description: str
    input_schema: Any  # JSON Schema of the arguments, or None


def call_response(result: Any) -> dict[str, Any]:
    """A ``tools/call`` result as the ``/tools`` answer."""
    texts: list[str] = []
    if isinstance(result, dict) and isinstance(result.get("content"), list):
        for part in result["content"]:
            if isinstance(part, dict) and part.get("type") == "text":
                texts.append(str(part.get("text", "")))
    text = "\n".join(texts)
    if isinstance(result, dict) and result.get("isError") is True:
        return {"error": text or "MCP tool returned an error"}
    return {"plain_text_response": text}


def _tools(result: Any, server: str) -> list[McpTool]:
    tools = result.get("tools") if isinstance(result, dict) else None
    out: list[McpTool] = []
    for t in tools if isinstance(tools, list) else []:
        if isinstance(t, dict) and isinstance(t.get("name"), str) and t["name"]:
            desc = t.get("description")
            desc = desc if isinstance(desc, str) else ""
            out.append(McpTool(server, t["name"], desc, t.get("inputSchema")))
    return out


class McpSession:
    def __init__(self, transport: StdioTransport, timeout_s: float) -> None:
        self.transport = transport
        self.timeout_s = timeout_s
        self._init_lock = asyncio.Lock()
        self._initialized = False

    def _timeout(self, deadline: float | None) -> float:
        if deadline is None:
            return self.timeout_s
        return min(self.timeout_s, deadline - time.monotonic())

    async def initialize(self, deadline: float | None = None) -> None:
        """Raises ``RpcError`` ("initialize failed: ...")."""
        async with self._init_lock:
            if self._initialized:
                return
            params = {"protocolVersion": PROTOCOL_VERSION, "capabilities": {}, "clientInfo": CLIENT_INFO}
            try:
                await self.transport.request("initialize", params, self._timeout(deadline))
                await self.transport.notify("notifications/initialized")
            except RpcError as e:
                raise RpcError(f"initialize failed: {e.message}") from None
            self._initialized = True

    async def list_tools(self, deadline: float | None = None) -> list[McpTool]:
        """Raises ``RpcError``."""
        await self.initialize(deadline)
        try:
            result = await self.transport.request("tools/list", None, self._timeout(deadline))
        except RpcError as e:
            raise RpcError(f"tools/list failed: {e.message}") from None
        return _tools(result, self.transport.name)

    async def call_tool(self, name: str, arguments: Any) -> dict[str, Any]:
        try:
            await self.initialize()
            result = await self.transport.request(
                "tools/call", {"name": name, "arguments": arguments}, self.timeout_s)
        except RpcError as e:
            return {"error": e.message}
        return call_response(result)
