"""Guards for MCP tools as ``hookbus mcp`` (and Claude Code) name them, ``mcp__SERVER__tool``.

The demo's SecretGuard matches the reference runtime's and Claude Code's own file tools; an MCP
server's tools have other names and arguments (the filesystem server's ``read_text_file``
takes ``path``, ``read_multiple_files`` takes ``paths``, ``move_file`` ``source`` and
``destination``). ``McpSecretGuard`` is the same guard over every MCP server's tools::

    hookbus worker workers.builtins.mcp_guards:McpSecretGuard
"""

from __future__ import annotations

from bus import ToolMatchFilter
from workers.builtins.demo_hooks import SecretGuard

__all__ = ["McpSecretGuard"]


class McpSecretGuard(SecretGuard):
    """Blocks any MCP tool call whose path arguments name a ``.env`` file (a Block with the
    reason; failure policy ``fail``: unreachable, it refuses the calls it would have seen)."""

    match_filter = ToolMatchFilter.parse(
        ["mcp__*"], ["path:.env", "paths:.env", "source:.env", "destination:.env"]
    )
