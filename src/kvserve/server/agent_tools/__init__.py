"""Agent tools (``--tools``, MCP servers): ``GET/POST /tools``. See ``registry`` for how a provider
plugs in; ``setup`` builds the registry a server starts with (None: ``/tools`` answers 403)."""

from __future__ import annotations

import logging
from typing import Any

from kvserve.mcp import McpManager
from kvserve.server.agent_tools.builtin import BuiltinProvider, UnknownTool
from kvserve.server.agent_tools.io_isolate import ToolRuntimeError
from kvserve.server.agent_tools.mcp_provider import McpToolProvider
from kvserve.server.agent_tools.registry import Tool, ToolNotFound, ToolParamError, ToolProvider, ToolRegistry

__all__ = [
    "Tool",
    "ToolNotFound",
    "ToolParamError",
    "ToolProvider",
    "ToolRegistry",
    "ToolSetupError",
    "setup",
]


log = logging.getLogger("kvserve.tools")


class ToolSetupError(RuntimeError):
    """Start-up stops: ``tools setup failed: <why>`` (an unknown tool name, an unusable runtime)."""


def setup(settings: Any, mcp: McpManager | None = None) -> ToolRegistry | None:
    """The registry for ``settings.tools`` (``--tools`` names; ``all``) and ``settings.tools_runtime``,
    then the tools of the MCP servers (``mcp``, warmed up); None when no tool source is configured.
    Each source names itself in ``features`` for llama-server's start-up security warning."""
    names = tuple(getattr(settings, "tools", ()) or ())
    spec = str(getattr(settings, "tools_runtime", "") or "")
    use_mcp = mcp is not None and mcp.configured
    registry = ToolRegistry()
    features: list[str] = []
    try:
        if names:
            registry.add(BuiltinProvider(names))
            features.append("server tools (experimental)")
        if spec and (names or use_mcp):  # as llama-server: the runtime serves MCP-only servers too
            from kvserve.server.agent_tools.runtime import make_runtime

            runtime = make_runtime(spec)
            registry.default_runtime = runtime.spec
            registry.add(_Owned(runtime))
            features.append("tools runtime (experimental)")
        if use_mcp:
            assert mcp is not None
            registry.add(McpToolProvider(mcp))  # after the built-ins: a colliding name is skipped
            features.append("MCP servers (experimental)")
    except (UnknownTool, ToolRuntimeError) as e:
        registry.close()
        raise ToolSetupError(str(e)) from None
    if not features:
        return None
    log.warning("security: %s enabled - do not expose to untrusted environments", ", ".join(features))
    return registry


class _Owned:
    """A provider with no tools that closes what it owns (the runtime's container) with the registry."""

    def __init__(self, owned: Any) -> None:
        self._owned = owned

    def tools(self) -> list[Tool]:
        return []

    def close(self) -> None:
        self._owned.close()
