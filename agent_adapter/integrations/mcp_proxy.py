"""``hookbus mcp``: HookBus in front of an MCP server, for any MCP client, unchanged.

The proxy is an MCP server to the client and an MCP client to the real server (both sides the
official SDK, ``mcp`` on PyPI). Over stdio the client launches it in place of the server::

    hookbus mcp --name filesystem -- npx @modelcontextprotocol/server-filesystem /srv/docs

and with ``--http`` it serves Streamable HTTP, a bearer token per tenant (the gateway's token
file), every client session in front of one server process (agent_adapter/integrations/mcp_http.py).

What is hooked:

* the MCP session: OnSessionStart when it starts, OnSessionStop when the client goes (stdio:
  its stdin closes, or SIGTERM; HTTP: DELETE or the idle timeout);
* ``tools/call``: PreToolUse on the call, with the tool named as Claude Code names MCP tools,
  ``mcp__SERVER__tool``, so that one rule set covers both. ``Block``: the server is not called
  and the client gets a tool result with ``isError`` and the reason (the model sees it);
  ``MutateInput``: the server gets the rewritten arguments; ``PermissionRequired``:
  PermissionRequest hooks decide, then the client's user by an MCP form elicitation where the
  client supports it, else the call is denied with the reason. The server's result goes through
  PostToolUse (and, when it is an error, PostToolUseFailure); an error the server raised
  instead of answering goes through PostToolUseFailure;
* a session cancelled (``hookbus cancel SESSION``: the CancellationHook's Block) has every later
  call refused.

The result is shown to hooks as a structured output (``PostToolUseContext.output_value``)::

    {"content": [<the content blocks, as on the wire>], "structuredContent": <if any>}

and a rewrite must keep that shape (``MutateOutput.of_value``: the built-in Redactor does); the
only exception is a result of one text block and no ``structuredContent``, shown as its text. A
rewrite that lost the shape, a PostToolUse hook that did not answer, Redis unreachable: the
output is withheld (an ``isError`` result saying so), never shown unchecked. An MCP client shows
the model ``structuredContent`` when there is one, so a rewrite of the text blocks alone would
leak.

Fail closed, under the hooks' policies: a call the hooks could not decide (the hook directory
not yet read, a ``fail`` hook it selects unreachable — its worker gone, or Redis down: the
coordinator fails a request it cannot send as unreachable) is refused, never forwarded
unchecked. The proxy does not ask Redis first: a call no ``fail`` hook selects goes on.

Not hooked, passed through untouched: ``tools/list`` (names as the server gives them),
resources (list, templates, read), prompts (list, get), completion. Not passed through:
requests the server makes of the client (sampling, elicitation, roots) and notifications
(logging, progress, list changes) — see docs/integrations.md, "MCP clients".
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio
import mcp_types as types
import msgspec
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.server.lowlevel.server import Server
from mcp.server.stdio import stdio_server

from agent_adapter.executor import Approver
from agent_adapter.integrations.gate import ToolGate, Verdict
from bus import (
    EventRunner,
    PostToolUseContext,
    PostToolUseFailureContext,
    SessionStartContext,
    SessionStopContext,
    TurnTerminal,
    render_system_reminder,
)
from bus.actions import PostToolUseResult, shape_mismatch
from workers.builtins.cancellation import RedisCancellationHook

__all__ = ["McpProxy", "build_server", "qualified_name", "serve_stdio", "upstream_stdio"]

log = logging.getLogger(__name__)

#: How a withheld output reads (bus.aggregation.WITHHELD's form).
WITHHELD = "[output withheld by HookBus: {reason}]"

#: Seconds the session-end work may take: ``stdio_client`` (the SDK's) waits about 2 s after
#: closing the proxy's stdin before it sends SIGTERM.
SESSION_END_SECS = 1.5

#: Seconds the client's user has to answer a permission request (MCP elicitation).
APPROVAL_SECS = 120.0


def qualified_name(server: str, tool: str) -> str:
    """The tool's name in HookBus contexts: Claude Code's form for MCP tools,
    ``mcp__SERVER__tool`` (characters other than letters, digits, ``_`` and ``-`` become
    ``_``, as Claude Code does)."""
    return f"mcp__{normalise(server)}__{tool}"


def normalise(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]", "_", name)


def _dump(model: Any) -> Any:
    return model.model_dump(mode="json", by_alias=True, exclude_none=True)


def _text_result(text: str, *, is_error: bool = True) -> types.CallToolResult:
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=text)], is_error=is_error
    )


#: The hook whose Block means "this session was cancelled" (``hookbus cancel``).
CANCELLATION_HOOK = RedisCancellationHook.name


@dataclass
class McpProxy:
    """One MCP session through HookBus: the hooks' side of the proxy.

    Args:
        hooks: ``HookClient`` (distributed) or ``HookRegistry`` (embedded).
        upstream: the SDK's client session to the real server (initialized).
        server: the server's name in qualified tool names (``mcp__SERVER__tool``).
    """

    hooks: EventRunner
    upstream: ClientSession
    server: str
    session_id: str = field(default_factory=lambda: f"mcp-{uuid.uuid4().hex}")
    cancelled: str | None = None  # why, once the session was cancelled
    calls: int = 0

    async def start(self) -> None:
        await self.hooks.run_on_session_start(SessionStartContext(session_id=self.session_id))

    async def stop(self, terminal: TurnTerminal = TurnTerminal.COMPLETED) -> None:
        if self.cancelled is not None:
            terminal = TurnTerminal.CANCELLED
        await self.hooks.run_on_session_stop(
            SessionStopContext(
                session_id=self.session_id, terminal=terminal, total_steps=self.calls
            )
        )

    async def call_tool(
        self, params: types.CallToolRequestParams, approver: Approver | None = None
    ) -> types.CallToolResult:
        """``tools/call`` through the hooks: never forwarded unless PreToolUse let it through.
        ``approver`` asks the client's user when a hook asks for permission (MCP elicitation);
        without one such a call is denied."""
        self.calls += 1
        step = self.calls
        name = qualified_name(self.server, params.name)
        if self.cancelled is not None:
            return _text_result(f"Tool call refused: {self.cancelled}")
        args = dict(params.arguments or {})
        try:
            verdict = await self._before(name, args, step, approver)
        except Exception as exc:  # Redis or the hooks unreachable: fail closed
            log.warning("tools/call %s refused: no hook decision (%s)", name, exc)
            return _text_result(f"Tool call refused by HookBus: the hooks could not decide ({exc})")
        if verdict.cancelled:
            self.cancelled = f"session {self.session_id} was cancelled ({verdict.refusal})"
        if verdict.refusal is not None:
            return _text_result("\n\n".join([verdict.refusal, *verdict.reminders]))
        t0 = time.perf_counter()
        try:
            result = await self.upstream.call_tool(params.name, verdict.args)
        except Exception as exc:  # a protocol error, or the server went away
            return await self._failed(name, verdict.args, str(exc) or type(exc).__name__, t0, step)
        if not isinstance(result, types.CallToolResult):
            return _text_result(
                f"Tool call refused by HookBus: {type(result).__name__} results are not proxied"
            )
        elapsed = (time.perf_counter() - t0) * 1000
        try:
            return await self._after(name, verdict.args, result, verdict.reminders, elapsed, step)
        except Exception as exc:
            log.warning("output of %s withheld: no hook decision (%s)", name, exc)
            return _text_result(WITHHELD.format(reason=f"the hooks could not inspect it ({exc})"))

    async def _before(
        self, name: str, args: dict[str, Any], step: int, approver: Approver | None
    ) -> Verdict:
        """PreToolUse, and on PermissionRequired the PermissionRequest hooks, then the user
        (``approver``): agent_adapter's ToolGate, as for the framework adapters."""
        gate = ToolGate(self.hooks, approver=approver, approval_timeout=APPROVAL_SECS)
        return await gate.before(self.session_id, name, args, step=step)

    async def _after(
        self,
        name: str,
        args: dict[str, Any],
        result: types.CallToolResult,
        reminders: tuple[str, ...],
        elapsed_ms: float,
        step: int,
    ) -> types.CallToolResult:
        content = [_dump(block) for block in result.content]
        plain = (
            len(content) == 1
            and content[0].get("type") == "text"
            and result.structured_content is None
        )
        value: Any = msgspec.UNSET
        if plain:
            text = content[0]["text"]
        else:
            value = {"content": content}
            if result.structured_content is not None:
                value["structuredContent"] = result.structured_content
            text = msgspec.json.encode(value).decode()
        post = await self.hooks.run_post_tool_use(
            PostToolUseContext(
                session_id=self.session_id,
                tool_name=name,
                tool_args=args,
                output_content=text,
                output_value=value,
                is_error=result.is_error,
                step=step,
                elapsed_ms=elapsed_ms,
            )
        )
        if lost := [f"{s.hook_name} ({s.kind})" for s in post.skipped]:
            # a hook that might have rewritten the output (a redactor) did not answer on it:
            # withheld, whatever its failure policy (an MCP client shows the model everything)
            why = f"the output of {name} was withheld: no answer from {', '.join(lost)}"
            log.warning("%s", why)
            return _text_result(WITHHELD.format(reason=why))
        final = post.final_content
        notes = [*reminders, *(render_system_reminder(c) for c in post.tagged_contexts)]
        notes += [render_system_reminder(w) for w in post.warnings]
        if result.is_error:
            failure = await self._failure(name, args, final, elapsed_ms, step)
            final = failure.final_content
            notes += [render_system_reminder(c) for c in failure.tagged_contexts]
            notes += [render_system_reminder(w) for w in failure.warnings]
        extra = [types.TextContent(type="text", text=n) for n in notes]
        if final == text:
            if not extra:
                return result  # unchanged: the server's result as it gave it
            return result.model_copy(update={"content": [*result.content, *extra]})
        if plain:
            block = result.content[0].model_copy(update={"text": final})
            return result.model_copy(update={"content": [block, *extra]})
        rewritten, why = _in_shape(value, final)
        if rewritten is None:
            log.warning("output of %s withheld: %s", name, why)
            return _text_result(WITHHELD.format(reason=f"the output of {name} {why}"))
        return types.CallToolResult.model_validate(
            {
                **_dump(result),
                "content": [*rewritten["content"], *(_dump(e) for e in extra)],
                **(
                    {"structuredContent": rewritten["structuredContent"]}
                    if "structuredContent" in value
                    else {}
                ),
            }
        )

    async def _failure(
        self, name: str, args: dict[str, Any], error: str, elapsed_ms: float, step: int
    ) -> PostToolUseResult:
        """PostToolUseFailure hooks on a call that failed with ``error``."""
        return await self.hooks.run_on_post_tool_use_failure(
            PostToolUseFailureContext(
                session_id=self.session_id,
                tool_name=name,
                error_message=error,
                step=step,
                elapsed_ms=elapsed_ms,
                tool_args=args,
            )
        )

    async def _failed(
        self, name: str, args: dict[str, Any], error: str, t0: float, step: int
    ) -> types.CallToolResult:
        elapsed = (time.perf_counter() - t0) * 1000
        try:
            failure = await self._failure(name, args, error, elapsed, step)
        except Exception as exc:
            return _text_result(WITHHELD.format(reason=f"the hooks could not inspect it ({exc})"))
        notes = [render_system_reminder(c) for c in failure.tagged_contexts]
        return _text_result("\n\n".join([failure.final_content, *notes]))


