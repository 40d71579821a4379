"""MCP server configuration: the Cursor-style ``{"mcpServers": {NAME: {...}}}`` JSON that
``--mcp-servers-config FILE`` and ``--mcp-servers-json JSON`` give, parsed as llama-server does.

Each entry: ``command`` (required; an entry without one is skipped with a warning), ``args``
(strings), ``env`` (strings, merged over the server's own environment), ``cwd`` and
``timeout_ms`` (per JSON-RPC call, default 30000). A document without an ``mcpServers`` object
names no server. Invalid JSON, a missing file or a field of the wrong type is fatal at start-up
(``McpConfigError``), with llama-server's messages. Names are unique across both sources: a
repeated name is skipped with a warning.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

DEFAULT_TIMEOUT_MS = 30000


class McpConfigError(ValueError):
    """A configuration that keeps the server from starting (the message says why)."""


@dataclass(frozen=True)
class McpServerConfig:
    name: str  # the config key: tools are exposed as "<name>_<tool>"
    command: str
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    cwd: str | None = None
    timeout_ms: int = DEFAULT_TIMEOUT_MS


def _strings(value: Any, what: str) -> list[str]:
    if not all(isinstance(v, str) for v in value):
        raise McpConfigError(f"{what} must hold strings")
    return list(value)


def _entry(name: str, cfg: Any) -> McpServerConfig | None:
    if not isinstance(cfg, dict):
        raise McpConfigError(f"server '{name}' must be an object")
    command = cfg.get("command", "")
    cwd = cfg.get("cwd", "")
    timeout = cfg.get("timeout_ms", DEFAULT_TIMEOUT_MS)
    if not isinstance(command, str) or not isinstance(cwd, str):
        raise McpConfigError(f"server '{name}': 'command' and 'cwd' must be strings")
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise McpConfigError(f"server '{name}': 'timeout_ms' must be a number")
    args = cfg.get("args")
    env = cfg.get("env")
    if not command:
        return None
    return McpServerConfig(
        name=name,
        command=command,
        args=tuple(_strings(args, f"server '{name}': 'args'")) if isinstance(args, list) else (),
        env=MappingProxyType(
            dict(zip(env, _strings(env.values(), f"server '{name}': 'env'"), strict=True))
        ) if isinstance(env, dict) else MappingProxyType({}),
        cwd=cwd or None,
        timeout_ms=int(timeout),
    )


def parse_mcp_json(text: str, warn: Callable[[str], None]) -> list[McpServerConfig]:
    """The servers one JSON document names (raises ``McpConfigError``)."""
    try:
        doc = json.loads(text)
    except ValueError as e:
        raise McpConfigError(f"failed to parse MCP config JSON: {e}") from None
    servers = doc.get("mcpServers") if isinstance(doc, dict) else None
    if not isinstance(servers, dict):
        return []
    out: list[McpServerConfig] = []
    for name, cfg in servers.items():
        try:
            entry = _entry(name, cfg)
        except McpConfigError as e:
            raise McpConfigError(f"failed to parse MCP config JSON: {e}") from None
        if entry is None:
            warn(f"MCP server '{name}' has no command, skipping")
            continue
        out.append(entry)
    return out


def load_mcp_servers(config_path: str | None, inline_json: str | None,
                     warn: Callable[[str], None]) -> tuple[McpServerConfig, ...]:
    """Both sources, the file first; names stay unique (a repeated one is skipped)."""
    texts: list[str] = []
    if config_path:
        try:
            with open(config_path, encoding="utf-8") as f:
                texts.append(f.read())
        except (OSError, UnicodeDecodeError):
            raise McpConfigError(f"failed to open MCP config file: {config_path}") from None
    if inline_json:
        texts.append(inline_json)
    out: dict[str, McpServerConfig] = {}
    for text in texts:
        parsed = parse_mcp_json(text, warn)
        if not parsed:
            warn("MCP config: no servers found in JSON")
        for entry in parsed:
            if entry.name in out:
                warn(f"MCP config: duplicate server name '{entry.name}', skipping")
                continue
            out[entry.name] = entry
    return tuple(out.values())
