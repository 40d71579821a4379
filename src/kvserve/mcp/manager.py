"""All configured MCP servers: the tool list found at start-up and one live process per server.

- ``warm_up()`` (at start-up, before the server listens): every server is spawned, asked for
  its tools within ``WARMUP_S`` and shut down again. A server that cannot start or answer
  contributes no tools; the others still do. The list is fixed from then on.
- ``call_tool()`` spawns the server's process on first use and keeps it for later calls; a
  process that died (crash, EOF) is replaced by the next call. A spawn failure makes the
  server unavailable for ``COOLDOWN_S`` ("MCP server unavailable: NAME").
- ``shutdown()`` fails the calls in flight ("cancelled") at once, refuses new ones and stops
  every process; it is idempotent.

All methods run on one event loop (``warm_up`` may run on another, earlier one: it keeps
nothing loop-bound).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from typing import Any

from kvserve.mcp.config import McpServerConfig
from kvserve.mcp.session import McpSession, McpTool
from kvserve.mcp.stdio import RpcError, StdioTransport

log = logging.getLogger("kvserve.mcp")

WARMUP_S = 10.0  # per server: tool discovery at start-up
COOLDOWN_S = 5.0  # after a failed spawn


class McpManager:
    def __init__(self, configs: Sequence[McpServerConfig], *, warmup_s: float = WARMUP_S,
                 cooldown_s: float = COOLDOWN_S) -> None:
        self.configs = {c.name: c for c in configs}
        self.warmup_s = warmup_s
        self.cooldown_s = cooldown_s
        self._tools: list[McpTool] = []
        self._sessions: dict[str, McpSession] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._dead_until: dict[str, float] = {}
        self._stopping = False

    @property
    def configured(self) -> bool:
        return bool(self.configs)

    def tools(self) -> list[McpTool]:
        return list(self._tools)

    def _session(self, cfg: McpServerConfig) -> McpSession:
        return McpSession(StdioTransport(cfg), cfg.timeout_ms / 1000.0)

    async def _discover(self, cfg: McpServerConfig) -> list[McpTool]:
        session = self._session(cfg)
        try:
            await session.transport.start()
        except (OSError, ValueError) as e:  # not found, not executable, a bad cwd, a NUL in an argument
            log.warning("MCP warmup: failed to spawn '%s': %s", cfg.name, e)
            return []
        try:
            tools = await session.list_tools(time.monotonic() + self.warmup_s)
        except RpcError as e:
            log.warning("MCP warmup: '%s': %s (%s)", cfg.name, e.message, session.transport.diagnostics())
            tools = []
        finally:
            await session.transport.close()
        log.info("MCP warmup: '%s' discovered %d tools", cfg.name, len(tools))
        return tools

    async def warm_up(self) -> None:
        found = await asyncio.gather(*(self._discover(c) for c in self.configs.values()))
        self._tools = [t for tools in found for t in tools]

    async def _live(self, name: str) -> McpSession | None:
        """The server's running session, spawned if needed; None while cooling down or stopping."""
        lock = self._locks.setdefault(name, asyncio.Lock())
        async with lock:
            if self._stopping:
                return None
            session = self._sessions.get(name)
            if session is not None:
                if session.transport.alive:
                    return session
                log.warning("MCP '%s' is no longer alive: %s", name, session.transport.diagnostics())
                del self._sessions[name]
                await session.transport.close()
            cfg = self.configs.get(name)
            if cfg is None or time.monotonic() < self._dead_until.get(name, 0.0):
                return None
            session = self._session(cfg)
            try:
                await session.transport.start()
            except (OSError, ValueError) as e:
                log.warning("MCP '%s': failed to start: %s", name, e)
                self._dead_until[name] = time.monotonic() + self.cooldown_s
                return None
            if self._stopping:  # shutdown() ran while the process started
                await session.transport.close("cancelled")
                return None
            self._sessions[name] = session
            return session

    async def call_tool(self, server: str, tool: str, arguments: Any) -> dict[str, Any]:
        """The ``/tools`` answer: ``{"plain_text_response": ...}`` or ``{"error": ...}``."""
        session = await self._live(server)
        if session is None:
            return {"error": f"MCP server unavailable: {server}"}
        if self._stopping:
            return {"error": "cancelled"}
        return await session.call_tool(tool, arguments)

    async def shutdown(self) -> None:
        self._stopping = True
        sessions = list(self._sessions.values())
        self._sessions.clear()
        await asyncio.gather(*(s.transport.close("cancelled") for s in sessions))