def _in_shape(original: dict[str, Any], final: str) -> tuple[dict[str, Any] | None, str]:
    """The hooks' rewrite as the result's parts, or None and why it cannot be used."""
    if final.startswith("[output withheld by HookBus"):
        return None, f"was withheld: {final}"
    try:
        value = msgspec.json.decode(final)
    except msgspec.DecodeError:
        value = None
    why = "is not a JSON object" if not isinstance(value, dict) else shape_mismatch(original, value)
    if why is not None:
        return None, (
            f"no longer had the shape of the tool's result after the hooks ({why}; a rewrite "
            "of a structured output must keep it: MutateOutput.of_value)"
        )
    return value, ""


def elicitation_approver(ctx: Any) -> Approver | None:
    """An approver that asks the client's user (an MCP form elicitation, answered yes with
    accept, no with decline, nothing with cancel), or None when the client cannot be asked."""
    session = getattr(ctx, "session", None)
    caps = getattr(session, "client_capabilities", None)
    elicitation = getattr(caps, "elicitation", None)
    if session is None or elicitation is None:
        return None
    if elicitation.form is None and elicitation.url is not None:  # URL mode only: no form
        return None

    async def approve(tool: str, args: Any, reason: str) -> bool | None:
        shown = msgspec.json.encode(args).decode()
        if len(shown) > 2000:
            shown = shown[:2000] + "…"
        try:
            answer = await session.elicit_form(
                f"HookBus: {tool} needs your permission ({reason}).\nArguments: {shown}\n"
                "Accept to run it, decline to refuse it.",
                {"type": "object", "properties": {}},
                related_request_id=getattr(ctx, "request_id", None),
            )
        except Exception as exc:  # the client failed the elicitation: no answer
            log.warning("asking the user about %s failed: %s", tool, exc)
            return None
        return {"accept": True, "decline": False}.get(answer.action)

    return approve


