"""Run the app with uvicorn on llama-server's listen addresses.

``--host`` is a CSV list; entries ending in ``.sock`` are UNIX sockets; with several TCP
addresses IPv6 sockets are v6-only; ``--port 0`` (any free port) needs a single TCP host. With ``--ssl-key-file`` and ``--ssl-cert-file``
every address serves HTTPS.
The MCP servers' tools are discovered before the server listens (as llama-server does); when
it stops, MCP calls in flight end first, so that draining the connections does not wait on them.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from typing import Any, Callable

import uvicorn

from kvserve.mcp import McpManager
from kvserve.server import http_wire
from kvserve.server.app import create_app, settings_for
from kvserve.server.engine_api import EngineAPI
from kvserve.server.settings import ServerSettings

log = logging.getLogger("kvserve.server")


def bind_sockets(hosts: str, port: int, reuse_port: bool = False) -> list[socket.socket]:
    entries = [h.strip() for h in hosts.split(",") if h.strip()] or ["127.0.0.1"]
    tcp = [h for h in entries if not h.endswith(".sock")]
    if port == 0 and len(tcp) > 1:
        raise ValueError("--port 0 (any free port) needs a single TCP --host")
    out: list[socket.socket] = []
    try:
        for h in entries:
            if h.endswith(".sock"):
                if os.path.exists(h):
                    os.unlink(h)
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                sock.bind(h)
            else:
                family, type_, proto, _, addr = socket.getaddrinfo(
                    h, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
                sock = socket.socket(family, type_, proto)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                if reuse_port and hasattr(socket, "SO_REUSEPORT"):
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
                if family == socket.AF_INET6 and len(tcp) > 1:
                    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                sock.bind(addr)
            sock.listen(2048)
            sock.set_inheritable(True)
            out.append(sock)
    except BaseException:
        for sock in out:
            sock.close()
        raise
    return out


def listen_url(sock: socket.socket, tls: bool = False) -> str:
    if sock.family == socket.AF_UNIX:
        return f"unix://{sock.getsockname()}"
    host, port = sock.getsockname()[:2]
    scheme = "https" if tls else "http"
    return f"{scheme}://[{host}]:{port}" if sock.family == socket.AF_INET6 else f"{scheme}://{host}:{port}"


class _Server(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, mcp: McpManager) -> None:
        super().__init__(config)
        self.mcp = mcp
        self.others: Any = None  # the other HTTP processes (``http_workers.Workers``), ended first

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        # (uvicorn raises the signal that stopped it again once it has shut down: what must end
        # with the server ends here, not after ``run``)
        if self.others is not None:
            self.others.terminate()
        await self.mcp.shutdown()
        await super().shutdown(sockets)
        if self.others is not None:
            await asyncio.to_thread(self.others.stop)


def build_server(engine: EngineAPI, cfg: Any, *, warm_up: bool = False, port: int | None = None,
                 reuse_port: bool = False) -> tuple[uvicorn.Server, list[socket.socket], ServerSettings]:
    """The uvicorn server and its bound sockets (``await server.serve(sockets=...)`` to run
    inside an existing event loop). ``warm_up`` (outside any running loop): the MCP servers'
    tools are discovered first. ``port`` instead of ``--port``; ``reuse_port``: bound with
    ``SO_REUSEPORT`` even without ``--reuse-port`` (several HTTP processes, ``http_workers``)."""
    s = settings_for(engine, cfg)
    mcp = McpManager(s.mcp_servers)
    if warm_up and mcp.configured:
        asyncio.run(mcp.warm_up())
    app = create_app(engine, s, mcp)
    level = "warning" if s.verbosity <= 2 else ("info" if s.verbosity == 3 else "debug")
    config = uvicorn.Config(
        app,
        log_level=level,
        access_log=s.verbosity >= 4,  # request lines are trace-level in llama-server
        server_header=False,  # the middleware sends ``Server: llama.cpp``
        lifespan="off",
        proxy_headers=False,
        http=http_wire.protocol_class(),  # httptools, header names kept as llama-server's
        **s.tls,  # --ssl-key-file and --ssl-cert-file: HTTPS
    )
    sockets = bind_sockets(s.host, s.port if port is None else port, s.reuse_port or reuse_port)
    return _Server(config, mcp), sockets, s


def serve(engine: EngineAPI, cfg: Any, workers: Callable[[int], Any] | None = None) -> None:
    """Serve until SIGINT/SIGTERM (blocking). ``workers``: more HTTP processes to start once the
    port is bound (``http_workers``; called with the port, it returns what to ``stop()`` first
    at the end)."""
    server, sockets, s = build_server(engine, cfg, warm_up=True, reuse_port=workers is not None)
    for sock in sockets:
        log.info("server is listening on %s", listen_url(sock, bool(s.tls)) + s.api_prefix)
    if workers is not None and isinstance(server, _Server):
        server.others = workers(sockets[0].getsockname()[1])
    if not s.ui:
        log.info("the Web UI is disabled (--ui / --no-ui)")
    if s.cors_origins == "*" and not s.api_keys:
        log.warning("CORS allows any origin and no API key is set")
    try:
        server.run(sockets=sockets)
    finally:
        if getattr(server, "others", None) is not None:
            server.others.stop()  # (run ended without a signal)
        for sock in sockets:
            sock.close()
        registry = getattr(server.config.app.state, "agent_tools", None)
        if registry is not None:
            registry.close()  # e.g. the --tools-runtime container
