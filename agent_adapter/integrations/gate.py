"""``ToolGate``: one tool call of another framework's agent, through HookBus.

An adapter calls ``before`` when its framework is about to run a tool and ``after`` with the
tool's output; the gate dispatches the events and says what the framework is to do. It follows
the reference executor's data flow (``agent_adapter/executor.py``) for the parts a framework
leaves to hooks:

* PreToolUse ``Block``: the tool does not run; its result for the model is the refusal, and
  PermissionDenied is fired (source ``Rule``).
* PreToolUse ``MutateInput``: the tool runs with the rewritten arguments.
* PreToolUse ``PermissionRequired``: PermissionRequest hooks decide (``current_decision`` Ask):
  ``Override(Allow)`` runs the tool, ``Override(Deny)`` refuses it, anything else asks the
  ``approver``; with none, the call is denied ("nobody to ask", source ``Timeout``), as the
  executor does.
* PostToolUse (then, for a failed tool, PostToolUseFailure): ``MutateOutput`` replaces what the
  model sees; ``Warning(truncate_output)`` cuts it.
* Hook contexts and warnings reach the model as ``<system-reminder>`` blocks after the output.
* A ``Block`` from the ``CancellationHook`` (``hookbus cancel SESSION``) is a cancelled session:
  the verdict says so, and the adapters stop the run with ``SessionCancelled``.

Output longer than ``max_output_chars`` is cut before any hook sees it, and the model then gets
the cut text, never more than the hooks inspected.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from agent_adapter.executor import Approver
from agent_adapter.executor import ask as ask_approver
from bus import (
    Block,
    EventRunner,
    Override,
    PermissionDecision,
    PermissionDenialSource,
    PermissionDeniedContext,
    PermissionRequestContext,
    PermissionRequired,
    PostToolUseContext,
    PostToolUseFailureContext,
    PreToolUseContext,
    render_system_reminder,
)
from bus.aggregation import truncate
from workers.builtins.cancellation import RedisCancellationHook

#: The hook whose Block means "this session was cancelled" (``hookbus cancel``): the adapters
#: then stop the run (``SessionCancelled``), not only this one call.
CANCELLATION_HOOK = RedisCancellationHook.name


@dataclass(frozen=True, slots=True)
class Verdict:
    """What the framework is to do with one tool call."""

    args: dict[str, Any]  # the arguments to run the tool with (the hooks' final ones)
    refusal: str | None = None  # set: do not run the tool; this is its result for the model
    rewritten: bool = False  # a hook changed the arguments
    reminders: tuple[str, ...] = ()  # hook contexts for the model, to go after the output
    cancelled: bool = False  # the block came from the CancellationHook: the session is over


@dataclass(frozen=True, slots=True)
class Permission:
    """What PermissionRequest hooks (and, on Ask, the approver) decided."""

    decision: PermissionDecision  # ALLOW or DENY once an approver was asked; ASK if none was
    reason: str = ""
    reminders: tuple[str, ...] = ()


class ToolGate:
    """Tool calls of a foreign agent through a hook runner.

    Args:
        hooks: ``HookRegistry`` (embedded) or ``HookClient`` (distributed).
        approver: asks a person when a hook asks for permission and no PermissionRequest hook
            decides (True allows, False denies, None: no answer); without one such calls are
            denied.
        approval_timeout: seconds to wait for the approver.
        permission_mode: reported to PermissionRequest hooks as ``permission_mode``.
    """

    def __init__(
        self,
        hooks: EventRunner,
        *,
        approver: Approver | None = None,
        approval_timeout: float = 30.0,
        permission_mode: str = "default",
    ) -> None:
        self.hooks = hooks
        self.approver = approver
        self.approval_timeout = approval_timeout
        self.permission_mode = permission_mode

    async def before(
        self,
        session_id: str,
        tool_name: str,
        args: dict[str, Any],
        *,
        step: int = 0,
        is_subagent: bool = False,
    ) -> Verdict:
        """PreToolUse, and PermissionRequest when a hook asks for permission."""
        pre = await self.hooks.run_pre_tool_use(
            PreToolUseContext(session_id=session_id, tool_name=tool_name, tool_args=args, step=step)
        )
        reminders = tuple(render_system_reminder(c) for c in pre.tagged_contexts)
        final = pre.final_args
        if isinstance(pre.action, Block):
            reason = "; ".join(f"{b.hook_name}: {b.reason}" for b in pre.blocking_errors)
            await self._denied(session_id, tool_name, reason, PermissionDenialSource.RULE)
            cancelled = any(b.hook_name == CANCELLATION_HOOK for b in pre.blocking_errors)
            refusal = f"Tool call blocked by a hook. {reason}"
            return Verdict(final, refusal, False, reminders, cancelled)
        rewritten = final is not args and final != args
        if isinstance(pre.action, PermissionRequired):
            permission = await self.permission(
                session_id,
                tool_name,
                final,
                reason=f"{pre.action.permission} ({pre.action.tool_name})",
                is_subagent=is_subagent,
            )
            reminders += permission.reminders
            if permission.decision != PermissionDecision.ALLOW:
                return Verdict(
                    final, f"Permission denied: {permission.reason}", rewritten, reminders
                )
        return Verdict(final, None, rewritten, reminders)

    async def permission(
        self,
        session_id: str,
        tool_name: str,
        args: Mapping[str, Any],
        *,
        reason: str = "",
        is_subagent: bool = False,
        ask: bool = True,
    ) -> Permission:
        """PermissionRequest hooks on a call that needs permission; on Ask, the approver (unless
        ``ask`` is False: then Ask is returned for the framework's own approval flow). A denial
        fires PermissionDenied."""
        result = await self.hooks.run_on_permission_request(
            PermissionRequestContext(
                session_id=session_id,
                tool_name=tool_name,
                tool_args=dict(args),
                current_decision=PermissionDecision.ASK,
                permission_mode=self.permission_mode,
                is_subagent=is_subagent,
            )
        )
        reminders = tuple(render_system_reminder(c) for c in result.tagged_contexts)
        decision, source = PermissionDecision.ASK, PermissionDenialSource.RULE
        if isinstance(result.action, Override):
            decision = result.action.decision
            why = result.action.reason
            reason = f"{result.overridden_by}: {why}" if why else str(result.overridden_by)
        if decision == PermissionDecision.ASK and ask:
            decision, reason, source = await ask_approver(
                self.approver, self.approval_timeout, tool_name, args, reason
            )
        if decision == PermissionDecision.DENY:
            await self._denied(session_id, tool_name, reason, source)
        return Permission(decision, reason, reminders)

    async def after(
        self,
        session_id: str,
        tool_name: str,
        args: dict[str, Any],
        output: str,
        *,
        is_error: bool = False,
        elapsed_ms: float = 0.0,
        step: int = 0,
        agent_name: str = "main",
        reminders: tuple[str, ...] = (),
    ) -> str:
        """PostToolUse (and PostToolUseFailure for a failed tool): what the model is to see."""
        limit = self.hooks.settings.max_output_chars
        if len(output) > limit:  # as the executor: no message outgrows the wire limit
            marker = f"\n…[{len(output) - limit} more characters cut: output over {limit}]"
            output = truncate(output, limit, marker)
        post = await self.hooks.run_post_tool_use(
            PostToolUseContext(
                session_id=session_id,
                agent_name=agent_name,
                tool_name=tool_name,
                tool_args=args,
                output_content=output,
                is_error=is_error,
                step=step,
                elapsed_ms=elapsed_ms,
            )
        )
        content = post.final_content
        notes = [*reminders, *(render_system_reminder(c) for c in post.tagged_contexts)]
        notes += [render_system_reminder(w) for w in post.warnings]
        if is_error:
            failure = await self.hooks.run_on_post_tool_use_failure(
                PostToolUseFailureContext(
                    session_id=session_id,
                    agent_name=agent_name,
                    tool_name=tool_name,
                    error_message=content,
                    step=step,
                    elapsed_ms=elapsed_ms,
                    tool_args=args,
                )
            )
            content = failure.final_content
            notes += [render_system_reminder(c) for c in failure.tagged_contexts]
            notes += [render_system_reminder(w) for w in failure.warnings]
        return "\n\n".join([content, *notes])

    async def _denied(
        self, session_id: str, tool_name: str, reason: str, source: PermissionDenialSource
    ) -> None:
        await self.hooks.run_on_permission_denied(
            PermissionDeniedContext(
                session_id=session_id, tool_name=tool_name, reason=reason, source=source
            )
        )


def elapsed_ms(t0: float) -> float:
    """Milliseconds since ``t0`` (a ``time.perf_counter()`` reading)."""
    return (time.perf_counter() - t0) * 1000
