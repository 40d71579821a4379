"""The MCP client (kvserve.mcp) against a fake MCP server process (fake_mcp_server.py)."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from kvserve.mcp import McpConfigError, McpManager, McpServerConfig, load_mcp_servers
from kvserve.mcp.session import call_response

FAKE = str(Path(__file__).with_name("fake_mcp_server.py"))


def server(name: str, *flags: str, timeout_ms: int = 30000, **kw: Any) -> McpServerConfig:
    return McpServerConfig(name=name, command=sys.executable, args=(FAKE, *flags), timeout_ms=timeout_ms,
                           **kw)


def run(fn: Callable[[], Awaitable[Any]]) -> Any:
    return asyncio.run(asyncio.wait_for(fn(), 30))


def running_in_group(pgid: int) -> list[int]:
    """Processes of group ``pgid`` that are not zombies (from /proc)."""
    out = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if entry.isdigit() and int(fields[2]) == pgid and fields[0] != "Z":
            out.append(int(entry))
    return out


# --- configuration -----------------------------------------------------------------------------


def test_config_both_sources_file_first_names_unique(tmp_path: Path) -> None:
    f = tmp_path / "mcp.json"
    f.write_text(json.dumps({"mcpServers": {
        "a": {"command": "x", "args": ["1", "2"], "env": {"K": "V"}, "cwd": "/tmp", "timeout_ms": 500},
        "nocmd": {"args": []}}}))
    warnings: list[str] = []
    got = load_mcp_servers(str(f), json.dumps({"mcpServers": {"a": {"command": "y"}, "b": {"command": "z"}}}),
                           warnings.append)
    assert [(c.name, c.command) for c in got] == [("a", "x"), ("b", "z")]
    a = got[0]
    assert (a.args, dict(a.env), a.cwd, a.timeout_ms) == (("1", "2"), {"K": "V"}, "/tmp", 500)
    assert got[1].timeout_ms == 30000 and got[1].cwd is None
    assert any("'nocmd' has no command" in w for w in warnings)
    assert any("duplicate server name 'a'" in w for w in warnings)


def test_config_without_servers_is_empty_with_a_warning() -> None:
    warnings: list[str] = []
    assert load_mcp_servers(None, '{"servers": {}}', warnings.append) == ()
    assert warnings == ["MCP config: no servers found in JSON"]
    assert load_mcp_servers(None, None, warnings.append) == ()


@pytest.mark.parametrize("text", ["not valid json", '{"mcpServers": {"a": {"command": 5}}}',
                                  '{"mcpServers": {"a": {"command": "x", "args": [1]}}}',
                                  '{"mcpServers": {"a": "x"}}',
                                  '{"mcpServers": {"a": {"command": "x", "timeout_ms": "1"}}}'])
def test_config_invalid_is_fatal(text: str) -> None:
    with pytest.raises(McpConfigError, match="failed to parse MCP config JSON"):
        load_mcp_servers(None, text, lambda _: None)


def test_config_missing_file_is_fatal() -> None:
    with pytest.raises(McpConfigError, match="failed to open MCP config file: /nonexistent/x.json"):
        load_mcp_servers("/nonexistent/x.json", None, lambda _: None)


def test_flags_reach_the_server_config_without_a_warning() -> None:
    from kvserve.config import ConfigError, load_config

    warnings: list[str] = []
    cfg = load_config(["--mcp-servers-json", json.dumps({"mcpServers": {"a": {"command": "x"}}})], {},
                      warn=warnings.append)
    assert [c.name for c in cfg.server.mcp_servers] == ["a"]
    assert not any("no effect" in w for w in warnings), warnings
    assert cfg.server.cors_origins == "localhost"  # llama-server's rule once MCP servers are set
    env = {"LLAMA_ARG_MCP_SERVERS_JSON": "not valid json"}
    with pytest.raises(ConfigError, match="^error: MCP starting failed: failed to parse MCP config JSON"):
        load_config([], env, warn=warnings.append)


# --- results -----------------------------------------------------------------------------------


def test_call_response_joins_text_parts_and_surfaces_is_error() -> None:
    content = [{"type": "text", "text": "a"}, {"type": "image", "data": "..."}, {"type": "text", "text": "b"}]
    assert call_response({"content": content}) == {"plain_text_response": "a\nb"}
    assert call_response({"content": content, "isError": True}) == {"error": "a\nb"}
    assert call_response({"isError": True}) == {"error": "MCP tool returned an error"}
    assert call_response({}) == {"plain_text_response": ""}


# --- warm-up -----------------------------------------------------------------------------------


def test_warm_up_lists_tools_and_survives_bad_servers() -> None:
    async def go() -> Any:
        m = McpManager([server("good"), McpServerConfig("bad", "this_executable_does_not_exist_12345"),
                        server("empty", "--no-tools"), McpServerConfig("nul", sys.executable, ("a\x00b",)),
                        McpServerConfig("nodir", sys.executable, (FAKE,), cwd="/nonexistent/dir")])
        await m.warm_up()
        return m.tools()

    tools = run(go)
    assert {t.server for t in tools} == {"good"}
    echo = next(t for t in tools if t.name == "echo")
    assert echo.description == "the echo tool" and echo.input_schema["required"] == ["message"]


def test_warm_up_with_a_grandchild_holding_the_pipes_is_prompt() -> None:
    async def go() -> Any:
        m = McpManager([server("gc", "--grandchild")])
        t0 = time.monotonic()
        await m.warm_up()
        return m.tools(), time.monotonic() - t0

    tools, took = run(go)
    assert [t.name for t in tools][:1] == ["echo"]
    assert took < 3.0


def test_the_tools_registry_gets_the_mcp_tools_after_the_built_ins() -> None:
    from kvserve.server import agent_tools
    from kvserve.server.settings import ServerSettings

    assert agent_tools.setup(ServerSettings(), McpManager([])) is None  # nothing configured: 403
    m = McpManager([server("s", "--no-tools"), server("fake")])
    run(m.warm_up)
    registry = agent_tools.setup(ServerSettings(tools=("read_file",)), m)
    assert registry is not None
    listed = registry.list()
    assert [t["tool"] for t in listed] == ["read_file"] + [f"fake_{n}" for n in (
        "echo", "add", "fail_once", "bad", "sleep", "crash", "where")]
    schema = {"type": "object", "properties": {"message": {"type": "string"}}, "required": ["message"]}
    assert listed[1] == {
        "display_name": "fake_echo", "tool": "fake_echo", "type": "mcp", "permissions": {"write": False},
        "uses_cwd": False, "definition": {"type": "function", "function": {
            "name": "fake_echo", "description": "the echo tool", "parameters": schema}}}


# --- calls -------------------------------------------------------------------------------------


def test_calls_keep_one_process_per_server() -> None:
    async def go() -> Any:
        m = McpManager([server("s")])
        try:
            return [await m.call_tool("s", "echo", {"message": "hi"}),
                    await m.call_tool("s", "add", {"a": 3, "b": 5}),
                    await m.call_tool("s", "fail_once", {}),
                    await m.call_tool("s", "fail_once", {}),  # the same process: it failed already
                    await m.call_tool("s", "bad", {}),
                    await m.call_tool("s", "nope", {}),
                    await m.call_tool("missing", "echo", {})]
        finally:
            await m.shutdown()

    assert run(go) == [{"plain_text_response": "echo: hi"}, {"plain_text_response": "8"},
                       {"error": "transient error"}, {"plain_text_response": "ok"},
                       {"error": "it went wrong"}, {"error": "Unknown tool: nope"},
                       {"error": "MCP server unavailable: missing"}]


@pytest.mark.parametrize("flags", [("--notify",), ("--burst",), ("--junk",), ("--stderr-kib", "256")])
def test_notifications_junk_and_stderr_do_not_disturb_replies(flags: tuple[str, ...]) -> None:
    async def go() -> Any:
        m = McpManager([server("s", *flags)])
        try:
            return [await m.call_tool("s", "echo", {"message": str(i)}) for i in range(3)]
        finally:
            await m.shutdown()

    assert run(go) == [{"plain_text_response": f"echo: {i}"} for i in range(3)]


def test_a_request_from_the_server_is_answered() -> None:
    async def go() -> Any:
        m = McpManager([server("s", "--ping")])
        try:
            return await m.call_tool("s", "echo", {"message": "x"})
        finally:
            await m.shutdown()

    assert run(go) == {"plain_text_response": 'pong {"id": "srv-1", "jsonrpc": "2.0", "result": {}}'}


def test_concurrent_calls_get_their_own_replies() -> None:
    async def go() -> Any:
        m = McpManager([server("s")])
        try:
            return await asyncio.gather(*(m.call_tool("s", "echo", {"message": f"m{i}"}) for i in range(10)))
        finally:
            await m.shutdown()

    assert run(go) == [{"plain_text_response": f"echo: m{i}"} for i in range(10)]


def test_timeout_then_the_stale_reply_is_dropped() -> None:
    async def go() -> Any:
        m = McpManager([server("s", timeout_ms=500)])
        try:
            warm = await m.call_tool("s", "echo", {"message": "warm"})
            assert warm == {"plain_text_response": "echo: warm"}
            t0 = time.monotonic()
            slow = await m.call_tool("s", "sleep", {"seconds": 0.7})
            took = time.monotonic() - t0
            # the server answers the sleep (late) just before this one: that reply must not be taken for it
            after = await m.call_tool("s", "echo", {"message": "next"})
            return slow, took, after
        finally:
            await m.shutdown()

    slow, took, after = run(go)
    assert slow == {"error": "request timed out"} and 0.45 < took < 0.69
    assert after == {"plain_text_response": "echo: next"}


def test_a_crashed_server_is_respawned_by_the_next_call() -> None:
    async def go() -> Any:
        m = McpManager([server("s")])
        try:
            first = await m.call_tool("s", "fail_once", {})
            crashed = await m.call_tool("s", "crash", {})
            # a fresh process: fail_once fails again
            again = await m.call_tool("s", "fail_once", {})
            return first, crashed, again, await m.call_tool("s", "echo", {"message": "x"})
        finally:
            await m.shutdown()

    assert run(go) == ({"error": "transient error"}, {"error": "transport closed"},
                       {"error": "transient error"}, {"plain_text_response": "echo: x"})


def test_spawn_failure_cools_down() -> None:
    async def go() -> Any:
        m = McpManager([McpServerConfig("x", "this_executable_does_not_exist_12345")], cooldown_s=60)
        out = [await m.call_tool("x", "t", {}) for _ in range(2)]
        return out, m._dead_until["x"] - time.monotonic()

    out, left = run(go)
    assert out == [{"error": "MCP server unavailable: x"}] * 2
    assert 50 < left <= 60


def test_env_and_cwd_reach_the_server(tmp_path: Path) -> None:
    async def go() -> Any:
        m = McpManager([server("s", env={"FAKE_MCP_VAR": "v1"}, cwd=str(tmp_path))])
        try:
            return await m.call_tool("s", "where", {})
        finally:
            await m.shutdown()

    assert run(go) == {"plain_text_response": f"{os.path.realpath(tmp_path)}|v1"}


# --- shutdown ----------------------------------------------------------------------------------


def test_shutdown_cancels_a_call_in_flight_and_stops_the_process() -> None:
    async def go() -> Any:
        m = McpManager([server("s")])
        call = asyncio.ensure_future(m.call_tool("s", "sleep", {"seconds": 20}))
        await asyncio.sleep(0.5)
        pid = m._sessions["s"].transport._popen.pid  # type: ignore[union-attr]
        t0 = time.monotonic()
        await m.shutdown()
        result = await call
        after = await m.call_tool("s", "echo", {"message": "x"})
        return result, time.monotonic() - t0, pid, after

    result, took, pid, after = run(go)
    assert result == {"error": "cancelled"} and took < 2.0
    assert not running_in_group(pid)  # the server led its own group
    assert after == {"error": "MCP server unavailable: s"}


def test_close_kills_a_grandchild_that_holds_the_pipes() -> None:
    async def go() -> Any:
        m = McpManager([server("gc", "--grandchild")])
        reply = await m.call_tool("gc", "echo", {"message": "x"})
        transport = m._sessions["gc"].transport
        pgid = transport._popen.pid  # type: ignore[union-attr]
        t0 = time.monotonic()
        await m.shutdown()
        return reply, time.monotonic() - t0, pgid

    reply, took, pgid = run(go)
    assert reply == {"plain_text_response": "echo: x"} and took < 2.0
    deadline = time.monotonic() + 5
    while running_in_group(pgid):  # killed members may stay zombies until init reaps them
        if time.monotonic() > deadline:
            pytest.fail("the server's process group outlived close()")
        time.sleep(0.05)
