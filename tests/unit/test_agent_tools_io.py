"""Tool I/O: the subprocess helper, the host I/O, the isolate I/O (driven through a transport that
runs its commands on this host, so every POSIX command line is exercised without a container),
runtime specs and their refusals, and --tools-runtime's container lifecycle (a fake engine binary)."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kvserve.server.agent_tools import subproc
from kvserve.server.agent_tools.io_base import ListKind
from kvserve.server.agent_tools.io_isolate import (
    ContainerIO,
    IsolateIO,
    SshIO,
    ToolRuntimeError,
    make_io,
    shell_quote_join,
)
from kvserve.server.agent_tools.io_local import LocalIO
from kvserve.server.agent_tools.runtime import ContainerRuntime, make_runtime


class HostIsolate(IsolateIO):
    """An "isolate" whose transport runs the command here (what `docker exec` would run inside)."""

    def build_argv(self, inner: list[str], needs_stdin: bool) -> list[str]:
        return inner


# --- subprocess ---------------------------------------------------------------------------------


def test_run_combines_output_and_reports_the_exit_code() -> None:
    res = subproc.run(["sh", "-c", "echo a; echo b >&2; exit 4"], 1000, 5)
    assert res == subproc.ExecResult("a\nb\n", 4, False)


def test_run_truncates_but_drains() -> None:
    res = subproc.run(["sh", "-c", "head -c 100000 /dev/zero | tr '\\0' x; echo done >&2"], 10, 10)
    assert res.output == "x" * 10 + "\n[output truncated]" and res.exit_code == 0


def test_timeout_kills_the_whole_process_group() -> None:
    t0 = time.monotonic()
    res = subproc.run(["sh", "-c", "echo a; sleep 30; echo b"], 1000, 1)
    assert time.monotonic() - t0 < 10  # `sleep` (a grandchild holding the pipe) was killed too
    assert res.output == "a\n" and res.timed_out and res.exit_code == 1


def test_on_chunk_false_stops_the_child() -> None:
    chunks: list[str] = []

    def on_chunk(c: str) -> bool:
        chunks.append(c)
        return False

    t0 = time.monotonic()
    subproc.run(["sh", "-c", "echo first; sleep 30; echo never"], 1000, 60, on_chunk)
    assert chunks == ["first\n"] and time.monotonic() - t0 < 10


def test_chunks_never_split_a_character() -> None:
    chunks: list[str] = []
    script = (
        "import sys,time; sys.stdout.buffer.write(b'\\xc3'); sys.stdout.flush(); time.sleep(0.2); "
        "sys.stdout.buffer.write(b'\\xa9'); sys.stdout.flush()"
    )
    subproc.run([sys.executable, "-c", script], 1000, 10, lambda c: chunks.append(c) is None)
    assert "".join(chunks) == "\u00e9"


def test_a_child_that_cannot_start() -> None:
    assert subproc.run(["/nonexistent/binary"], 100, 5) == subproc.ExecResult(
        "failed to spawn process", -1, False
    )
    assert LocalIO("/nonexistent/dir").run(["true"], 100, 5).output == "failed to spawn process"


# --- host I/O -----------------------------------------------------------------------------------


def test_local_resolve(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    io = LocalIO(str(tmp_path))
    assert io.resolve("a/../b/./c") == f"{tmp_path}/b/c"
    assert io.resolve("/abs/x/..") == "/abs"
    monkeypatch.setenv("HOME", "/home/me")
    assert io.resolve("~/f") == "/home/me/f" and io.resolve("~other/f") == f"{tmp_path}/~other/f"
    monkeypatch.chdir(tmp_path)
    assert LocalIO().resolve("x") == f"{os.getcwd()}/x"


def test_local_walker_skips_links_and_junk(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "f").write_text("")
    (tmp_path / "venv" / "lib").mkdir(parents=True)
    (tmp_path / "loop").symlink_to(tmp_path)  # listed, never walked
    listing = LocalIO().list_entries(str(tmp_path), 0, ListKind.ALL)
    assert sorted(listing.entries) == [("d", True), ("d/f", False), ("loop", True), ("venv", True)]
    assert not listing.truncated
    assert LocalIO().list_entries(str(tmp_path / "d" / "f"), 0, ListKind.FILES).err


# --- isolate I/O, through a transport that runs here --------------------------------------------


def test_isolate_file_operations(tmp_path: Path) -> None:
    io = HostIsolate(str(tmp_path))
    assert io.resolve("x") == f"{tmp_path}/x" and io.resolve("/abs") == "/abs"
    assert io.write_file("sub/f.bin", b"a\x00b\nc")
    assert (tmp_path / "sub" / "f.bin").read_bytes() == b"a\x00b\nc"
    assert io.read_file("sub/f.bin") == b"a\x00b\nc" and io.file_size("sub/f.bin") == 5
    assert io.is_regular_file("sub/f.bin") and io.is_directory("sub") and not io.is_directory("sub/f.bin")
    assert io.read_file("missing") is None and io.file_size("missing") is None


def test_isolate_listing_with_find(tmp_path: Path) -> None:
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "a" / "b" / "deep.txt").write_text("")
    (tmp_path / "top.txt").write_text("")
    (tmp_path / "node_modules" / "x").mkdir(parents=True)
    io = HostIsolate()
    got = io.list_entries(str(tmp_path), 0, ListKind.ALL)
    assert sorted(got.entries) == [
        ("a", True),
        ("a/b", True),
        ("a/b/deep.txt", False),
        ("node_modules", True),
        ("top.txt", False),
    ]
    assert sorted(io.list_entries(str(tmp_path), 1, ListKind.FILES).entries) == [("top.txt", False)]
    assert io.list_entries(str(tmp_path / "nope"), 0, ListKind.FILES).err


def test_isolate_run_uses_cwd_and_an_inner_timeout(tmp_path: Path) -> None:
    io = HostIsolate(str(tmp_path))
    assert io.run(["sh", "-c", "pwd"], 1000, 5).output == f"{tmp_path}\n"
    res = io.run(["sh", "-c", "sleep 20"], 1000, 1)
    assert res.exit_code == 124 and not res.timed_out  # `timeout 1s` inside the isolate ended it
    assert HostIsolate("/nonexistent").run(["true"], 1000, 5).exit_code == 127


def test_transport_command_lines() -> None:
    c = ContainerIO("podman", "abc123")
    assert c.build_argv(["cat", "f"], False) == ["podman", "exec", "abc123", "cat", "f"]
    assert c.build_argv(["sh"], True) == ["podman", "exec", "-i", "abc123", "sh"]
    s = SshIO("me@host")
    argv = s.build_argv(["sh", "-c", "echo 'it''s' $HOME"], False)
    assert argv[:9] == [
        "ssh",
        "-o",
        "BatchMode=yes",
        "-o",
        "PasswordAuthentication=no",
        "-o",
        "KbdInteractiveAuthentication=no",
        "-o",
        "StrictHostKeyChecking=yes",
    ]
    assert argv[9:11] == ["-n", "me@host"] and "-n" not in s.build_argv(["cat"], True)
    assert shlex.split(argv[-1]) == ["sh", "-c", "echo 'it''s' $HOME"]  # one word the remote shell re-parses


def test_shell_quote_join_round_trips_through_sh() -> None:
    argv = ["printf", "%s|", "a b", "it's", "$HOME", "`x`", '"q"', ""]
    out = subprocess.run(["sh", "-c", shell_quote_join(argv)], capture_output=True, text=True).stdout
    assert out == 'a b|it\'s|$HOME|`x`|"q"||'


@pytest.mark.parametrize(
    ("runtime", "message"),
    [
        ("fake:x", "unknown tool runtime: fake:x"),
        ("ssh:", "invalid ssh target: "),
        ("ssh:-oProxyCommand=touch /tmp/x", "invalid ssh target: -oProxyCommand=touch /tmp/x"),
        ("ssh:host;rm", "invalid ssh target: host;rm"),
        ("docker-container:", "invalid container id: "),
        ("docker-container:--privileged", "invalid container id: --privileged"),
        ("podman-container:_x", "invalid container id: _x"),
        ("docker-container:a b", "invalid container id: a b"),
        ("docker:busybox", "tool runtime must name a running container: docker:busybox"),
    ],
)
def test_runtime_refusals(runtime: str, message: str) -> None:
    with pytest.raises(ToolRuntimeError) as e:
        make_io("", runtime)
    assert str(e.value) == message


def test_runtime_specs_that_are_accepted() -> None:
    assert isinstance(make_io("/w", ""), LocalIO)
    io = make_io("/w", "podman-container:f00d.1_x-y")
    assert isinstance(io, ContainerIO) and io.engine == "podman" and io.container_id == "f00d.1_x-y"
    assert isinstance(make_io("", "ssh:me@host.example"), SshIO)


# --- --tools-runtime: a fake engine binary stands in for docker ---------------------------------

FAKE_ENGINE = """#!/bin/sh
# fake `docker run --rm -i --cidfile F IMAGE sh`: writes an id, then lives until stdin closes
[ "$1" = run ] || exit 2
echo "$*" >> "$FAKE_LOG"
cid=$5
echo "cid$$" > "$cid"
cat > /dev/null
echo stopped >> "$FAKE_LOG"
"""


def test_container_runtime_spawns_respawns_and_stops(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    engine = tmp_path / "docker"
    engine.write_text(FAKE_ENGINE)
    engine.chmod(0o755)
    log = tmp_path / "log"
    monkeypatch.setenv("FAKE_LOG", str(log))
    rt = ContainerRuntime(str(engine), "busybox")
    spec = rt.spec()
    assert spec.startswith(f"{engine}-container:cid")
    assert log.read_text().startswith("run --rm -i --cidfile ") and log.read_text().rstrip().endswith(
        "busybox sh"
    )
    assert rt._proc is not None
    rt._proc.kill()  # the container dies: the next call gets a new one
    rt._proc.wait()
    assert rt.spec() != spec
    rt.close()
    assert log.read_text().count("stopped") == 1  # closing stdin ended the second one


def test_container_runtime_failures(tmp_path: Path) -> None:
    with pytest.raises(ToolRuntimeError, match="requires an image name"):
        make_runtime("docker:")
    with pytest.raises(ToolRuntimeError, match="failed to spawn"):
        ContainerRuntime(str(tmp_path / "no-such-engine"), "img")
    quitter = tmp_path / "quits"
    quitter.write_text("#!/bin/sh\nexit 1\n")
    quitter.chmod(0o755)
    with pytest.raises(ToolRuntimeError, match="timed out waiting for .* container to start"):
        ContainerRuntime(str(quitter), "img")
    assert make_runtime("ssh:host").spec() == "ssh:host"
