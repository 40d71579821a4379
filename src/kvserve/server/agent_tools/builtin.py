"""The built-in tools of ``--tools`` (llama-server's ``server-tools.cpp``), as one ``ToolProvider``.

``--tools all`` or a comma list of names enables them; an unknown name stops start-up with the list
of known ones.
"""

from __future__ import annotations

from collections.abc import Sequence

from kvserve.server.agent_tools.registry import Tool
from kvserve.server.agent_tools.tool_base import BuiltinTool
from kvserve.server.agent_tools.tool_files import EditFile, ReadFile, WriteFile
from kvserve.server.agent_tools.tool_search import FileGlobSearch, GrepSearch
from kvserve.server.agent_tools.tool_shell import ExecShellCommand, GetInfo


def all_tools() -> list[BuiltinTool]:
    """Every built-in tool, in llama-server's order (the order of ``GET /tools``)."""
    return [
        ReadFile(),
        FileGlobSearch(),
        GrepSearch(),
        ExecShellCommand(),
        WriteFile(),
        EditFile(),
        GetInfo(),
    ]


TOOL_NAMES = tuple(t.name for t in all_tools())


class UnknownTool(ValueError):
    pass


def check_names(names: Sequence[str]) -> None:
    """``--tools`` values: ``all`` or known names (start-up error otherwise)."""
    for n in names:
        if n != "all" and n not in TOOL_NAMES:
            raise UnknownTool(f'unknown tool "{n}". available tools: {", ".join(TOOL_NAMES)}')


class BuiltinProvider:
    def __init__(self, names: Sequence[str]) -> None:
        check_names(names)
        wanted = set(names)
        self._tools: list[Tool] = [t for t in all_tools() if "all" in wanted or t.name in wanted]

    def tools(self) -> Sequence[Tool]:
        return self._tools

    def close(self) -> None:
        pass
