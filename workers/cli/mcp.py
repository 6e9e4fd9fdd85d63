"""``hookbus mcp -- SERVER COMMAND …``: an MCP server proxied through HookBus, for any MCP
client (agent_adapter/integrations/mcp_proxy.py). The client launches this in place of the server;
the MCP session runs on stdin/stdout, and this process's log goes to stderr."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import Any

from workers.cli.common import add_redis_options, settings_of

log = logging.getLogger("hookbus.mcp")


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
    from agent_adapter.integrations.mcp_proxy import serve_stdio

    settings = settings_of(args)
    access = None
    if args.http:
        from workers.services.gateway import TokenFile, Tokens

        if not args.tokens:
            Tokens.load(None)  # the gateway's one-line ConfigError: how to make a token file
        access = Access(TokenFile(args.tokens))

    async def run() -> None:
        async with HookClient(settings, source="mcp") as hooks:
            if access is None:
                await serve_stdio(hooks, command, args.name, args.session)
                return
            from agent_adapter.integrations.mcp_http import serve_http

            await access.read_tenants(hooks)
            async with anyio.create_task_group() as tg:
                tg.start_soon(access.keep_current, hooks)
                await serve_http(
                    hooks, command, access, name=args.name, host=args.host, port=args.port
                )
                tg.cancel_scope.cancel()

    anyio.run(run)
    return 0


class Access:
    """Who may use ``hookbus mcp --http``, as for the gateway: a token of the token file (read
    again when it changes) whose tenant the bus serves (``hookbus tenants add``; until a first
    read of ``{p}:tenants``, every tenant with a token)."""

    def __init__(self, token_file: Any) -> None:
        from workers.services.gateway import ServedTenants

        self.token_file = token_file
        self.served = ServedTenants()

    def tenant(self, authorization: str | None) -> str | None:
        tenant: str | None = self.token_file.tokens.tenant(authorization)
        return tenant if tenant is not None and self.served.serves(tenant) else None

    async def read_tenants(self, hooks: Any) -> None:
        import anyio

        try:
            with anyio.fail_after(2.0):
                await self.served.read(hooks.redis, hooks.keys.tenants)
        except Exception as exc:  # Redis unreachable: the last list read stays
            log.warning("cannot read the tenants the bus serves: %r", exc)

    async def keep_current(self, hooks: Any) -> None:
        """Follow ``{p}:tenants`` and the token file until cancelled."""
        import anyio

        from workers.services.gateway import Gateway

        while True:
            await anyio.sleep(Gateway.TENANTS_REFRESH_SECS)
            await self.read_tenants(hooks)
            self.token_file.check()
