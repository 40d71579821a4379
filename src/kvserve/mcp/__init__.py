"""MCP (Model Context Protocol) client: the servers of ``--mcp-servers-config`` /
``--mcp-servers-json``, whose tools ``/tools`` lists as ``<server>_<tool>`` and calls.

``config`` parses the configuration, ``stdio`` runs one server process (JSON-RPC 2.0 over
stdio), ``session`` speaks MCP over it, ``manager`` owns every server's lifecycle.
"""

from __future__ import annotations

from kvserve.mcp.config import McpConfigError, McpServerConfig, load_mcp_servers
from kvserve.mcp.manager import McpManager
from kvserve.mcp.session import McpTool

__all__ = ["McpConfigError", "McpManager", "McpServerConfig", "McpTool", "load_mcp_servers"]
