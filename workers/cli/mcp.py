"""``hookbus mcp -- SERVER COMMAND …``: an MCP server proxied through HookBus, for any MCP
client (workers/integrations/mcp_proxy.py). The client launches this in place of the server;
the MCP session runs on stdin/stdout, and this process's log goes to stderr."""

from __future__ import annotations

import argparse
import os
import sys

from workers.cli.common import add_redis_options, settings_of


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    mcp = add_redis_options(
        sub.add_parser(
            "mcp",
            help="proxy an MCP server through HookBus (stdio): hookbus mcp -- COMMAND …",
            description=(
                "Serve MCP on stdin/stdout for a client, in front of the server COMMAND launches: "
                "tools/call goes through PreToolUse, PostToolUse and PostToolUseFailure (tools "
                "named mcp__NAME__tool), the session through OnSessionStart and OnSessionStop; "
                "a call the hooks could not decide is refused."
            ),
        )
    )
    mcp.add_argument(
        "--name",
        help="the server's name in tool names (mcp__NAME__tool): the name the client's MCP "
        "configuration gives it; default: the name the server gives itself",
    )
    mcp.add_argument(
        "--session",
        help="the session id in HookBus (for `hookbus cancel SESSION`, audit); default: a "
        "fresh mcp-… id, logged at start",
    )
    mcp.add_argument(
        "--http",
        action="store_true",
        help="serve Streamable HTTP at http://HOST:PORT/mcp (a bearer token per tenant) instead "
        "of stdio; one server process behind every client session",
    )
    mcp.add_argument("--host", default="127.0.0.1", help="--http: address (127.0.0.1)")
    mcp.add_argument("--port", type=int, default=8788, help="--http: port (8788)")
    mcp.add_argument(
        "--tokens",
        default=os.environ.get("HOOKBUS_GATEWAY_TOKENS"),
        metavar="FILE",
        help="--http: the tenants' tokens, `tenant:sha256hex` lines, as hookbus gateway's "
        "(default: $HOOKBUS_GATEWAY_TOKENS; `hookbus gateway --new-token TENANT --tokens FILE` "
        "adds one)",
    )
    mcp.add_argument("server", nargs=argparse.REMAINDER, metavar="-- COMMAND …")
    mcp.set_defaults(func=_mcp)


def _mcp(args: argparse.Namespace) -> int:
    command = list(args.server)
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        print("hookbus mcp: give the server's command after --", file=sys.stderr)
        return 2
    import anyio

    from agent_adapter.client import HookClient
    from workers.integrations.mcp_proxy import serve_stdio

    settings = settings_of(args)
    tokens = None
    if args.http:
        from workers.services.gateway import Tokens

        tokens = Tokens.load(args.tokens)  # a ConfigError (one line) without a usable file

    async def run() -> None:
        async with HookClient(settings, source="mcp") as hooks:
            if tokens is not None:
                from workers.integrations.mcp_http import serve_http

                await serve_http(
                    hooks, command, tokens, name=args.name, host=args.host, port=args.port
                )
            else:
                await serve_stdio(hooks, command, args.name, args.session)

    anyio.run(run)
    return 0
