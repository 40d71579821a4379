"""The tool registry behind /tools: providers merged in order, name collisions skipped, closing."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from kvserve.server.agent_tools import ToolNotFound, ToolRegistry, ToolSetupError, setup
from kvserve.server.agent_tools.builtin import TOOL_NAMES, BuiltinProvider
from kvserve.server.agent_tools.registry import Emit, Tool


class EchoTool:
    type = "mcp"
    permission_write = False
    uses_cwd = False
    supports_stream = False

    def __init__(self, name: str) -> None:
        self.name = self.display_name = name

    def definition(self) -> dict[str, Any]:
        return {"type": "function", "function": {"name": self.name, "description": "", "parameters": {}}}

    def invoke(self, params: dict[str, Any], emit: Emit | None) -> Any:
        return {"echo": params}


class Provider:
    def __init__(self, *names: str) -> None:
        self._tools = [EchoTool(n) for n in names]
        self.closed = False

    def tools(self) -> Sequence[Tool]:
        return self._tools

    def close(self) -> None:
        self.closed = True


def test_providers_are_merged_in_order_and_collisions_skipped() -> None:
    reg = ToolRegistry()
    assert reg.add(BuiltinProvider(["all"])) == len(TOOL_NAMES)
    mcp = Provider("srv_search", "read_file", "srv_fetch")  # read_file is taken by the built-in one
    assert reg.add(mcp) == 2
    names = [e["tool"] for e in reg.list()]
    assert names == [*TOOL_NAMES, "srv_search", "srv_fetch"]
    assert reg.find("read_file", stream=False).type == "server"
    assert reg.list()[-1] == {
        "display_name": "srv_fetch",
        "tool": "srv_fetch",
        "type": "mcp",
        "permissions": {"write": False},
        "uses_cwd": False,
        "definition": EchoTool("srv_fetch").definition(),
    }
    reg.close()
    assert mcp.closed


def test_find_refuses_unknown_tools_and_streams_of_tools_that_cannot() -> None:
    reg = ToolRegistry()
    reg.add(BuiltinProvider(["read_file", "exec_shell_command"]))
    assert [e["tool"] for e in reg.list()] == ["read_file", "exec_shell_command"]
    with pytest.raises(ToolNotFound, match='unknown tool "write_file"'):
        reg.find("write_file", stream=False)
    with pytest.raises(ToolNotFound, match='tool "read_file" does not support stream = true'):
        reg.find("read_file", stream=True)
    assert reg.find("exec_shell_command", stream=True).supports_stream


def test_setup_from_settings() -> None:
    class S:
        tools: tuple[str, ...] = ()
        tools_runtime = ""

    assert setup(S()) is None  # nothing configured: /tools answers 403
    S.tools = ("grep_search",)
    reg = setup(S())
    assert reg is not None and [e["tool"] for e in reg.list()] == ["grep_search"]
    S.tools = ("read_file", "web_search")
    with pytest.raises(ToolSetupError, match='unknown tool "web_search". available tools: read_file, '):
        setup(S())
    S.tools, S.tools_runtime = ("all",), "ssh:-oProxyCommand=x"
    with pytest.raises(ToolSetupError, match="invalid ssh target: -oProxyCommand=x"):
        setup(S())
    S.tools_runtime = "docker-container:abc123"  # names an existing target: validated, not contacted
    reg = setup(S())
    assert (
        reg is not None
        and reg.default_runtime is not None
        and reg.default_runtime() == "docker-container:abc123"
    )


def test_the_runtime_also_serves_mcp_only_servers() -> None:
    class S:
        tools: tuple[str, ...] = ()
        tools_runtime = "docker-container:abc123"

    class NoServers:
        configured = True

        def tools(self) -> list[Any]:
            return []

    reg = setup(S(), NoServers())  # type: ignore[arg-type]
    assert reg is not None and reg.default_runtime is not None
    assert reg.default_runtime() == "docker-container:abc123"
    assert setup(S()) is None  # a runtime alone enables nothing
