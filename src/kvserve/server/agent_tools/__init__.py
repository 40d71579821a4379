"""Agent tools (``--tools``, MCP servers): ``GET/POST /tools``. See ``registry`` for how a provider
plugs in; ``setup`` builds the registry a server starts with (None: ``/tools`` answers 403)."""

from __future__ import annotations

import logging
from typing import Any

from kvserve.server.agent_tools.builtin import BuiltinProvider, UnknownTool
from kvserve.server.agent_tools.io_isolate import ToolRuntimeError
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


def setup(settings: Any) -> ToolRegistry | None:
    """The registry for ``settings.tools`` (``--tools`` names; ``all``) and ``settings.tools_runtime``;
    None when no tool source is configured. Other providers (MCP servers) are added here too, each
    naming itself in ``features`` for llama-server's start-up security warning."""
    names = tuple(getattr(settings, "tools", ()) or ())
    spec = str(getattr(settings, "tools_runtime", "") or "")
    registry = ToolRegistry()
    features: list[str] = []
    try:
        if names:
            registry.add(BuiltinProvider(names))
            features.append("server tools (experimental)")
        if features and spec:
            from kvserve.server.agent_tools.runtime import make_runtime

            runtime = make_runtime(spec)
            registry.default_runtime = runtime.spec
            registry.add(_Owned(runtime))
            features.append("tools runtime (experimental)")
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
