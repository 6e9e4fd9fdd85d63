"""The ``run_*`` API shared by every mode: validate, gather outcomes, aggregate.

``EventRunner`` turns one event into one result. How the hooks' answers are gathered is the
subclass's business: ``HookRegistry`` calls Python objects in this process; the distributed
client asks hook services over Redis. Both hand their outcomes to the same pure aggregation, so
the modes cannot mean different things.
"""

from __future__ import annotations

import abc
import asyncio
import datetime as dt
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextvars import ContextVar
from typing import Any

from bus.actions import (
    NotifyResult,
    PermissionRequestResult,
    PostToolUseResult,
    PreToolUseResult,
    ShadowedAnswer,
    SkippedHook,
    rewrite_error,
)
from bus.aggregation import (
    Outcome,
    aggregate_notify,
    aggregate_permission_request,
    aggregate_post_tool_use,
    aggregate_pre_tool_use,
    refusal,
    shadowed_answers,
)
from bus.errors import ContextTypeError, LimitError
from bus.events import (
    CONTEXT_TYPES,
    HookContext,
    HookEvent,
    PermissionDeniedContext,
    PermissionRequestContext,
    PostCompactContext,
    PostToolUseContext,
    PostToolUseFailureContext,
    PreCompactContext,
    PreToolUseContext,
    SessionStartContext,
    SessionStopContext,
    StepCompleteContext,
    SubagentStartContext,
    SubagentStopContext,
)
from bus.limits import encode_context
from bus.ratelog import RateLimitedLog
from bus.settings import HookSettings

log = logging.getLogger("hookbus.dispatch")
_failures = RateLimitedLog(log)


def _shaped(ctx: PostToolUseContext, o: Outcome) -> Outcome:
    """A rewrite of a structured output that is not of its shape is the hook's failure."""
    why = rewrite_error(ctx, o.action)
    return o if why is None else Outcome(o.spec, None, "error", why, o.elapsed)


#: The context being dispatched in this task and its JSON, made once when it was inspected.
_inspected: ContextVar[tuple[object, bytes]] = ContextVar("hookbus_inspected", default=(None, b""))


def inspected(ctx: HookContext) -> bytes:
    """The JSON of ``ctx``: the copy its dispatch made when it inspected it, else encoded now
    (LimitError if it is over a bound)."""
    seen, data = _inspected.get()
    return data if seen is ctx else encode_context(ctx)


#: Called after every dispatch with (event, context, outcomes in hook order, seconds taken).
#: Timelines, tracing and metrics attach here; the core never knows they exist.
DispatchObserver = Callable[[HookEvent, HookContext, Sequence[Outcome], float], None]


#: An enum member read from its class costs 0.1 µs (``EnumType``'s look-up): on the hottest
#: path, read once here.
_PRE = HookEvent.PRE_TOOL_USE

#: ``HookRunner.fires`` of a mode whose ``fire_async`` always has work (it publishes every event).
_ALWAYS: Mapping[HookEvent, object] = dict.fromkeys(HookEvent, True)

#: The ``run_*`` method of each event.
RUN_METHODS: dict[HookEvent, str] = {
    HookEvent.ON_SESSION_START: "run_on_session_start",
    HookEvent.PRE_TOOL_USE: "run_pre_tool_use",
    HookEvent.POST_TOOL_USE: "run_post_tool_use",
    HookEvent.POST_TOOL_USE_FAILURE: "run_on_post_tool_use_failure",
    HookEvent.ON_STEP_COMPLETE: "run_on_step_complete",
    HookEvent.ON_SESSION_STOP: "run_on_session_stop",
    HookEvent.ON_SUBAGENT_START: "run_on_subagent_start",
    HookEvent.ON_SUBAGENT_STOP: "run_on_subagent_stop",
    HookEvent.ON_PRE_COMPACT: "run_on_pre_compact",
    HookEvent.ON_POST_COMPACT: "run_on_post_compact",
    HookEvent.PERMISSION_REQUEST: "run_on_permission_request",
    HookEvent.PERMISSION_DENIED: "run_on_permission_denied",
}


def check_context(event: HookEvent, ctx: object) -> None:
    """Raise ContextTypeError unless ``ctx`` is the context type of ``event``."""
    expected = CONTEXT_TYPES[event]
    if type(ctx) is not expected:
        raise ContextTypeError(
            f"{event.value} takes a {expected.__name__}, got {type(ctx).__name__}"
        )


