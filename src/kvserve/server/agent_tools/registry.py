"""The agent tools behind ``GET /tools`` and ``POST /tools``: providers merged into one registry.

A provider is any object with ``tools() -> Sequence[Tool]`` and ``close()`` (see ``ToolProvider``);
``registry.add(provider)`` appends its tools after those already registered (the built-in tools of
``--tools`` come first, then e.g. MCP servers' tools), skipping a tool whose ``name`` is taken, with
a warning, as llama-server does. A ``Tool`` is one entry: ``name``, ``display_name``, ``type``
(``"server"`` for built-ins, ``"mcp"`` for MCP), ``permission_write``, ``uses_cwd``,
``supports_stream``, ``definition()`` (the OpenAI function schema shown in ``GET /tools``) and
``invoke(params, emit)``: ``params`` is the request's ``params`` object after the route has replaced
``cwd``/``runtime``/``resp_type`` with the ``x-tool-cwd``/``x-tool-runtime``/``x-resp-type`` headers
(or ``--tools-runtime``); it returns the JSON object answered with 200 (a tool-level failure is
``{"error": "..."}``, still 200). ``invoke`` may be a plain function (run in a worker thread) or a
coroutine function. With ``"stream": true`` (only when ``supports_stream``) ``emit(chunk)`` sends one
``data: {"chunk": ...}`` event and returns False once the client is gone; the return value is then
ignored. Raise ``ToolParamError`` for a malformed parameter (400), anything else for a failure of
the tool itself (500, or the ``error`` of the final stream event). ``create_app`` builds the
registry from the config (``agent_tools.setup``) and ``close()``s it at shutdown.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable

log = logging.getLogger("kvserve.tools")

Emit = Callable[[str], bool]


class ToolParamError(ValueError):
    """A parameter that is missing or of the wrong type: HTTP 400 (llama-server's JSON error text)."""


class ToolNotFound(LookupError):
    """No such tool, or a stream asked of a tool that cannot stream: HTTP 404."""


@runtime_checkable
class Tool(Protocol):
    name: str
    display_name: str
    type: str
    permission_write: bool
    uses_cwd: bool
    supports_stream: bool

    def definition(self) -> dict[str, Any]: ...

    def invoke(self, params: dict[str, Any], emit: Emit | None) -> Any: ...


class ToolProvider(Protocol):
    def tools(self) -> Sequence[Tool]: ...

    def close(self) -> None: ...


def entry(tool: Tool) -> dict[str, Any]:
    """One element of ``GET /tools`` (llama-server's key order)."""
    return {
        "display_name": tool.display_name,
        "tool": tool.name,
        "type": tool.type,
        "permissions": {"write": tool.permission_write},
        "uses_cwd": tool.uses_cwd,
        "definition": tool.definition(),
    }


class ToolRegistry:
    """The tools of every provider, in registration order. ``default_runtime`` (set by
    ``--tools-runtime``) names the isolate a call runs in when it sends no ``x-tool-runtime``."""

    def __init__(self) -> None:
        self._providers: list[ToolProvider] = []
        self._tools: dict[str, Tool] = {}
        self.default_runtime: Callable[[], str] | None = None

    def add(self, provider: ToolProvider) -> int:
        """Register ``provider``'s tools; returns how many were added."""
        self._providers.append(provider)
        added = 0
        for tool in provider.tools():
            if tool.name in self._tools:
                log.warning('tool "%s" (%s) collides with an existing tool, skipping', tool.name, tool.type)
                continue
            self._tools[tool.name] = tool
            added += 1
        return added

    def list(self) -> list[dict[str, Any]]:
        return [entry(t) for t in self._tools.values()]

    def find(self, name: str, stream: bool) -> Tool:
        tool = self._tools.get(name)
        if tool is None:
            raise ToolNotFound(f'unknown tool "{name}"')
        if stream and not tool.supports_stream:
            raise ToolNotFound(f'tool "{name}" does not support stream = true')
        return tool

    def __len__(self) -> int:
        return len(self._tools)

    def close(self) -> None:
        for provider in reversed(self._providers):
            try:
                provider.close()
            except Exception:  # shutdown goes on for the others
                log.exception("closing a tool provider failed")
