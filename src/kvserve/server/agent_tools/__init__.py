"""Agent tools (``--tools``, MCP servers): ``GET/POST /tools``. See ``registry`` for how a provider
plugs in; ``setup`` builds the registry a server starts with (None: ``/tools`` answers 403)."""

from __future__ import annotations

from typing import Any

from kvserve.server.agent_tools.builtin import BuiltinProvider, UnknownTool
from kvserve.server.agent_tools.io_isolate import ToolRuntimeError
from kvserve.server.agent_tools.registry import Tool, ToolNotFound, ToolParamError, ToolProvider, ToolRegistry

__all__ = ["Tool", "ToolNotFound", "ToolParamError", "ToolProvider", "ToolRegistry", "ToolSetupError", "setup"]


class ToolSetupError(RuntimeError):
    """Start-up stops: ``tools setup failed: <why>`` (an unknown tool name, an unusable runtime)."""


def setup(settings: Any) -> ToolRegistry | None:
    """The registry for ``settings.tools`` (``--tools`` names; ``all``) and ``settings.tools_runtime``;
    None when no tool source is configured. Other providers (MCP servers) are added here too."""
    names = tuple(getattr(settings, "tools", ()) or ())
    registry = ToolRegistry()
    enabled = False
    try:
        if names:
            registry.add(BuiltinProvider(names))
            enabled = True
        spec = str(getattr(settings, "tools_runtime", "") or "")
        if enabled and spec:
            from kvserve.server.agent_tools.runtime import make_runtime

            runtime = make_runtime(spec)
            registry.default_runtime = runtime.spec
            registry.add(_Owned(runtime))
    except (UnknownTool, ToolRuntimeError) as e:
        registry.close()
        raise ToolSetupError(str(e)) from None
    return registry if enabled else None


class _Owned:
    """A provider with no tools that closes what it owns (the runtime's container) with the registry."""

    def __init__(self, owned: Any) -> None:
        self._owned = owned

    def tools(self) -> list[Tool]:
        return []

    def close(self) -> None:
        self._owned.close()