def build_server(
    upstream: ClientSession,
    upstream_init: types.InitializeResult,
    proxy_of: Callable[[Any], Awaitable[McpProxy | str]],
) -> Server[Any]:
    """The MCP server the client talks to: the upstream server's identity and capabilities,
    ``tools/call`` through the hooks (``await proxy_of(ctx)``: the session's ``McpProxy``),
    everything else passed through."""
    caps = upstream_init.capabilities
    handlers: dict[str, Any] = {}

    async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
        return await upstream.list_tools(params=params)

    async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        proxy = await proxy_of(ctx)
        if isinstance(proxy, str):  # refused: why
            return _text_result(f"Tool call refused by HookBus: {proxy}")
        return await proxy.call_tool(params, elicitation_approver(ctx))

    if caps.tools is not None:
        handlers.update(on_list_tools=list_tools, on_call_tool=call_tool)
    if caps.resources is not None:

        async def list_resources(ctx: Any, params: Any) -> types.ListResourcesResult:
            return await upstream.list_resources(params=params)

        async def list_templates(ctx: Any, params: Any) -> types.ListResourceTemplatesResult:
            return await upstream.list_resource_templates(params=params)

        async def read_resource(
            ctx: Any, params: types.ReadResourceRequestParams
        ) -> types.ReadResourceResult:
            return await upstream.read_resource(params.uri)

        handlers.update(
            on_list_resources=list_resources,
            on_list_resource_templates=list_templates,
            on_read_resource=read_resource,
        )
    if caps.prompts is not None:

        async def list_prompts(ctx: Any, params: Any) -> types.ListPromptsResult:
            return await upstream.list_prompts(params=params)

        async def get_prompt(
            ctx: Any, params: types.GetPromptRequestParams
        ) -> types.GetPromptResult:
            return await upstream.get_prompt(params.name, params.arguments)

        handlers.update(on_list_prompts=list_prompts, on_get_prompt=get_prompt)
    if caps.completions is not None:

        async def complete(ctx: Any, params: types.CompleteRequestParams) -> types.CompleteResult:
            context = params.context.arguments if params.context is not None else None
            return await upstream.complete(params.ref, params.argument.model_dump(), context)

        handlers.update(on_completion=complete)
    info = upstream_init.server_info
    return Server(
        info.name,
        version=info.version,
        title=info.title,
        instructions=upstream_init.instructions,
        **handlers,
    )


