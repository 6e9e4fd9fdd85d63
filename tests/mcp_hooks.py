"""Hooks for tests/test_mcp_proxy.py: the demo's SecretGuard over the MCP filesystem server's
tools, named as ``hookbus mcp`` (and Claude Code) name MCP tools, ``mcp__SERVER__tool``."""

from __future__ import annotations

from bus import ToolMatchFilter
from workers.builtins.demo_hooks import SecretGuard


class McpSecretGuard(SecretGuard):
    """SecretGuard's Block on ``.env`` paths, for every MCP server's tools."""

    match_filter = ToolMatchFilter.parse(["mcp__*"], ["path:.env", "paths:.env"])
