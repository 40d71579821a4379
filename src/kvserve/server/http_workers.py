"""Several HTTP processes in front of the one engine process (``KVSERVE_HTTP_WORKERS=N``).

With the engine in a process of its own, what a burst of requests waits for is the HTTP side's
Python: each request's parsing, validation, tokenization, submission and response start run on
one interpreter, one request after another. N HTTP processes (the one started, and N − 1 spawned
here) each bind the listening port with ``SO_REUSEPORT``, so the kernel spreads new connections
over them, and each talks to the engine process over a pipe of its own (``RemoteEngine`` with
``conn``; ``engine_process`` serves every pipe): the requests' Python runs on N interpreters.
Each process builds its own tokenizer, chat template and app from the same configuration; the
engine's state (slots, metrics, the prompt cache) is the engine process's, the same from every
one of them. Request ids are unique across them (each takes the ids ≡ its index mod N).

Only where nothing an HTTP process holds must be one for all: TCP addresses only (no UNIX
socket), no agent tools, MCP servers or CORS proxy (their sessions and runtimes live in the
process that serves them), not a router's child. Otherwise one process, with a warning when more
were asked for. A spawned HTTP process that exits while the server runs ends the server, as the
engine process does.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger("kvserve")


def why_single(s: Any) -> str | None:
    """Why the server settings ``s`` (``ServerSettings``) need one HTTP process (None: they do not)."""
    hosts = [h.strip() for h in str(s.host).split(",") if h.strip()]
    if any(h.endswith(".sock") for h in hosts):
        return "a UNIX socket address"
    if s.tools or s.tools_runtime or s.mcp_servers or s.mcp_proxy:
        return "agent tools, MCP servers or the CORS proxy"
    if "LLAMA_SERVER_ROUTER_PORT" in os.environ:
        return "a router's model server"
    return None


def wanted(s: Any, engine_process: bool) -> int:
    """How many HTTP processes to run (``KVSERVE_HTTP_WORKERS``, default 1)."""
    raw = os.environ.get("KVSERVE_HTTP_WORKERS", "")
    try:
        n = int(raw) if raw else 1
    except ValueError:
        log.warning("KVSERVE_HTTP_WORKERS=%r is not a number: one HTTP process", raw)
        return 1
    if n <= 1:
        return 1
    why = "the engine runs in the serving process" if not engine_process else why_single(s)
    if why is not None:
        log.warning("KVSERVE_HTTP_WORKERS=%d: one HTTP process (%s)", n, why)
        return 1
    return n


def worker(conn: Any, index: int, n: int, n_slots: int, argv: list[str], log_args: dict[str, Any],
           port: int, text_side: Callable[[Any], tuple[Any, Any]], listening: Any) -> None:
    """A spawned HTTP process: the server of ``argv`` on ``port`` (bound with ``SO_REUSEPORT``
    beside the others), over the engine process's pipe ``conn``; ``text_side(cfg)`` builds its
    tokenizer and chat template; ``listening`` (an event) is set once its sockets listen."""
    logging.basicConfig(**log_args)
    from kvserve.config import load_config
    from kvserve.server.http_server import build_server
    from kvserve.server.remote_engine import RemoteEngine

    cfg = load_config(argv, os.environ)
    remote = RemoteEngine(n_slots, None, (), lambda: text_side(cfg), conn=conn, workers=n, worker=index)
    # listening only once ready: the kernel would hand this process connections it could only
    # answer 503 while the first one serves
    while not remote.ready:
        time.sleep(0.05)
    server, sockets, _ = build_server(remote, cfg, port=port, reuse_port=True)
    listening.set()
    try:
        server.run(sockets=sockets)
    finally:
        for sock in sockets:
            sock.close()
        remote.close()
    os._exit(0)


class Workers:
    """The spawned HTTP processes of a server (``start``), ended by ``stop`` before the engine."""

    def __init__(self) -> None:
        self.procs: list[Any] = []
        self._listening: list[Any] = []
        self._all_listening = False
        self._stopping = False

    def listening(self) -> bool:
        """Whether every one listens (ready: it binds its sockets once its engine side is). Read
        by every request (the server's readiness): the events are asked only until all are set."""
        if not self._all_listening:
            self._all_listening = all(e.is_set() for e in self._listening)
        return self._all_listening

    def start(self, conns: list[Any], n_slots: int, argv: list[str], log_args: dict[str, Any], port: int,
              text_side: Callable[[Any], tuple[Any, Any]]) -> None:
        """One process for each pipe of ``conns`` (``RemoteEngine.worker_conns``), serving ``port``;
        ``text_side``: a module-level function (it is pickled by name), as ``worker`` takes it."""
        ctx = multiprocessing.get_context("spawn")
        n = len(conns) + 1
        for i, conn in enumerate(conns, start=1):
            event = ctx.Event()
            self._listening.append(event)
            p = ctx.Process(target=worker, args=(conn, i, n, n_slots, argv, log_args, port, text_side, event),
                            name=f"kvserve-http-{i}", daemon=True)
            p.start()
            conn.close()
            self.procs.append(p)
            threading.Thread(target=self._watch, args=(p,), daemon=True).start()
        log.info("%d HTTP processes serve port %d", n, port)

    def _watch(self, p: Any) -> None:
        p.join()
        # ended by SIGINT or SIGTERM: the process group's (Ctrl-C reaches every process), this one
        # shuts down too
        if self._stopping or p.exitcode in (0, -signal.SIGINT, -signal.SIGTERM):
            return
        log.error("HTTP process %s exited (status %s)", p.name, p.exitcode)
        os._exit(p.exitcode if isinstance(p.exitcode, int) and p.exitcode > 0 else 1)

    def terminate(self) -> None:
        """SIGTERM to each: its server shuts down as this one does."""
        self._stopping = True
        for p in self.procs:
            if p.is_alive():
                p.terminate()

    def stop(self) -> None:
        """``terminate``, then wait for each (10 s, then SIGKILL)."""
        self.terminate()
        for p in self.procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
