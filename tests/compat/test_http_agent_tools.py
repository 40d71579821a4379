"""GET/POST /tools through the real app (--tools), against llama-server's recorded answers."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from kvserve.config import load_config

from .test_http_fake_engine import client, sse_events

GOLDEN = Path(__file__).parent.parent / "golden" / "agent_tools"


def _tools_client(*tools: str):  # type: ignore[no-untyped-def]
    c, _ = client(tools=tools or ("all",))
    return c


def test_get_tools_lists_the_builtin_tools_byte_for_byte() -> None:
    """Recorded from llama-server b10621 ``--tools all``: GET /tools."""
    r = _tools_client().get("/tools")
    assert r.status_code == 200 and r.headers["content-type"].startswith("application/json")
    assert r.text == (GOLDEN / "tools_list.json").read_text(encoding="utf-8")


def test_only_the_named_tools_are_served() -> None:
    c = _tools_client("read_file", "get_info")
    assert [t["tool"] for t in c.get("/tools").json()] == ["read_file", "get_info"]
    r = c.post("/tools", json={"tool": "write_file", "params": {"path": "x", "content": ""}})
    assert r.status_code == 404 and r.json()["error"]["message"] == 'unknown tool "write_file"'


def test_without_tools_the_endpoint_is_disabled() -> None:
    c, _ = client()
    r = c.post("/tools", json={"tool": "read_file", "params": {"path": "/etc/hostname"}})
    assert r.status_code == 403 and r.json()["error"]["type"] == "feature_disabled"


def test_write_read_edit_round_trip_with_the_cwd_header(tmp_path: Path) -> None:
    c = _tools_client()
    h = {"x-tool-cwd": str(tmp_path)}
    r = c.post(
        "/tools", headers=h, json={"tool": "write_file", "params": {"path": "a/b.txt", "content": "x\ny\n"}}
    )
    assert r.json() == {"result": "file written successfully", "path": "a/b.txt", "bytes": 4}
    assert (tmp_path / "a" / "b.txt").read_text() == "x\ny\n"
    r = c.post(
        "/tools",
        headers=h,
        json={
            "tool": "edit_file",
            "params": {"path": "a/b.txt", "edits": [{"old_text": "y", "new_text": "z"}], "cwd": "/elsewhere"},
        },
    )
    assert r.json() == {"result": "file edited successfully", "path": "a/b.txt", "edits_applied": 1}
    r = c.post(
        "/tools", headers=h, json={"tool": "read_file", "params": {"path": "a/b.txt", "append_loc": True}}
    )
    assert r.json() == {"plain_text_response": "1\u2192x\n2\u2192z\n"}


def test_base64_reads_only_through_the_header(tmp_path: Path) -> None:
    (tmp_path / "bin").write_bytes(b"\x00\xff")
    c = _tools_client()
    body = {"tool": "read_file", "params": {"path": str(tmp_path / "bin"), "resp_type": "base64"}}
    assert "plain_text_response" in c.post("/tools", json=body).json()  # a param cannot ask for it
    r = c.post("/tools", json=body, headers={"x-resp-type": "base64"})
    assert r.json() == {"base64": "AP8=", "size_bytes": 2}


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        (b"not json", 400, "[json.exception.parse_error.101]"),
        (b"[]", 400, "cannot use at() with array"),
        (b"{}", 400, "[json.exception.out_of_range.403] key 'tool' not found"),
        (b'{"tool": 1}', 400, "[json.exception.type_error.302] type must be string, but is number"),
        (b'{"tool": "read_file"}', 400, "[json.exception.out_of_range.403] key 'path' not found"),
        (b'{"tool": "read_file", "params": {"path": 5}}', 400, "type must be string, but is number"),
        (
            b'{"tool": "read_file", "params": {"path": "x", "end_line": "9"}}',
            400,
            "type must be number, but is string",
        ),
        (b'{"tool": "read_file", "params": [1]}', 400, "cannot use at() with array"),
        (
            b'{"tool": "exec_shell_command", "params": {"command": "true"}, "stream": "yes"}',
            400,
            "type must be boolean, but is string",
        ),
    ],
)
def test_malformed_calls_are_400_with_llama_servers_text(body: bytes, status: int, message: str) -> None:
    r = _tools_client().post("/tools", content=body)
    assert r.status_code == status and message in r.json()["message"], r.text
    assert r.json()["type"] == "invalid_request_error" and r.json()["code"] == 400


def test_tool_level_failures_are_200_with_an_error() -> None:
    r = _tools_client().post("/tools", json={"tool": "read_file", "params": {"path": "/nonexistent/x"}})
    assert r.status_code == 200 and r.json() == {"error": "cannot stat file: /nonexistent/x"}


@pytest.mark.parametrize(
    ("runtime", "message"),
    [
        ("fake:does-not-exist", "unknown tool runtime: fake:does-not-exist"),
        ("ssh:-oProxyCommand=touch /tmp/pwned", "invalid ssh target: -oProxyCommand=touch /tmp/pwned"),
        ("docker-container:--privileged", "invalid container id: --privileged"),
        ("podman-container:--privileged", "invalid container id: --privileged"),
        ("docker:busybox", "tool runtime must name a running container: docker:busybox"),
    ],
)
def test_unusable_runtime_headers_are_500_and_never_run_on_the_host(
    runtime: str, message: str, tmp_path: Path
) -> None:
    marker = tmp_path / "ran"
    r = _tools_client().post(
        "/tools",
        headers={"x-tool-runtime": runtime},
        json={"tool": "exec_shell_command", "params": {"command": f"touch {marker}"}},
    )
    assert r.status_code == 500 and r.json() == {"code": 500, "message": message, "type": "server_error"}
    assert not marker.exists()
    r = _tools_client().post(
        "/tools",
        headers={"x-tool-runtime": runtime},
        json={"tool": "exec_shell_command", "params": {"command": f"touch {marker}"}, "stream": True},
    )
    assert r.status_code == 200 and sse_events(r.text) == [{"done": True, "error": message}]
    assert not marker.exists()


def test_exec_shell_command_streams_chunks_then_done(tmp_path: Path) -> None:
    r = _tools_client().post(
        "/tools",
        headers={"x-tool-cwd": str(tmp_path)},
        json={
            "tool": "exec_shell_command",
            "params": {"command": "pwd; echo err >&2; exit 3"},
            "stream": True,
        },
    )
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = sse_events(r.text)
    assert events[-1] == {"done": True}
    assert "".join(e["chunk"] for e in events[:-1]) == f"{os.path.realpath(tmp_path)}\nerr\n\n[exit code: 3]"


def test_stream_is_refused_for_tools_that_cannot_stream() -> None:
    r = _tools_client().post("/tools", json={"tool": "read_file", "params": {"path": "x"}, "stream": True})
    assert r.status_code == 404 and "does not support stream = true" in r.json()["error"]["message"]


def test_config_enables_tools_and_keeps_cors_local() -> None:
    cfg = load_config(["--tools", "read_file,grep_search"], {}, warn=lambda m: None).server
    assert cfg.tools == ("read_file", "grep_search") and cfg.cors_origins == "localhost"
    cfg = load_config(["-ag"], {}, warn=lambda m: None).server
    assert cfg.tools == ("all",) and cfg.mcp_proxy and cfg.cors_origins == "localhost"
    assert (
        load_config(["--tools", "all", "--cors-origins", "*"], {}, warn=lambda m: None).server.cors_origins
        == "*"
    )
    assert json.loads(json.dumps(list(cfg.tools))) == ["all"]


def test_stream_chunks_arrive_while_the_command_runs(tmp_path: Path) -> None:
    import time

    c = _tools_client()
    body = {
        "tool": "exec_shell_command",
        "params": {"command": "echo first; sleep 4; echo second"},
        "stream": True,
    }
    t0 = time.monotonic()
    with c.stream("POST", "/tools", json=body) as r:
        lines = r.iter_lines()
        first = next(line for line in lines if line)
        t_first = time.monotonic() - t0
        rest = [line for line in lines if line]
    assert first == 'data: {"chunk":"first\\n"}' and t_first < 3.5
    assert rest[-1] == 'data: {"done":true}' and 'data: {"chunk":"second\\n"}' in rest


def test_a_client_that_goes_away_stops_the_command(tmp_path: Path) -> None:
    import time

    marker = tmp_path / "marker"
    c = _tools_client()
    body = {
        "tool": "exec_shell_command",
        "stream": True,
        "params": {"command": f"echo first; sleep 1; echo more; sleep 1; touch {marker}"},
    }
    with c.stream("POST", "/tools", json=body) as r:
        assert next(line for line in r.iter_lines() if line) == 'data: {"chunk":"first\\n"}'
    time.sleep(3.5)
    assert not marker.exists()  # killed at its next output, before `touch`


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["--tools", "read_file,bogus"],
            'tools setup failed: unknown tool "bogus". available tools: read_file, '
            "file_glob_search, grep_search, exec_shell_command, write_file, edit_file, "
            "get_info",
        ),
        (["--tools", "all", "--tools-runtime", "ssh:-x"], "tools setup failed: invalid ssh target: -x"),
    ],
)
def test_unusable_tool_settings_stop_start_up(argv: list[str], message: str) -> None:
    import subprocess
    import sys

    from kvserve.model.files import default_model_path

    src = str(Path(__file__).resolve().parents[2] / "src")
    env = {**os.environ, "PYTHONPATH": src}
    proc = subprocess.run(
        [sys.executable, "-m", "kvserve", "-m", default_model_path(), *argv, "--port", "0"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert proc.returncode == 1 and message in proc.stderr, proc.stderr[-2000:]


FAKE_DOCKER = """#!/bin/sh
# a stand-in for docker: `exec [-i] ID CMD...` runs CMD here; `run --rm -i --cidfile F IMAGE sh` lives
# until its stdin closes
case "$1" in
  exec) shift; [ "$1" = -i ] && shift; echo "exec $1" >> "$FAKE_LOG"; shift; exec "$@" ;;
  run) echo "cid$$" > "$5"; echo "run $6" >> "$FAKE_LOG"; cat > /dev/null; echo stopped >> "$FAKE_LOG" ;;
  *) exit 2 ;;
