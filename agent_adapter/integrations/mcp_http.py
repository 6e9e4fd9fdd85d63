"""``hookbus mcp --http``: the MCP proxy (agent_adapter/integrations/mcp_proxy.py) over Streamable
HTTP, for clients that connect to a URL and for one proxy shared by a team.

Every request needs a tenant's bearer token (the gateway's token file, ``Tokens``: 401 before
the MCP layer reads anything); each MCP session (``Mcp-Session-Id``) is a HookBus session of its
token's tenant, ``<tenant>/mcp-<id>``, as the gateway scopes a tenant's sessions, and all of
them are in front of one server process.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Sequence
from typing import Any

import anyio
from mcp.client.session import ClientSession
from mcp.server.lowlevel.server import Server

from agent_adapter.integrations.mcp_proxy import (
    SESSION_END_SECS,
    McpProxy,
    build_server,
    normalise,
    upstream_stdio,
)
from bus import EventRunner

__all__ = ["HttpSessions", "http_app", "serve_http"]

log = logging.getLogger(__name__)


class HttpSessions:
    """The MCP sessions of ``hookbus mcp --http``: each HTTP session (``Mcp-Session-Id``) is a
    HookBus session of the tenant whose bearer token opened it, ``<tenant>/mcp-<id>`` (as the
    gateway scopes a tenant's sessions), all in front of one upstream server. OnSessionStart at
    its first request after ``initialize``, OnSessionStop when the session ends (the client's
    DELETE, the idle timeout)."""

    def __init__(self, hooks: EventRunner, upstream: ClientSession, server: str, tokens: Any):
        self.hooks = hooks
        self.upstream = upstream
        self.server = server
        self.tokens = tokens
        self.sessions: dict[str, McpProxy] = {}

    async def proxy_of(self, ctx: Any) -> McpProxy | str:
        request = getattr(ctx, "request", None)
        headers = getattr(request, "headers", {})
        tenant = self.tokens.tenant(headers.get("authorization"))
        if tenant is None:  # checked before the SDK saw the request; revoked since
            return "the bearer token is not accepted"
        http_id = headers.get("mcp-session-id")
        if not http_id:
            return "no MCP session (Mcp-Session-Id): initialize first"
        proxy = self.sessions.get(http_id)
        if proxy is None:
            proxy = McpProxy(self.hooks, self.upstream, self.server, f"{tenant}/mcp-{http_id}")
            self.sessions[http_id] = proxy
            await proxy.start()
            log.info("MCP session %s (tenant %s)", proxy.session_id, tenant)
        elif not proxy.session_id.startswith(f"{tenant}/"):
            return "this MCP session belongs to another tenant"
        return proxy

    async def ended(self, http_id: str) -> None:
        proxy = self.sessions.pop(http_id, None)
        if proxy is None:
            return
        with anyio.move_on_after(SESSION_END_SECS, shield=True):
            try:
                await proxy.stop()
            except Exception as exc:
                log.warning("OnSessionStop of %s not delivered: %s", proxy.session_id, exc)

    async def end_all(self) -> None:
        for http_id in list(self.sessions):
            await self.ended(http_id)


def http_app(server: Server[Any], sessions: HttpSessions, path: str = "/mcp") -> Any:
    """The Starlette app: ``path`` served by the SDK's Streamable HTTP session manager, every
    request first checked for a tenant's bearer token (401 without one)."""
    from mcp.server.streamable_http_manager import (
        StreamableHTTPASGIApp,
        StreamableHTTPSessionManager,
    )
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    class Manager(StreamableHTTPSessionManager):
        async def _discard_session(self, session_id: str, transport: Any) -> None:
            await super()._discard_session(session_id, transport)
            await sessions.ended(session_id)

    manager = Manager(app=server)
    inner = StreamableHTTPASGIApp(manager)

    class Guarded:  # an ASGI app (a class instance: Starlette's Route calls it as one)
        async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
            headers = {
                k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]
            }
            if sessions.tokens.tenant(headers.get("authorization")) is None:
                response = JSONResponse(
                    {"error": "a tenant's bearer token is needed (Authorization: Bearer <token>)"},
                    status_code=401,
                    headers={"WWW-Authenticate": "Bearer"},
                )
                await response(scope, receive, send)
                return
            await inner(scope, receive, send)

    @contextlib.asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[None]:
        async with manager.run():
            try:
                yield
            finally:
                await sessions.end_all()

    return Starlette(routes=[Route(path, endpoint=Guarded())], lifespan=lifespan)


async def serve_http(
    hooks: EventRunner,
    command: Sequence[str],
    tokens: Any,
    *,
    name: str | None = None,
    host: str = "127.0.0.1",
    port: int = 8788,
) -> None:
    """Serve MCP over Streamable HTTP at ``http://host:port/mcp``, ``command`` behind it."""
    import uvicorn

    async with upstream_stdio(command) as (upstream, init):
        server_name = name or init.server_info.name
        sessions = HttpSessions(hooks, upstream, server_name, tokens)
        server = build_server(upstream, init, sessions.proxy_of)
        app = http_app(server, sessions)
        log.info(
            "serving %s's tools as mcp__%s__* on http://%s:%d/mcp",
            init.server_info.name,
            normalise(server_name),
            host,
            port,
        )
        config = uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="on")
        await uvicorn.Server(config).serve()