class EventRunner(abc.ABC):
    """One ``run_*`` method per lifecycle event, over an abstract way of calling hooks."""

    settings: HookSettings
    #: The mode sends the context's JSON on (``inspected``): it keeps the copy made when the
    #: context was inspected. A mode that calls hooks in this process does not pay for that.
    sends_context: bool = False

    def __init__(self, settings: HookSettings | None = None) -> None:
        self.settings = settings if settings is not None else HookSettings.from_env()
        self._background: set[asyncio.Task[Any]] = set()
        self.observers: list[DispatchObserver] = []
        #: Dispatches refused because no hook could be shown their context.
        self.refusals = 0
        #: Per event, true when ``fire_async`` has something to do (a mode with no async hooks
        #: for an event says so here: the hot path then skips the call).
        self.fires: Mapping[HookEvent, object] = _ALWAYS

    # -- what a mode provides ---------------------------------------------------------------

    @abc.abstractmethod
    async def gather(
        self, event: HookEvent, ctx: HookContext, *, sequential: bool = False
    ) -> list[Outcome]:
        """Call the sync hooks selected for this event; outcomes in hook order."""

    def start_gather(
        self, event: HookEvent, ctx: HookContext, sequential: bool = False
    ) -> list[Outcome] | Awaitable[list[Outcome]]:
        """``gather``, or its outcomes at once when a mode can have them without waiting (the
        embedded registry, when every hook answers without suspending): one coroutine less on
        the hot path."""
        return self.gather(event, ctx, sequential=sequential)

    @abc.abstractmethod
    def fire_async(self, event: HookEvent, ctx: HookContext) -> None:
        """Start the async (fire-and-forget) hooks for this event without waiting."""

    def held_back(
        self, event: HookEvent, ctx: HookContext, answers: Sequence[tuple[ShadowedAnswer, str]]
    ) -> None:
        """Answers not applied as given — by ``warn`` or ``dryrun`` hooks, or under a break-glass
        bypass (then with its reason, else "") — for an audit log. Nothing by default."""
        return None

    def _note_held_back(
        self,
        event: HookEvent,
        ctx: HookContext,
        outcomes: Sequence[Outcome],
        reason: str,
        softened: frozenset[str],
    ) -> None:
        if shadowed := shadowed_answers(event, outcomes):
            tagged = [(a, reason if a.hook_name in softened else "") for a in shadowed]
            self.held_back(event, ctx, tagged)

    # -- shared machinery --------------------------------------------------------------------

    def spawn(self, coro: Any) -> asyncio.Task[Any]:
        """Run ``coro`` in the background, keeping a reference until it ends."""
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    async def drain(self, timeout: float | None = None) -> None:
        """Wait for background work (async hooks, PermissionDenied) to finish."""
        while self._background:
            await asyncio.wait(list(self._background), timeout=timeout)
            if timeout is not None:
                return

    def refused(self, event: HookEvent, ctx: HookContext, error: LimitError) -> None:
        """A context no hook could be shown (too large, too deep, not encodable) was refused:
        counted and logged here; a mode may record it as well (the distributed mode
        dead-letters it, the built-in registry writes an audit row)."""
        self.refusals += 1
        _failures.warning("%s refused: %s", event.value, error, key="refused")

    def _report(self, skipped: Sequence[SkippedHook]) -> None:
        for s in skipped:
            _failures.warning(
                "hook %s skipped for %s (%s): %s%s",
                s.hook_name,
                s.event.value,
                s.kind,
                s.detail,
                " -> enforced by failure_policy=fail" if s.enforced else "",
                key=f"skipped {s.hook_name} {s.kind}",
            )

    async def _run(
        self, event: HookEvent, ctx: HookContext, sequential: bool = False
    ) -> list[Outcome] | LimitError:
        """The outcomes of the hooks for this event, or, for a context no hook could be shown,
        the error that says why (the caller answers it with ``refusal``, whatever the hooks'
        failure policies: input no hook inspected is never approved by default)."""
        outcomes = self._start_run(event, ctx, sequential)
        if type(outcomes) is list or isinstance(outcomes, LimitError):
            return outcomes
        return await outcomes  # type: ignore[no-any-return,misc]

    def _start_run(
        self, event: HookEvent, ctx: HookContext, sequential: bool = False
    ) -> list[Outcome] | LimitError | Awaitable[list[Outcome]]:
        """``_run`` without a coroutine of its own: the outcomes (or the refusal) at once when
        the mode has them without waiting, else an awaitable of them."""
        if type(ctx) is not CONTEXT_TYPES[event]:  # check_context's test, inlined (every call)
            check_context(event, ctx)
        try:
            data = encode_context(ctx)
        except LimitError as exc:
            self.refused(event, ctx, exc)
            return exc
        if self.sends_context:
            _inspected.set((ctx, data))
        if self.fires[event]:
            self.fire_async(event, ctx)
        if not self.observers:
            return self.start_gather(event, ctx, sequential)
        return self._observed(event, ctx, sequential)

    async def _observed(
        self, event: HookEvent, ctx: HookContext, sequential: bool
    ) -> list[Outcome]:
        t0 = time.perf_counter()
        outcomes = await self.gather(event, ctx, sequential=sequential)
        seconds = time.perf_counter() - t0
        for observe in self.observers:
            observe(event, ctx, outcomes, seconds)
        return outcomes

    async def _notify(
        self, event: HookEvent, ctx: HookContext, sequential: bool = False
    ) -> NotifyResult:
        outcomes = await self._run(event, ctx, sequential)
        if isinstance(outcomes, LimitError):
            return refusal(event, str(outcomes))  # type: ignore[no-any-return]
        result = aggregate_notify(event, outcomes)
        if result.skipped:
            self._report(result.skipped)
        return result

    async def run(self, event: HookEvent | str, ctx: HookContext) -> Any:
        """Dispatch ``ctx`` as ``event`` through its ``run_*`` method (for generic callers)."""
        method = getattr(self, RUN_METHODS[HookEvent.parse(event)])
        return await method(ctx)

    # -- the specification's API ---------------------------------------------------------------

    async def run_on_session_start(self, ctx: SessionStartContext) -> NotifyResult:
        return await self._notify(HookEvent.ON_SESSION_START, ctx)

    async def run_pre_tool_use(self, ctx: PreToolUseContext) -> PreToolUseResult:
        outcomes = self._start_run(_PRE, ctx)  # the hottest path: one
        if type(outcomes) is not list:  # coroutine less
            if isinstance(outcomes, LimitError):
                return refusal(HookEvent.PRE_TOOL_USE, str(outcomes))  # type: ignore[no-any-return]
            outcomes = await outcomes  # type: ignore[misc]
        result = aggregate_pre_tool_use(ctx.tool_args, outcomes, _now)
        if result.skipped:
            self._report(result.skipped)
        return result

    async def run_post_tool_use(self, ctx: PostToolUseContext) -> PostToolUseResult:
        outcomes = await self._run(HookEvent.POST_TOOL_USE, ctx)
        if ctx.structured and isinstance(outcomes, list):  # a rewrite must keep the shape
            outcomes = [_shaped(ctx, o) for o in outcomes]
        return self._post(HookEvent.POST_TOOL_USE, ctx.output_content, outcomes)

    async def run_on_post_tool_use_failure(
        self, ctx: PostToolUseFailureContext
    ) -> PostToolUseResult:
        outcomes = await self._run(HookEvent.POST_TOOL_USE_FAILURE, ctx)
        return self._post(HookEvent.POST_TOOL_USE_FAILURE, ctx.error_message, outcomes)

    def _post(
        self, event: HookEvent, content: str, outcomes: list[Outcome] | LimitError
    ) -> PostToolUseResult:
        if isinstance(outcomes, LimitError):
            return refusal(event, str(outcomes))  # type: ignore[no-any-return]
        result = aggregate_post_tool_use(
            event, content, outcomes, _now, self.settings.truncate_chars
        )
        if result.skipped:
            self._report(result.skipped)
        return result

    async def run_on_step_complete(self, ctx: StepCompleteContext) -> NotifyResult:
        return await self._notify(HookEvent.ON_STEP_COMPLETE, ctx)

    async def run_on_session_stop(self, ctx: SessionStopContext) -> NotifyResult:
        """Runs the hooks in order, one at a time (cleanup must not race)."""
        return await self._notify(HookEvent.ON_SESSION_STOP, ctx, sequential=True)

    async def run_on_subagent_start(self, ctx: SubagentStartContext) -> NotifyResult:
        return await self._notify(HookEvent.ON_SUBAGENT_START, ctx)

    async def run_on_subagent_stop(self, ctx: SubagentStopContext) -> NotifyResult:
        return await self._notify(HookEvent.ON_SUBAGENT_STOP, ctx)

    async def run_on_pre_compact(self, ctx: PreCompactContext) -> NotifyResult:
        return await self._notify(HookEvent.ON_PRE_COMPACT, ctx)

    async def run_on_post_compact(self, ctx: PostCompactContext) -> NotifyResult:
        return await self._notify(HookEvent.ON_POST_COMPACT, ctx)

    async def run_on_permission_request(
        self, ctx: PermissionRequestContext
    ) -> PermissionRequestResult:
        outcomes = await self._run(HookEvent.PERMISSION_REQUEST, ctx)
        if isinstance(outcomes, LimitError):
            return refusal(HookEvent.PERMISSION_REQUEST, str(outcomes))  # type: ignore[no-any-return]
        result = aggregate_permission_request(outcomes, _now())
        if result.skipped:
            self._report(result.skipped)
        return result

    async def run_on_permission_denied(self, ctx: PermissionDeniedContext) -> None:
        """Fire-and-forget: returns at once; the hooks run in the background (``drain``)."""
        check_context(HookEvent.PERMISSION_DENIED, ctx)
        self.spawn(self._notify(HookEvent.PERMISSION_DENIED, ctx))


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)