@contextlib.asynccontextmanager
async def upstream_stdio(command: Sequence[str]) -> AsyncIterator[tuple[ClientSession, Any]]:
    """The real server, launched with the proxy's own environment, as the SDK's client."""
    params = StdioServerParameters(command=command[0], args=list(command[1:]), env=dict(os.environ))
    async with (
        stdio_client(params, errlog=sys.stderr) as (read, write),
        ClientSession(read, write) as session,
    ):
        init = await session.initialize()
        yield session, init


async def serve_stdio(
    hooks: EventRunner,
    command: Sequence[str],
    name: str | None = None,
    session_id: str | None = None,
) -> None:
    """Serve one MCP session on this process's stdin/stdout, ``command`` behind it."""
    async with upstream_stdio(command) as (session, init):
        server_name = name or init.server_info.name
        proxy = McpProxy(hooks, session, server_name)
        if session_id:
            proxy.session_id = session_id
        log.info(
            "MCP session %s: %s's tools as mcp__%s__*",
            proxy.session_id,
            init.server_info.name,
            normalise(server_name),
        )

        async def the_proxy(ctx: Any) -> McpProxy | str:
            return proxy

        server = build_server(session, init, the_proxy)
        terminal = TurnTerminal.COMPLETED
        try:
            await proxy.start()
            async with anyio.create_task_group() as tg:

                async def on_term() -> None:
                    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                        async for _ in signals:
                            tg.cancel_scope.cancel()
                            return

                tg.start_soon(on_term)
                async with stdio_server() as (read, write):
                    await server.run(read, write, server.create_initialization_options())
                tg.cancel_scope.cancel()
        except BaseException:
            terminal = TurnTerminal.ERROR
            raise
        finally:
            with anyio.move_on_after(SESSION_END_SECS, shield=True):
                try:
                    await proxy.stop(terminal)
                except Exception as exc:
                    log.warning("OnSessionStop not delivered: %s", exc)
