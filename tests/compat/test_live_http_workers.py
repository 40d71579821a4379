"""Several HTTP processes in front of the engine process (``KVSERVE_HTTP_WORKERS``): each serves
connections of the one port, all of them the same engine (answers, slots, unique request ids), and
they end with the server; a configuration that needs one process gets one."""

from __future__ import annotations

import os
import re
import signal
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from kvserve.server.http_workers import wanted
from kvserve.server.settings import ServerSettings

from .live import LiveServer, launch
from .test_live_engine_process import _children, _gone, cancel_a_stream

ARGS = ("-np", "4", "-c", "4096", "--metrics")
ENV = {"KVSERVE_ENGINE_PROCESS": "1", "KVSERVE_HTTP_WORKERS": "2"}


def _cmdline(pid: int) -> bytes:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return f.read()


def _processes(srv: LiveServer) -> list[int]:
    """The server's spawned processes (the engine's and the other HTTP processes), not multiprocessing's tracker."""
    return [p for p in _children(srv.proc.pid) if b"resource_tracker" not in _cmdline(p)]


@pytest.fixture(scope="module")
def server() -> Iterator[LiveServer]:
    srv = launch(*ARGS, env=ENV).wait(180)
    yield srv
    srv.stop()


def _complete(url: str, prompt: str) -> dict:
    # a connection of its own each: the kernel spreads connections over the processes
    with httpx.Client(timeout=120) as c:
        r = c.post(url + "/completion", json={"prompt": prompt, "n_predict": 8, "temperature": 0})
    assert r.status_code == 200, r.text
    return r.json()


def test_both_processes_serve_the_one_engine(server: LiveServer) -> None:
    assert len(_processes(server)) == 2  # the engine process and a second HTTP process
    assert "2 HTTP processes serve port" in server.log()
    prompts = [f"Item {i}: the colour of the sky is" for i in range(6)]
    alone = [_complete(server.url, p)["content"] for p in prompts]
    with ThreadPoolExecutor(12) as ex:
        together = list(ex.map(lambda i: _complete(server.url, prompts[i % 6])["content"], range(48)))
    assert together == [alone[i % 6] for i in range(48)]  # greedy: the same answers, whichever process
    # request ids come from both processes (odd: the first, even: the second) and never collide
    ids = [int(x) for x in re.findall(r"task (\d+): done", server.log())]
    assert len(ids) == len(set(ids)) >= 54
    assert {i % 2 for i in ids} == {0, 1}
    slots = httpx.get(server.url + "/slots", timeout=30).json()
    assert len(slots) == 4 and not any(s["is_processing"] for s in slots)
    m = httpx.get(server.url + "/metrics", timeout=30).text
    assert re.search(r"llamacpp:tokens_predicted_total (\d+)", m) and int(
        re.search(r"llamacpp:tokens_predicted_total (\d+)", m).group(1)) >= 54 * 8


def test_bad_input_and_a_cancelled_stream(server: LiveServer) -> None:
    for _ in range(4):  # (over several connections: both processes)
        with httpx.Client(timeout=30) as c:
            assert c.post(server.url + "/completion", content=b"{bad").status_code == 400
    cancel_a_stream(server.url)


def test_the_processes_end_together() -> None:
    srv = launch(*ARGS, env=ENV).wait(180)
    others = _processes(srv)
    srv.proc.send_signal(signal.SIGTERM)
    srv.proc.wait(timeout=30)
    assert all(_gone(p, 30) for p in others)
    assert "exited" not in srv.log()  # a clean end, not an engine or HTTP process lost
    # Ctrl-C in a terminal: SIGINT to every process of the group at once
    srv = launch(*ARGS, env=ENV).wait(180)
    others = _processes(srv)
    for pid in [srv.proc.pid, *others]:
        os.kill(pid, signal.SIGINT)
    srv.proc.wait(timeout=30)
    assert all(_gone(p, 30) for p in others)
    assert "exited" not in srv.log()
    # the second HTTP process dies: the server exits with an error status
    srv = launch(*ARGS, env=ENV).wait(180)
    try:
        worker = _listening(srv)
        os.kill(worker, signal.SIGKILL)
        assert srv.proc.wait(timeout=30) != 0
        assert "HTTP process kvserve-http-1 exited" in srv.log()
    finally:
        srv.stop()


def _listening(srv: LiveServer) -> int:
    """The spawned process that holds a listening socket of the server's port: the second HTTP process."""
    port = int(srv.url.rsplit(":", 1)[1])
    inodes = set()
    with open("/proc/net/tcp") as f:
        for line in f.readlines()[1:]:
            cols = line.split()
            if int(cols[1].split(":")[1], 16) == port and cols[3] == "0A":
                inodes.add(cols[9])
    for pid in _processes(srv):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if link.startswith("socket:[") and link[8:-1] in inodes:
                return pid
    raise AssertionError("no second HTTP process listens")


@pytest.mark.parametrize("kw,env,n", [
    ({}, {"KVSERVE_HTTP_WORKERS": "3"}, 3),
    ({}, {}, 1),
    ({}, {"KVSERVE_HTTP_WORKERS": "x"}, 1),
    ({"host": "/tmp/kv.sock"}, {"KVSERVE_HTTP_WORKERS": "3"}, 1),
    ({"tools": ("all",)}, {"KVSERVE_HTTP_WORKERS": "3"}, 1),
    ({"mcp_proxy": True}, {"KVSERVE_HTTP_WORKERS": "3"}, 1),
])
def test_how_many_processes(monkeypatch: pytest.MonkeyPatch, kw: dict, env: dict, n: int) -> None:
    monkeypatch.delenv("KVSERVE_HTTP_WORKERS", raising=False)
    monkeypatch.delenv("LLAMA_SERVER_ROUTER_PORT", raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert wanted(ServerSettings(**kw), engine_process=True) == n
    assert wanted(ServerSettings(**kw), engine_process=False) == 1
