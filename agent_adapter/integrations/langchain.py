"""HookBus around a LangChain 1.x / LangGraph agent (``pip install 'hookbus[langgraph]'``).

::

    agent = create_agent(model, tools, middleware=[HookBusMiddleware(hooks)])
    await agent.ainvoke({"messages": [...]}, {"configurable": {"thread_id": "s-1"}})

``HookBusMiddleware`` is an ``AgentMiddleware`` (LangChain's documented way into
``create_agent``'s loop). Its ``wrap_tool_call`` / ``awrap_tool_call`` put every tool call
through HookBus:

* PreToolUse ``Block``: the tool does not run; the model gets the refusal as an error
  ``ToolMessage``.
* PreToolUse ``MutateInput``: the tool runs with the rewritten arguments
  (``request.override(tool_call=…)``).
* PostToolUse ``MutateOutput``: the model gets the rewritten ``ToolMessage`` content. Content
  that is not text (a list of content blocks) is shown to hooks as JSON. A ``ToolMessage`` with
  ``status="error"`` is a failed call: PostToolUse, then PostToolUseFailure. A tool that raises
  gets PostToolUseFailure, and the exception goes on. A tool that returns a LangGraph
  ``Command`` is passed on as it is (it has no output to rewrite).

``middleware.tool_node(tools)`` is a LangGraph ``ToolNode`` with the same wrappers, for
``create_react_agent`` and hand-built ``StateGraph``s (tool events only: a graph has no
middleware lifecycle). The rest of ``create_agent``'s loop: ``before_agent`` is OnSessionStart,
``after_model`` OnStepComplete, ``after_agent`` OnSessionStop (``Cancelled`` for a cancelled
session, then ``SessionCancelled`` is raised); ``decide_interrupt`` runs PermissionRequest hooks
on a ``HumanInTheLoopMiddleware`` interrupt; ``approver=ask_by_interrupt`` asks a person about a
hook's ``PermissionRequired`` with LangGraph's ``interrupt`` (approve / edit / reject; an edit is
checked by PreToolUse from the start). Every LangChain hook and its HookBus counterpart, or none,
and what a pause does to the session, is in docs/integrations.md's table
(tests/test_integrations_doc.py checks it against this module). The session is the run's
``thread_id`` (``config["configurable"]["thread_id"]``), else the middleware's ``session_id``.

Synchronous ``invoke`` works too: HookBus's runners are asyncio objects bound to the event loop
that made them, so the middleware then needs ``portal=``, an anyio ``BlockingPortal`` whose loop
owns ``hooks`` (``anyio.from_thread.start_blocking_portal()``); without one a synchronous call
fails with a ``ConfigError`` that says so.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import replace
from typing import Any

try:
    from anyio.from_thread import BlockingPortal
    from langchain.agents.middleware import AgentMiddleware
    from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
    from langgraph.config import get_config
    from langgraph.prebuilt.tool_node import ToolCallRequest, ToolNode
    from langgraph.runtime import Runtime
    from langgraph.types import interrupt
except ModuleNotFoundError as exc:  # say which extra brings it, not only which module is missing
    raise ModuleNotFoundError(
        f"{exc}: HookBus's LangChain/LangGraph middleware needs pip install 'hookbus[langgraph]'",
        name=exc.name,
    ) from exc

from agent_adapter.executor import Approver
from agent_adapter.integrations.gate import ToolGate, Verdict, elapsed_ms
from bus import (
    ConfigError,
    EventRunner,
    PermissionDecision,
    SessionCancelled,
    SessionStartContext,
    SessionStopContext,
    StepCompleteContext,
    TurnTerminal,
    render_system_reminder,
)

ToolResult = Any  # ToolMessage | langgraph.types.Command
DECISIONS = ["approve", "edit", "reject"]  # what ask_by_interrupt's person may answer


class _Edited(Exception):
    """A person answered ``ask_by_interrupt`` with edited arguments: a new call to check."""

    def __init__(self, args: dict[str, Any]) -> None:
        super().__init__("the call was edited")
        self.edited = args


async def ask_by_interrupt(tool_name: str, args: Mapping[str, Any], reason: str) -> bool:
    """An ``approver`` that asks a person with LangGraph's ``interrupt``: the run pauses (it
    needs a checkpointer) with a ``HumanInTheLoopMiddleware``-shaped request (``action_requests``
    with the call as the hooks left it and the hook's reason as its ``description``), and is
    resumed with ``Command(resume={"decisions": [decision]})``: ``{"type": "approve"}``,
    ``{"type": "reject"}``, or ``{"type": "edit", "edited_action": {"name": tool_name, "args":
    {...}}}``. An edit is a new call: PreToolUse checks the edited arguments from the start (a
    hook may block or rewrite them, or ask again), never run unchecked."""
    answer = interrupt(
        {
            "action_requests": [{"name": tool_name, "args": dict(args), "description": reason}],
            "review_configs": [{"action_name": tool_name, "allowed_decisions": DECISIONS}],
        }
    )
    decisions = answer.get("decisions") if isinstance(answer, Mapping) else None
    decision = decisions[0] if isinstance(decisions, list) and len(decisions) == 1 else None
    kind = decision.get("type") if isinstance(decision, Mapping) else None
    if kind == "approve":
        return True
    if kind == "reject":
        return False
    edited = decision.get("edited_action") if kind == "edit" and decision else None
    if not isinstance(edited, Mapping) or edited.get("name", tool_name) != tool_name:
        edited = None  # not an edit, or one of another tool
    if edited is not None and isinstance(edited.get("args"), Mapping):
        raise _Edited(dict(edited["args"]))
    raise ConfigError(
        f"the answer to {tool_name}'s approval is not one decision of {DECISIONS} on that "
        f"tool (an edit names the tool and gives args): {answer!r}"
    )


def _session(config: Mapping[str, Any] | None, default: str) -> str:
    thread = ((config or {}).get("configurable") or {}).get("thread_id")
    return str(thread) if thread else default


def _node_config() -> Mapping[str, Any]:
    try:
        return get_config()
    except RuntimeError:  # called outside a LangGraph run (a test calling the hook itself)
        return {}


def _turn(state: Mapping[str, Any]) -> tuple[int, int]:
    """(human messages before the last one, model answers since it)."""
    messages = state.get("messages") or []
    humans = steps = 0
    for m in messages:
        if isinstance(m, HumanMessage):
            humans, steps = humans + 1, 0
        elif isinstance(m, AIMessage):
            steps += 1
    return max(humans - 1, 0), steps


def _text(content: Any) -> str:
    return content if isinstance(content, str) else json.dumps(content, ensure_ascii=False)


class HookBusMiddleware(AgentMiddleware):  # type: ignore[type-arg]
    """HookBus in a ``create_agent`` loop.

    Args:
        hooks: ``HookRegistry`` (embedded) or ``HookClient`` (distributed).
        session_id: the session of runs without a ``thread_id``; a fresh id by default.
        approver: asks a person when a PreToolUse hook answers ``PermissionRequired`` and no
            PermissionRequest hook decides: ``async def approver(tool_name, args, reason) ->
            bool | None`` (``agent_adapter.executor.Approver``: ``True`` runs the call, ``False``
            or ``None`` denies it), or ``ask_by_interrupt``, which pauses the run with LangGraph's
            ``interrupt`` and takes approve / edit / reject. Without one those calls are denied.
        portal: for synchronous ``invoke``/``stream``: a portal into the loop that owns ``hooks``.
    """

    def __init__(
        self,
        hooks: EventRunner,
        *,
        session_id: str | None = None,
        approver: Approver | None = None,
        portal: BlockingPortal | None = None,
    ) -> None:
        super().__init__()
        self.hooks = hooks
        self.gate = ToolGate(hooks, approver=approver)
        self.session_id = session_id or f"langgraph-{uuid.uuid4().hex[:12]}"
        self.portal = portal
        self._stopped: set[str] = set()  # sessions whose run stopped as cancelled

    def _call(self, fn: Callable[..., Awaitable[Any]], *args: Any, **kwargs: Any) -> Any:
        if self.portal is None:
            raise ConfigError(
                "HookBusMiddleware in a synchronous invoke() needs portal=, a BlockingPortal "
                "into the event loop that owns its hooks (or call ainvoke())"
            )
        return self.portal.call(lambda: fn(*args, **kwargs))

    # -- session and steps -------------------------------------------------------------------

    async def _start(self, session: str, state: Mapping[str, Any]) -> None:
        self._stopped.discard(session)
        turn, _ = _turn(state)
        await self.hooks.run_on_session_start(
            SessionStartContext(session_id=session, turn_index=turn, is_resume=turn > 0)
        )

    async def _step(self, session: str, state: Mapping[str, Any], limit: int) -> None:
        _, steps = _turn(state)
        await self.hooks.run_on_step_complete(
            StepCompleteContext(
                session_id=session,
                step=steps,
                max_steps=limit,
                messages_count=len(state.get("messages") or []),
            )
        )

    async def _stop(
        self,
        session: str,
        state: Mapping[str, Any],
        terminal: TurnTerminal = TurnTerminal.COMPLETED,
    ) -> None:
        _, steps = _turn(state)
        await self.hooks.run_on_session_stop(
            SessionStopContext(session_id=session, terminal=terminal, total_steps=steps)
        )

    async def _cancelled(self, session: str, request: ToolCallRequest, verdict: Verdict) -> None:
        """A cancelled session: OnSessionStop ``Cancelled`` (LangGraph runs no ``after_agent``
        once this raises), then ``SessionCancelled``."""
        if session not in self._stopped:  # once, whichever of the run's calls comes first
            self._stopped.add(session)
            state = request.state if isinstance(request.state, Mapping) else {}
            await self._stop(session, state, TurnTerminal.CANCELLED)
        raise SessionCancelled(f"session {session} was cancelled: {verdict.refusal}")

    def before_agent(self, state: Any, runtime: Runtime[Any]) -> dict[str, Any] | None:
        self._call(self._start, _session(_node_config(), self.session_id), state)
        return None

    async def abefore_agent(self, state: Any, runtime: Runtime[Any]) -> dict[str, Any] | None:
        await self._start(_session(_node_config(), self.session_id), state)
        return None

    def after_model(self, state: Any, runtime: Runtime[Any]) -> dict[str, Any] | None:
        config = _node_config()
        limit = int(config.get("recursion_limit") or 0)
        self._call(self._step, _session(config, self.session_id), state, limit)
        return None

    async def aafter_model(self, state: Any, runtime: Runtime[Any]) -> dict[str, Any] | None:
        config = _node_config()
        limit = int(config.get("recursion_limit") or 0)
        await self._step(_session(config, self.session_id), state, limit)
        return None

    def after_agent(self, state: Any, runtime: Runtime[Any]) -> dict[str, Any] | None:
        self._call(self._stop, _session(_node_config(), self.session_id), state)
        return None

    async def aafter_agent(self, state: Any, runtime: Runtime[Any]) -> dict[str, Any] | None:
        await self._stop(_session(_node_config(), self.session_id), state)
        return None

    def tool_node(self, tools: Any, **kwargs: Any) -> ToolNode:
        """A LangGraph ``ToolNode`` of ``tools`` whose every call goes through HookBus: for
        ``create_react_agent(model, tools=middleware.tool_node(tools))`` and a hand-built
        ``StateGraph``'s tools node. ``kwargs`` go to ``ToolNode``."""
        return ToolNode(
            tools,
            wrap_tool_call=self.wrap_tool_call,
            awrap_tool_call=self.awrap_tool_call,
            **kwargs,
        )

    # -- tool calls -------------------------------------------------------------------------

    async def _check(self, session: str, name: str, args: dict[str, Any], step: int) -> Verdict:
        """PreToolUse (and PermissionRequest); a person's edit (``ask_by_interrupt``) is a new
        call, checked from the start, and the model is told of it after the call's output."""
        asked = args
        while True:
            try:
                verdict = await self.gate.before(session, name, args, step=step)
            except _Edited as edit:
                args = edit.edited
                continue
            if args is asked:
                return verdict
            shown = json.dumps(args, ensure_ascii=False)
            note = render_system_reminder(
                f"A person edited this {name} call: its arguments were {shown}"
            )
            return replace(verdict, reminders=(*verdict.reminders, note))

    def _before(self, request: ToolCallRequest) -> tuple[str, str, int]:
        config = getattr(request.runtime, "config", None)
        _, steps = _turn(request.state if isinstance(request.state, Mapping) else {})
        return _session(config, self.session_id), request.tool_call["name"], steps

    @staticmethod
    def _refused(request: ToolCallRequest, verdict: Verdict) -> ToolMessage:
        assert verdict.refusal is not None
        return ToolMessage(
            content="\n\n".join([verdict.refusal, *verdict.reminders]),
            tool_call_id=request.tool_call["id"],
            name=request.tool_call["name"],
            status="error",
        )

    @staticmethod
    def _rewritten(request: ToolCallRequest, verdict: Verdict) -> ToolCallRequest:
        if verdict.args == request.tool_call.get("args"):  # neither a hook nor a person edited
            return request
        return request.override(tool_call={**request.tool_call, "args": verdict.args})

    @staticmethod
    def _output(result: ToolResult) -> tuple[str, bool] | None:
        if not isinstance(result, ToolMessage):
            return None
        return _text(result.content), result.status == "error"

    @staticmethod
    def _with(result: ToolMessage, text: str, final: str) -> ToolMessage:
        if final == text:
            return result
        return result.model_copy(update={"content": final})

    async def awrap_tool_call(
        self,
        request: ToolCallRequest,
        handler: Callable[[ToolCallRequest], Awaitable[ToolResult]],
    ) -> ToolResult:
        session, name, step = self._before(request)
        args = dict(request.tool_call.get("args") or {})
        verdict = await self._check(session, name, args, step)
        if verdict.cancelled:
            await self._cancelled(session, request, verdict)
        if verdict.refusal is not None:
            return self._refused(request, verdict)
        t0 = time.perf_counter()
        try:
            result = await handler(self._rewritten(request, verdict))
        except Exception as exc:
            await self.gate.after(
                session, name, verdict.args, str(exc) or type(exc).__name__, is_error=True,
                elapsed_ms=elapsed_ms(t0), step=step,
            )  # fmt: skip
            raise
        output = self._output(result)
        if output is None:
            return result
        text, is_error = output
        final = await self.gate.after(
            session, name, verdict.args, text, is_error=is_error, elapsed_ms=elapsed_ms(t0),
            step=step, reminders=verdict.reminders,
        )  # fmt: skip
        return self._with(result, text, final)

    def wrap_tool_call(
        self,
        request: ToolCallRequest,
        handler: Callable[[ToolCallRequest], ToolResult],
    ) -> ToolResult:
        session, name, step = self._before(request)
        args = dict(request.tool_call.get("args") or {})
        verdict: Verdict = self._call(self._check, session, name, args, step)
        if verdict.cancelled:
            self._call(self._cancelled, session, request, verdict)
        if verdict.refusal is not None:
            return self._refused(request, verdict)
        t0 = time.perf_counter()
        try:
            result = handler(self._rewritten(request, verdict))
        except Exception as exc:
            self._call(
                self.gate.after, session, name, verdict.args, str(exc) or type(exc).__name__,
                is_error=True, elapsed_ms=elapsed_ms(t0), step=step,
            )  # fmt: skip
            raise
        output = self._output(result)
        if output is None:
            return result
        text, is_error = output
        final: str = self._call(
            self.gate.after, session, name, verdict.args, text, is_error=is_error,
            elapsed_ms=elapsed_ms(t0), step=step, reminders=verdict.reminders,
        )  # fmt: skip
        return self._with(result, text, final)


async def decide_interrupt(
    hooks: EventRunner | ToolGate, value: Mapping[str, Any], *, session_id: str
) -> list[dict[str, Any] | None]:
    """PermissionRequest hooks on a ``HumanInTheLoopMiddleware`` interrupt's ``value``: one
    decision per call, in order — ``{"type": "approve"}`` for ``Override(Allow)``,
    ``{"type": "reject", "message": …}`` for ``Override(Deny)``, ``None`` for a call left to a
    person. A batched interrupt lists its calls in ``action_requests``: resume with
    ``Command(resume={"decisions": [...]})`` once each None has a person's decision. A
    ``per_call`` one (``"type": "tool_approval"``) is one call: resume with its one decision."""
    gate = hooks if isinstance(hooks, ToolGate) else ToolGate(hooks)
    decisions: list[dict[str, Any] | None] = []
    actions = [value] if value.get("type") == "tool_approval" else value.get("action_requests")
    for action in actions or []:
        permission = await gate.permission(
            session_id,
            str(action.get("name", "")),
            dict(action.get("args") or {}),
            reason=str(action.get("description") or "the tool needs approval"),
            ask=False,
        )
        if permission.decision == PermissionDecision.ALLOW:
            decisions.append({"type": "approve"})
        elif permission.decision == PermissionDecision.DENY:
            decisions.append({"type": "reject", "message": permission.reason})
        else:
            decisions.append(None)
    return decisions
