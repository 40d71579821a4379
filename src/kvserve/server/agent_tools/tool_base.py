"""The base of the built-in tools: the ``Tool`` attributes, the schema helper and a call's I/O.

Each tool resolves its paths and runs its commands through the ``ToolIO`` that the call's
``cwd``/``runtime`` params name (``io_isolate.make_io``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvserve.server.agent_tools.io_base import ToolIO
from kvserve.server.agent_tools.io_isolate import make_io
from kvserve.server.agent_tools.registry import Emit


class BuiltinTool:
    """Base of the built-in tools: the ``Tool`` attributes, and the I/O of a call."""

    name = ""
    display_name = ""
    type = "server"
    permission_write = False
    uses_cwd = True
    supports_stream = False
    description = ""

    def parameters(self) -> dict[str, Any]:
        raise NotImplementedError

    def definition(self) -> dict[str, Any]:
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters()},
        }

    def invoke(self, params: dict[str, Any], emit: Emit | None) -> Any:
        raise NotImplementedError

    @staticmethod
    def io(params: dict[str, Any]) -> ToolIO:
        return make_io(str(params.get("cwd") or ""), str(params.get("runtime") or ""))


def schema(properties: dict[str, tuple[str, str]], required: Sequence[str] | None = None) -> dict[str, Any]:
    """An object schema from ``name -> (json type, description)``, llama-server's key order."""
    out: dict[str, Any] = {
        "type": "object",
        "properties": {k: {"type": t, "description": d} for k, (t, d) in properties.items()},
    }
    if required is not None:
        out["required"] = list(required)
    return out