esac
"""


@pytest.fixture
def fake_docker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "docker").write_text(FAKE_DOCKER)
    (bin_dir / "docker").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    log = tmp_path / "docker.log"
    monkeypatch.setenv("FAKE_LOG", str(log))
    return log


def test_runtime_header_runs_every_operation_through_the_container(fake_docker: Path, tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    c = _tools_client()
    h = {"x-tool-runtime": "docker-container:abc123", "x-tool-cwd": str(work)}
    r = c.post(
        "/tools", headers=h, json={"tool": "write_file", "params": {"path": "t.log", "content": "hi box\n"}}
    )
    assert r.json()["result"] == "file written successfully" and (work / "t.log").read_text() == "hi box\n"
    r = c.post("/tools", headers=h, json={"tool": "read_file", "params": {"path": "t.log"}})
    assert r.json() == {"plain_text_response": "hi box\n"}
    r = c.post(
        "/tools", headers=h, json={"tool": "exec_shell_command", "params": {"command": "cat t.log; pwd"}}
    )
    assert r.json() == {"plain_text_response": f"hi box\n{work}\n\n[exit code: 0]"}
    r = c.post("/tools", headers=h, json={"tool": "file_glob_search", "params": {"path": "."}})
    assert r.json()["entries"] == [{"path": "t.log", "type": "file"}]
    log = fake_docker.read_text().splitlines()
    assert log and set(log) == {"exec abc123"}  # nothing ran outside `docker exec abc123`


def test_tools_runtime_spawns_uses_and_stops_its_container(fake_docker: Path) -> None:
    c, _ = client(tools=("all",), tools_runtime="docker:busybox")
    r = c.post("/tools", json={"tool": "exec_shell_command", "params": {"command": "echo inside"}})
    assert r.json() == {"plain_text_response": "inside\n\n[exit code: 0]"}
    log = fake_docker.read_text().splitlines()
    assert log[0] == "run busybox" and log[1].startswith("exec cid")
    c.app.state.agent_tools.close()  # what the server does at shutdown
    assert fake_docker.read_text().splitlines()[-1] == "stopped"


def test_the_api_key_guards_the_tools(tmp_path: Path) -> None:
    c, _ = client(tools=("all",), api_keys=("sekret",))
    body = {"tool": "exec_shell_command", "params": {"command": f"touch {tmp_path / 'x'}"}}
    assert c.get("/tools").status_code == 401 and c.post("/tools", json=body).status_code == 401
    assert not (tmp_path / "x").exists()
    r = c.post("/tools", json=body, headers={"Authorization": "Bearer sekret"})
    assert r.status_code == 200 and (tmp_path / "x").exists()


def test_a_non_ascii_cwd_header(tmp_path: Path) -> None:
    d = tmp_path / "d\u00e9j\u00e0"
    d.mkdir()
    (d / "f.txt").write_text("ok")
    c = _tools_client()
    r = c.post(
        "/tools",
        json={"tool": "read_file", "params": {"path": "f.txt"}},
        headers=[("x-tool-cwd", str(d).encode("utf-8"))],  # type: ignore[arg-type]
    )
    assert r.json() == {"plain_text_response": "ok\n"}
