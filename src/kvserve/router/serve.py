"""Run kvserve as llama-server's router (started without a model)."""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Sequence
from typing import Any

import uvicorn

from kvserve.args.spec import TRUTHY
from kvserve.mcp import McpManager
from kvserve.router.app import Router, create_router_app
from kvserve.router.catalog import catalog
from kvserve.router.pool import ModelPool
from kvserve.router.preset import LOAD_ON_STARTUP, PresetError
from kvserve.server import agent_tools, http_wire
from kvserve.server.http_server import bind_sockets, listen_url
from kvserve.server.settings import ServerSettings

log = logging.getLogger("kvserve.router")


class _RouterServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, pool: ModelPool, mcp: McpManager,
                 startup_models: Sequence[str] = ()) -> None:
        super().__init__(config)
        self.pool = pool
        self.mcp = mcp
        self.startup_models = tuple(startup_models)

    async def startup(self, sockets: list[Any] | None = None) -> None:
        await super().startup(sockets)
        for name in self.startup_models:  # a preset's load-on-startup
            log.info("(startup) loading model %s", name)
            await self.pool.load(name)

    async def shutdown(self, sockets: list[Any] | None = None) -> None:
        await self.mcp.shutdown()  # MCP calls in flight end first (see server/http_server.py)
        await self.pool.close()
        await super().shutdown(sockets)


def serve_router(cfg: Any, argv: Sequence[str], models_dir: str | None, models_max: int, autoload: bool,
                 models_preset: str | None = None) -> None:
    s = ServerSettings.from_config(cfg)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per proxied request otherwise
    try:
        entries = catalog(models_dir, models_preset)
    except ValueError as e:
        print(str(e), file=sys.stderr)
        sys.exit(1)
    except PresetError as e:
        print(f"error: failed to initialize router models: {e}", file=sys.stderr)
        sys.exit(1)
    startup = [n for n, e in entries.items() if e.options.get(LOAD_ON_STARTUP, "") in TRUTHY]
    if models_max > 0 and len(startup) > models_max:
        print(f"error: failed to initialize router models: number of models to load on startup "
              f"({len(startup)}) exceeds models_max ({models_max})", file=sys.stderr)
        sys.exit(1)
    # the router serves /tools itself (its children get the same flags, as llama-server's do)
    mcp = McpManager(s.mcp_servers)
    if mcp.configured:
        asyncio.run(mcp.warm_up())
    try:
        tools = agent_tools.setup(s, mcp)
    except agent_tools.ToolSetupError as e:
        print(f"tools setup failed: {e}", file=sys.stderr, flush=True)
        sys.exit(1)
    sockets = bind_sockets(s.host, s.port, s.reuse_port)
    port = s.port or int(sockets[0].getsockname()[1])
    pool = ModelPool(entries, argv, models_max, port, health_path=s.api_prefix + "/health")
    router = Router(pool, s, models_dir, models_max, autoload, models_preset)
    app = create_router_app(router, tools)
    level = "warning" if s.verbosity <= 2 else ("info" if s.verbosity == 3 else "debug")
    config = uvicorn.Config(app, log_level=level, access_log=s.verbosity >= 4, server_header=False,
                            lifespan="off", proxy_headers=False, http=http_wire.protocol_class(), **s.tls)
    log.info("available models (%d):", len(entries))
    for name, e in entries.items():
        extra = (f" (aliases: {', '.join(e.aliases)})" if e.aliases else "") + (
            f" [tags: {', '.join(e.tags)}]" if e.tags else "")
        log.info("  [%10s] %s%s", e.source, name, extra)
    log.warning("router mode enabled - do not expose to untrusted environments")
    log.info("starting server in router mode. models will be %s",
             "automatically loaded on-demand" if autoload else "loaded with POST /models/load")
    for sock in sockets:
        log.info("server is listening on %s", listen_url(sock, bool(s.tls)))
    server = _RouterServer(config, pool, mcp, startup)
    try:
        server.run(sockets=sockets)
    finally:
        for sock in sockets:
            sock.close()  # children still alive exit with the router (their stdin closes)
        if tools is not None:
            tools.close()  # e.g. the --tools-runtime container
