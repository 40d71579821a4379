"""The built-in tools of ``--tools`` (llama-server's ``server-tools.cpp``), as one ``ToolProvider``.

``--tools all`` or a comma list of names enables them; an unknown name stops start-up with the list
of known ones. Each tool resolves its paths and runs its commands through the ``ToolIO`` that the
call's ``cwd``/``runtime`` params name (``io_isolate.make_io``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvserve.server.agent_tools.io_base import ToolIO
from kvserve.server.agent_tools.io_isolate import make_io
from kvserve.server.agent_tools.registry import Emit, Tool


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
        return {"type": "function", "function": {"name": self.name, "description": self.description,
                                                 "parameters": self.parameters()}}

    def invoke(self, params: dict[str, Any], emit: Emit | None) -> Any:
        raise NotImplementedError

    @staticmethod
    def io(params: dict[str, Any]) -> ToolIO:
        return make_io(str(params.get("cwd") or ""), str(params.get("runtime") or ""))


def schema(properties: dict[str, tuple[str, str]], required: Sequence[str] | None = None) -> dict[str, Any]:
    """An object schema from ``name -> (json type, description)``, llama-server's key order."""
    out: dict[str, Any] = {"type": "object", "properties": {
        k: {"type": t, "description": d} for k, (t, d) in properties.items()}}
    if required is not None:
        out["required"] = list(required)
    return out


def all_tools() -> list[BuiltinTool]:
    """Every built-in tool, in llama-server's order (the order of ``GET /tools``)."""
    from kvserve.server.agent_tools.tool_files import EditFile, ReadFile, WriteFile
    from kvserve.server.agent_tools.tool_search import FileGlobSearch, GrepSearch
    from kvserve.server.agent_tools.tool_shell import ExecShellCommand, GetInfo

    return [ReadFile(), FileGlobSearch(), GrepSearch(), ExecShellCommand(), WriteFile(), EditFile(), GetInfo()]


TOOL_NAMES = ("read_file", "file_glob_search", "grep_search", "exec_shell_command", "write_file", "edit_file",
              "get_info")


class UnknownTool(ValueError):
    pass


def check_names(names: Sequence[str]) -> None:
    """``--tools`` values: ``all`` or known names (start-up error otherwise)."""
    for n in names:
        if n != "all" and n not in TOOL_NAMES:
            raise UnknownTool(f"unknown tool \"{n}\". available tools: {', '.join(TOOL_NAMES)}")


class BuiltinProvider:
    def __init__(self, names: Sequence[str]) -> None:
        check_names(names)
        wanted = set(names)
        self._tools: list[Tool] = [t for t in all_tools() if "all" in wanted or t.name in wanted]

    def tools(self) -> Sequence[Tool]:
        return self._tools

    def close(self) -> None:
        pass
