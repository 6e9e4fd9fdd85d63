"""The tool executor: one batch of tool calls, in parallel, along the specification's data flow.

For each call::

    PreToolUse hooks ─▶ final args ─▶ permission layers (checker, tool rule, session checker,
    hook Block / PermissionRequired) ─▶ resolve_permission_precedence ─▶ PermissionRequest hooks
    (first Override wins; P0–P2 Deny is locked) ─▶ Ask? the approver ─▶ Deny? PermissionDenied
    (fire-and-forget) and an error result ─▶ the tool ─▶ PostToolUse hooks ─▶ on error,
    PostToolUseFailure hooks. Async hooks run alongside, started by the hook runner.

Works with any ``EventRunner``: the embedded ``HookRegistry`` or the distributed client.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import msgspec

from agent_adapter.llm import ToolCall
from agent_adapter.permissions import (
    PermissionChecker,
    PrecedenceInputs,
    apply_permission_request,
    resolve_permission_precedence,
)
from agent_adapter.tools import Toolbox
from bus import (
    Block,
    BlockingError,
    EventRunner,
    PermissionDecision,
    PermissionDenialSource,
    PermissionDeniedContext,
    PermissionRequestContext,
    PermissionRequired,
    PostToolUseContext,
    PostToolUseFailureContext,
    PreToolUseContext,
    TaggedContext,
)
from bus.actions import ShadowedAnswer
from bus.aggregation import truncate
from bus.telemetry import tracing as telemetry

log = logging.getLogger("hookbus.executor")

#: Asks a person about a tool call: True allows, False denies, None means nobody answered.
Approver = Callable[[str, Mapping[str, Any], str], Awaitable[bool | None]]


class ToolMessage(msgspec.Struct, frozen=True):
    """What the LLM gets back for one tool call."""

    call_id: str
    tool_name: str
    content: str
    is_error: bool = False
    args: Any = None


class Denial(msgspec.Struct, frozen=True):
    tool_name: str
    reason: str
    source: PermissionDenialSource
    level: int


class ToolExecutionResult(msgspec.Struct, frozen=True, kw_only=True):
    """Everything one batch produced, in call order."""

    messages: list[ToolMessage]
    hook_contexts: list[TaggedContext]
    blocking_errors: list[BlockingError]
    warnings: list[str]
    post_permission_requests: list[tuple[str, str]]
    denials: list[Denial]
    metadata: list[dict[str, Any]]
    shadowed: list[ShadowedAnswer] = msgspec.field(default_factory=list)  # warn/dryrun answers


class _Call(msgspec.Struct, kw_only=True):
    message: ToolMessage
    contexts: list[TaggedContext] = msgspec.field(default_factory=list)
    blocks: list[BlockingError] = msgspec.field(default_factory=list)
    warnings: list[str] = msgspec.field(default_factory=list)
    requests: list[tuple[str, str]] = msgspec.field(default_factory=list)
    denial: Denial | None = None
    metadata: dict[str, Any] = msgspec.field(default_factory=dict)
    shadowed: list[ShadowedAnswer] = msgspec.field(default_factory=list)


class ToolExecutor:
    """Runs tool calls through hooks, permissions and tools.

    Args:
        hooks: the hook runner (embedded registry or distributed client).
        toolbox: the tools the agent may call.
        checker: the global PermissionChecker (P0 / P7), with the permission mode.
        session_checker: the session-level checker (P2 / P5).
        approver: asks a person when the decision is Ask; without one, Ask times out as Deny.
        approval_timeout: seconds to wait for the approver.
    """

    def __init__(
        self,
        hooks: EventRunner,
        toolbox: Toolbox,
        *,
        checker: PermissionChecker | None = None,
        session_checker: PermissionChecker | None = None,
        approver: Approver | None = None,
        approval_timeout: float = 30.0,
    ) -> None:
        self.hooks = hooks
        self.toolbox = toolbox
        self.checker = checker or PermissionChecker()
        self.session_checker = session_checker or PermissionChecker()
        self.approver = approver
        self.approval_timeout = approval_timeout

    async def execute_parallel(
        self,
        session_id: str,
        calls: Sequence[ToolCall],
        *,
        step: int,
        agent_name: str = "main",
        is_subagent: bool = False,
    ) -> ToolExecutionResult:
        done = await asyncio.gather(
            *(self._one(session_id, c, step, agent_name, is_subagent) for c in calls)
        )
        return ToolExecutionResult(
            messages=[d.message for d in done],
            hook_contexts=[c for d in done for c in d.contexts],
            blocking_errors=[b for d in done for b in d.blocks],
            warnings=[w for d in done for w in d.warnings],
            post_permission_requests=[r for d in done for r in d.requests],
            denials=[d.denial for d in done if d.denial is not None],
            metadata=[d.metadata for d in done],
            shadowed=[a for d in done for a in d.shadowed],
        )

    async def _one(
        self, session_id: str, call: ToolCall, step: int, agent_name: str, is_subagent: bool
    ) -> _Call:
        attrs = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": call.name,
                 "gen_ai.tool.call.id": call.id, "session.id": session_id,
                 "agent.name": agent_name}  # fmt: skip
        with telemetry.span(f"execute_tool {call.name}", attrs) as span:
            done = await self._run_call(session_id, call, step, agent_name, is_subagent)
            span.set_attribute("tool.is_error", done.message.is_error)
            return done

    async def _run_call(
        self, session_id: str, call: ToolCall, step: int, agent_name: str, is_subagent: bool
    ) -> _Call:
        tool = self.toolbox.get(call.name)
        raw_args = call.args if isinstance(call.args, dict) else {}
        if tool is None:
            problem = (
                f"unknown tool {call.name!r}; available tools: {', '.join(self.toolbox.names)}"
            )
            return await self._failed_before_run(
                session_id, call, raw_args, problem, step, agent_name
            )
        invalid = tool.validate(call.args)
        if invalid is not None:
            return await self._failed_before_run(
                session_id, call, raw_args, invalid, step, agent_name
            )

        out = _Call(message=ToolMessage(call.id, call.name, ""))
        pre = await self.hooks.run_pre_tool_use(
            PreToolUseContext(
                session_id=session_id, tool_name=tool.name, tool_args=raw_args, step=step
            )
        )
        args = pre.final_args
        out.contexts.extend(pre.tagged_contexts)
        out.blocks.extend(pre.blocking_errors)
        out.shadowed.extend(pre.shadowed)

        precedence = resolve_permission_precedence(
            PrecedenceInputs(
                checker=self.checker.check(tool.name, args, tool.kind),
                tool_rule=tool.rule(args) if tool.rule else None,
                session=self.session_checker.check(tool.name, args, tool.kind),
                hook_block=pre.action.reason if isinstance(pre.action, Block) else None,
                hook_block_enforced=any(s.enforced for s in pre.skipped),
                hook_permission_required=(
                    pre.action.permission if isinstance(pre.action, PermissionRequired) else None
                ),
            )
        )
        request = await self.hooks.run_on_permission_request(
            PermissionRequestContext(
                session_id=session_id,
                tool_name=tool.name,
                tool_args=args,
                current_decision=precedence.decision,
                permission_mode=self.checker.mode.value,
                is_subagent=is_subagent,
            )
        )
        out.contexts.extend(request.tagged_contexts)
        out.shadowed.extend(request.shadowed)
        final = apply_permission_request(precedence, request)
        if final.ignored_override:
            log.warning("%s: %s", tool.name, final.ignored_override)
        decision, reason, source = final.decision, final.reason, PermissionDenialSource.RULE
        if decision == PermissionDecision.ASK:
            decision, reason, source = await self._ask(tool.name, args, reason)
        if decision == PermissionDecision.DENY:
            await self.hooks.run_on_permission_denied(
                PermissionDeniedContext(
                    session_id=session_id, tool_name=tool.name, reason=reason, source=source
                )
            )
            out.denial = Denial(tool.name, reason, source, final.level)
            out.message = ToolMessage(
                call.id, tool.name, f"Permission denied ({source.value}): {reason}", True, args
            )
            return out

        t0 = time.perf_counter()
        try:
            output, is_error = await tool.run(dict(args)), False
        except Exception as exc:  # a failing tool is a result for the LLM, not a crash
            output, is_error = str(exc) or type(exc).__name__, True
        elapsed_ms = (time.perf_counter() - t0) * 1000
        limit = self.hooks.settings.max_output_chars
        if len(output) > limit:  # before any hook sees it: no message outgrows the wire limit
            marker = f"\n…[{len(output) - limit} more characters cut: output over {limit}]"
            output = truncate(output, limit, marker)
        post = await self.hooks.run_post_tool_use(
            PostToolUseContext(
                session_id=session_id,
                agent_name=agent_name,
                tool_name=tool.name,
                tool_args=args,
                output_content=output,
                is_error=is_error,
                step=step,
                elapsed_ms=elapsed_ms,
            )
        )
        content = post.final_content
        out.contexts.extend(post.tagged_contexts)
        out.warnings.extend(post.warnings)
        out.requests.extend(post.post_permission_requests)
        out.metadata.update(post.metadata)
        out.shadowed.extend(post.shadowed)
        if is_error:
            content = await self._failure(
                out, session_id, tool.name, args, content, step, agent_name, elapsed_ms
            )
        out.message = ToolMessage(call.id, tool.name, content, is_error, args)
        return out

    async def _ask(
        self, tool_name: str, args: Mapping[str, Any], reason: str
    ) -> tuple[PermissionDecision, str, PermissionDenialSource]:
        return await ask(self.approver, self.approval_timeout, tool_name, args, reason)

    async def _failure(
        self,
        out: _Call,
        session_id: str,
        tool_name: str,
        args: dict[str, Any],
        error: str,
        step: int,
        agent_name: str,
        elapsed_ms: float,
    ) -> str:
        failure = await self.hooks.run_on_post_tool_use_failure(
            PostToolUseFailureContext(
                session_id=session_id,
                agent_name=agent_name,
                tool_name=tool_name,
                error_message=error,
                step=step,
                elapsed_ms=elapsed_ms,
                tool_args=args,
            )
        )
        out.contexts.extend(failure.tagged_contexts)
        out.warnings.extend(failure.warnings)
        out.requests.extend(failure.post_permission_requests)
        out.metadata.update(failure.metadata)
        return failure.final_content

    async def _failed_before_run(
        self,
        session_id: str,
        call: ToolCall,
        args: dict[str, Any],
        problem: str,
        step: int,
        agent_name: str,
    ) -> _Call:
        """A call that cannot run at all (unknown tool, wrong arguments): an error result."""
        out = _Call(message=ToolMessage(call.id, call.name, problem, True, call.args))
        content = await self._failure(
            out, session_id, call.name, args, problem, step, agent_name, 0.0
        )
        out.message = ToolMessage(call.id, call.name, content, True, call.args)
        return out


async def ask(
    approver: Approver | None,
    timeout: float,
    tool_name: str,
    args: Mapping[str, Any],
    reason: str,
) -> tuple[PermissionDecision, str, PermissionDenialSource]:
    """Ask a person about a call that needs permission: the decision, the reason (saying why
    when nobody answered or the person said no) and who decided."""
    if approver is None:
        return PermissionDecision.DENY, f"{reason} (nobody to ask)", PermissionDenialSource.TIMEOUT
    try:
        answer = await asyncio.wait_for(approver(tool_name, args, reason), timeout)
    except TimeoutError:
        answer = None
    if answer is None:
        return PermissionDecision.DENY, f"{reason} (no answer)", PermissionDenialSource.TIMEOUT
    if answer:
        return PermissionDecision.ALLOW, reason, PermissionDenialSource.USER
    return PermissionDecision.DENY, f"{reason} (the user said no)", PermissionDenialSource.USER
