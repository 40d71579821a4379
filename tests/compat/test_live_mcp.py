"""MCP servers (``--mcp-servers-json`` / ``--mcp-servers-config``) on the real server: ``/tools``
lists and calls their tools, a bad configuration stops start-up, and stopping the server while
a tool call is in flight (or while a server's grandchild holds its pipes) is prompt."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from .live import LiveServer, start_server

FAKE = str(Path(__file__).resolve().parents[1] / "unit" / "fake_mcp_server.py")


def fake(*flags: str) -> dict[str, Any]:
    return {"command": sys.executable, "args": [FAKE, *flags]}


def mcp_json(**servers: dict[str, Any]) -> str:
    return json.dumps({"mcpServers": servers})


def stop_timed(srv: LiveServer) -> float:
    t0 = time.monotonic()
    srv.proc.terminate()
    srv.proc.wait(timeout=10)
    return time.monotonic() - t0


@pytest.mark.parametrize("router", [False, True], ids=["model", "router"])
def test_tools_listed_and_called_and_a_call_in_flight_does_not_hold_shutdown(tmp_path: Path,
                                                                             router: bool) -> None:
    """With a model, and as the router (no -m), which serves /tools itself as llama-server's does."""
    cfg = tmp_path / "mcp.json"
    cfg.write_text(mcp_json(fake=fake()))
    srv = start_server("-c", "256", "-np", "1", "--mcp-servers-config", str(cfg), "--mcp-servers-json",
                       mcp_json(gc=fake("--grandchild"),
                                bad={"command": "this_executable_does_not_exist_12345"}), router=router)
    try:
        tools = httpx.get(srv.url + "/tools", timeout=10).json()
        names = [t["tool"] for t in tools]
        assert "fake_echo" in names and "gc_echo" in names and not any(n.startswith("bad_") for n in names)
        echo = next(t for t in tools if t["tool"] == "fake_echo")
        assert echo["type"] == "mcp" and echo["permissions"] == {"write": False}
        assert echo["definition"] == {"type": "function", "function": {
            "name": "fake_echo", "description": "the echo tool",
            "parameters": {"type": "object", "properties": {"message": {"type": "string"}},
                           "required": ["message"]}}}

        def call(tool: str, **params: Any) -> Any:
            r = httpx.post(srv.url + "/tools", json={"tool": tool, "params": params}, timeout=30)
            return r.status_code, r.json()

        assert call("fake_echo", message="hi") == (200, {"plain_text_response": "echo: hi"})
        assert call("fake_add", a=2, b=40) == (200, {"plain_text_response": "42"})
        assert call("gc_echo", message="x") == (200, {"plain_text_response": "echo: x"})
        assert call("fake_bad") == (200, {"error": "it went wrong"})
        assert call("nope")[0] == 404

        slow: list[Any] = []
        t = threading.Thread(target=lambda: slow.append(call("fake_sleep", seconds=20)), daemon=True)
        t.start()
        time.sleep(1.0)
        took = stop_timed(srv)
        assert took < 3.0, took
        t.join(5)
        assert slow in ([], [(200, {"error": "cancelled"})])  # answered, or the connection closed
    finally:
        if srv.proc.poll() is None:
            srv.proc.kill()


@pytest.mark.parametrize("args, message", [
    (["--mcp-servers-json", "not valid json"], "MCP starting failed: failed to parse MCP config JSON"),
    (["--mcp-servers-config", "/nonexistent/path.json"],
     "MCP starting failed: failed to open MCP config file: /nonexistent/path.json"),
])
def test_a_bad_configuration_stops_start_up(args: list[str], message: str) -> None:
    r = subprocess.run([sys.executable, "-m", "kvserve", "--port", "0", *args], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 1 and message in r.stderr
