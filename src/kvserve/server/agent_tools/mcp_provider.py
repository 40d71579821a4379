"""MCP servers' tools as ``/tools`` entries: a ``ToolProvider`` (registry.py) over ``kvserve.mcp.McpManager``.

Each tool a server listed at start-up is one entry named ``<server>_<tool>`` of type ``"mcp"``
(no write permission, no cwd, no streaming); its definition is the OpenAI function schema with
the server's ``inputSchema`` as ``parameters`` (``{}`` when it gave none). Invoking it sends
``tools/call`` with the request's ``params`` as the arguments; the answer is
``{"plain_text_response": ...}`` or ``{"error": ...}`` (HTTP 200 either way, as llama-server).

The manager's lifecycle: ``warm_up()`` before the server listens, ``shutdown()`` when it stops
(in-flight calls answer ``{"error": "cancelled"}`` at once instead of holding the shutdown).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kvserve.mcp import McpManager, McpTool


class McpToolEntry:
    type = "mcp"
    permission_write = False
    uses_cwd = False
    supports_stream = False

    def __init__(self, tool: McpTool, manager: McpManager) -> None:
        self.tool = tool
        self.manager = manager
        self.name = f"{tool.server}_{tool.name}"
        self.display_name = self.name

    def definition(self) -> dict[str, Any]:
        schema = self.tool.input_schema if isinstance(self.tool.input_schema, dict) else {}
        return {"type": "function",
                "function": {"name": self.name, "description": self.tool.description, "parameters": schema}}

    async def invoke(self, params: dict[str, Any],
                     emit: Callable[[str], bool] | None = None) -> dict[str, Any]:
        return await self.manager.call_tool(self.tool.server, self.tool.name, params)


class McpToolProvider:
    """The tools every configured MCP server listed at warm-up, in configuration order."""

    def __init__(self, manager: McpManager) -> None:
        self.manager = manager

    def tools(self) -> list[McpToolEntry]:
        return [McpToolEntry(t, self.manager) for t in self.manager.tools()]

    def close(self) -> None:
        """Nothing to release synchronously: ``McpManager.shutdown()`` runs on the event loop."""

