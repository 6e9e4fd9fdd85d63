"""Run the selected hooks of one event under their timeouts and collect their outcomes.

Transport-agnostic: a target is anything with a ``spec``, an ``order`` and an ``endpoint``
coroutine function ``endpoint(event, ctx, deadline)``. The in-process registry's endpoint calls
the hook's method; a remote endpoint sends a request and waits for the reply. Outcomes come back
in hook order whatever order the hooks finish in, so aggregation never depends on timing.

Hot path (hooks of this process, ``start_local``): the hooks are awaited one after the other by
a driver coroutine in the caller's task (a lone hook is sent to directly). Most hooks answer
without suspending, and then no task, no timer and no event-loop round trip is created. Every
hook runs in one task from its first step to its end: the first that suspends is finished by
the caller's task, under its deadline, and the hooks after it by a task of their own
(``own_task``), so what a hook ties to its current task (``asyncio.timeout``, anyio's cancel
scopes) is never another's.

What nothing can pre-empt is still judged: a hook that holds the event loop past its timeout
(a blocking call in an ``async def``) answers too late to count, so its answer is recorded as
a timeout, with a line that says what to change (``overran``), as is an answer that came after
the hook's deadline because the loop was blocked. A hook method that returns something other
than an awaitable (a plain ``def``, refused at load by ``spec_of``) fails; a hook that raises
fails, and its traceback is logged here, once per kind (bus/ratelog.py).

Why one module: the in-process hot path and the general loop share one meaning of a hook's
outcome (timeouts, crashes, overruns, hook order) and its helpers; split, they would drift.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
import types
from collections.abc import Awaitable, Callable, Coroutine, Generator, Sequence
from contextvars import ContextVar
from typing import Any, NamedTuple, Protocol, TypeVar

from bus.actions import CONTINUE, Continue
from bus.aggregation import Outcome, check_answer
from bus.errors import ConfigError, HookCrashed, HookFailure, LimitError
from bus.events import HookContext, HookEvent
from bus.hooks import SYNC_METHODS, HookSpec
from bus.ratelog import RateLimitedLog
from bus.selection import Target

log = logging.getLogger("hookbus.dispatch")
_crashes = RateLimitedLog(log)

Endpoint = Callable[[HookEvent, HookContext, float], Awaitable[Any]]
T = TypeVar("T")

#: An outer deadline (event-loop time) no hook of this dispatch may run past: a caller that
#: will only wait so long (the coordinator service, for an agent's ``timeout_ms``) sets it.
deadline_cap: ContextVar[float | None] = ContextVar("deadline_cap", default=None)

#: True in the hooks of a dispatch (set while they are started: tasks inherit it). Hook
#: configuration cannot be changed from there, so no hook can register, remove or soften hooks.
_inside_hook: ContextVar[bool] = ContextVar("hookbus_inside_hook", default=False)


def check_outside_hooks(what: str) -> None:
    """Refuse ``what`` (a change of hook configuration) when called from inside a hook."""
    if _inside_hook.get():
        raise ConfigError(
            f"{what} was called from inside a hook: hook configuration cannot be changed "
            "through hooks (change it from the agent, or with `hookbus hooks mode`)"
        )


def enter_hook() -> None:
    """Mark the current context (a hook's own task) as inside a hook."""
    _inside_hook.set(True)


class DispatchTarget(Target, Protocol):
    """A selected hook and how to call it."""

    @property
    def endpoint(self) -> Endpoint: ...


@types.coroutine
def _drive(coro: Coroutine[Any, Any, Any], first: Any) -> Generator[Any, Any, Any]:
    """Continue a coroutine that already ran its first step, inside a task."""
    to_yield = first
    while True:
        try:
            sent = yield to_yield
        except GeneratorExit:
            coro.close()
            raise
        except BaseException as exc:  # forwarded into the hook (cancellation)
            try:
                to_yield = coro.throw(exc)
            except StopIteration as stop:
                return stop.value
        else:
            try:
                to_yield = coro.send(sent)
            except StopIteration as stop:
                return stop.value


async def _resume(coro: Coroutine[Any, Any, Any], first: Any) -> Any:
    return await _drive(coro, first)


#: Python 3.12 and later start a task eagerly: it runs as itself until it first suspends.
EAGER_TASKS = sys.version_info >= (3, 12)


def own_task(coro: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
    """A task of its own for one hook call: started at once where Python starts tasks eagerly
    (3.12+: it runs until it first suspends, as itself), else from the loop's next turn.

    Why a task from the first step on, not ``eager`` (the first step run in the caller's task,
    the rest moved to a task): what ties itself to the current task in that step ties itself to
    the caller. ``asyncio.timeout`` around a hook's own slow call cancelled, when it fired, the
    loop that read the hook's requests (the replica stopped serving), and every anyio cancel
    scope (httpx) failed on leaving it ("in a different task than it was entered in")."""
    if EAGER_TASKS:
        return asyncio.Task(coro, loop=asyncio.get_running_loop(), eager_start=True)  # type: ignore[call-arg]
    return asyncio.get_running_loop().create_task(coro)


async def then_others(first: Awaitable[T], others: asyncio.Task[Any] | None) -> T:
    """Await ``first`` (a suspended hook call finished in this task), then ``others`` (the task
    running the calls after it), and return what ``first`` did; if ``first`` is cancelled or
    raises past its handler, cancel ``others``: no call goes on alone."""
    try:
        result = await first
    except BaseException:
        if others is not None:
            others.cancel()
        raise
    if others is not None:
        await others
    return result


def eager(coro: Coroutine[Any, Any, Any]) -> tuple[bool, Any]:
    """Run a coroutine's first step now: ``(True, result)`` if that finished it, else
    ``(False, rest)`` where ``rest`` is a coroutine to finish in a task. Raises what it raises."""
    try:
        first = coro.send(None)
    except StopIteration as stop:
        return True, stop.value
    return False, _resume(coro, first)


def _retrieve(task: asyncio.Future[Any]) -> None:
    # A hook abandoned at its timeout may still raise later; read it so asyncio does not log
    # "exception was never retrieved" for something the dispatch already recorded.
    if not task.cancelled():
        task.exception()


def _failure(event: HookEvent, spec: HookSpec, exc: BaseException, elapsed: float) -> Outcome:
    if isinstance(exc, HookFailure):
        return Outcome(spec, None, exc.kind, str(exc) or type(exc).__name__, elapsed)
    if isinstance(exc, TimeoutError):
        return Outcome(spec, None, "timeout", f"timed out: {exc}", elapsed)
    detail = f"{type(exc).__name__}: {exc}"
    if not isinstance(exc, LimitError):  # the hook's own code raised (not a transport's refusal)
        log_raised(spec.name, event, detail, exc)
    return Outcome(spec, None, "error", detail, elapsed)


def log_raised(hook: str, event: HookEvent, detail: str, exc: BaseException) -> None:
    """Log a hook's exception where it ran: its traceback once per kind, then counted lines."""
    _crashes.error(
        "hook %s raised on %s: %s (it fails under its failure policy)",
        hook,
        event.value,
        detail,
        key=f"raised {hook} {type(exc).__name__}",
        exc_info=exc,
    )


def not_a_coroutine(event: HookEvent, answer: object) -> str:
    """Why a hook method's return value cannot be awaited (it was not an ``async def``)."""
    method = SYNC_METHODS[event]
    return (
        f"{method}() returned {type(answer).__name__} instead of a coroutine: write it as "
        f"`async def {method}(self, ctx)`"
    )


def overran(seconds: float, timeout: float) -> str:
    """What a hook that held the event loop past its timeout is told."""
    return (
        f"held the event loop {seconds:.2f}s without yielding, past its {timeout:.3g}s timeout; "
        "a blocking call in an async def? (use `await asyncio.to_thread(...)` or an async "
        "library)"
    )


def late(seconds: float, timeout: float) -> str:
    """What a hook whose answer came after its deadline (the loop was blocked) is told."""
    return (
        f"answered after {seconds:.2f}s, past its {timeout:.3g}s timeout: the event loop was "
        "blocked meanwhile (a blocking call in an async def?)"
    )


def _start(
    event: HookEvent, ctx: HookContext, target: DispatchTarget, deadline: float
) -> tuple[bool, Any]:
    """Start one hook: ``(True, outcome)`` if it could not start, else ``(False, (future,
    start))``. A hook of this process runs in a task of its own (``own_task``): whatever it
    ties to the current task is its own; its answer is judged when collected, late if after
    its deadline."""
    t0 = time.perf_counter()
    try:
        started = target.endpoint(event, ctx, deadline)
        if isinstance(started, asyncio.Future):  # a remote answer on its way: wait on it as is
            return False, (started, t0)
        if not isinstance(started, types.CoroutineType):
            if not isinstance(started, Awaitable):
                raise HookCrashed(not_a_coroutine(event, started))
            started = _await(started)
    except Exception as exc:  # a hook's crash is an outcome, not our crash
        return True, _failure(event, target.spec, exc, time.perf_counter() - t0)
    return False, (own_task(started), t0)


_Pending = tuple[int, float, float, float]  # index, deadline, start, timeout


async def _await(awaitable: Awaitable[Any]) -> Any:
    return await awaitable


class LocalCall(NamedTuple):
    """A hook of this process for one event: its spec, its bound method for the event, and
    the outcome of a Continue answer (``elapsed`` 0) for dispatches nobody times."""

    spec: HookSpec
    method: Callable[[Any], Any]
    continued: Outcome
    timeout: float | None  # the spec's, at hand: read for every hook of every dispatch


def local_call(spec: HookSpec, method: Callable[[Any], Any]) -> LocalCall:
    return LocalCall(spec, method, Outcome(spec, CONTINUE, None, "", 0.0), spec.timeout)


# Where a dispatch's driving hook driver is (see ``start_local``): the hook it is in, since
# when, and which driver drives (a driver handed to a task with a suspended hook is no longer
# it). A list, not an object: made for every dispatch, and a class's __init__ cost a third of
# a no-op hook.
# [hook index, its start (perf_counter), the driving driver's number]
_Cursor = list[Any]


async def _drive_hooks(
    event: HookEvent,
    ctx: HookContext,
    calls: Sequence[LocalCall],
    outcomes: list[Outcome | None],
    default_timeout: float,
    timed: bool,
    first: int,
    cursor: _Cursor,
) -> Any:
    """Call the hooks from ``first`` on, one after the other, each awaited here and its
    outcome put in its slot, until one suspends. This coroutine is then handed to a task with
    that hook (``start_local``; ``cursor[2]`` moves on): it finishes the hook, returns its
    answer (or raises its error) for the task, and calls no more hooks.

    Why a driver, not ``coroutine.send()`` per hook: a coroutine finished by ``send()`` raises
    ``StopIteration``, which cost as much as a no-op hook; one awaited here returns its value
    without an exception. Only the driver, once per dispatch, is finished by ``send()``."""
    perf, coroutine, cont = time.perf_counter, types.CoroutineType, Continue  # read once
    me = cursor[2]
    t0 = cursor[1]
    for i in range(first, len(calls)):
        spec, method, continued, limit = calls[i]
        cursor[0] = i
        cursor[1] = t0
        try:
            started = method(ctx)
            if type(started) is not coroutine:
                started = _started(event, started)
            answer = await started
        # A hook's crash is an outcome, not our crash. A CancelledError here, before the hook
        # suspended, is the hook's own (awaiting a future cancelled elsewhere, say): nothing can
        # cancel this dispatch in the middle of a step, so it is no cancellation of ours.
        except (Exception, asyncio.CancelledError) as exc:
            if cursor[2] != me:
                raise  # the hook suspended, then raised: its task's error
            t1 = perf()
            outcomes[i] = _failure(event, spec, exc, t1 - t0)
            t0 = t1
            continue
        if cursor[2] != me:
            return answer  # the hook suspended, then answered: its task's result
        t1 = perf()  # one clock read per hook: what nothing could pre-empt is still judged
        if type(answer) is cont and not timed and t1 - t0 <= (limit or default_timeout):
            outcomes[i] = continued  # the usual answer, allowed for every event, in time
        else:
            outcomes[i] = _judged(event, spec, answer, t1 - t0, limit or default_timeout)
        t0 = t1
    return None


def _judged(event: HookEvent, spec: HookSpec, answer: Any, elapsed: float, limit: float) -> Outcome:
    """The outcome of a hook of this process that answered without suspending, ``elapsed``
    seconds after it started: too late if it held the loop past its timeout ``limit``, where
    nothing could pre-empt it (``overran``)."""
    if elapsed > limit:
        return Outcome(spec, None, "timeout", overran(elapsed, limit), elapsed)
    if type(answer) is Continue:  # allowed for every event
        return Outcome(spec, answer, None, "", elapsed)
    return check_answer(event, spec, answer, elapsed)


def _started(event: HookEvent, started: Any) -> Coroutine[Any, Any, Any]:
    """What a hook's method returned when not a coroutine (its callers test that inline, on the
    hot path), as a coroutine to send to; HookCrashed if it cannot be awaited (a plain def:
    refused at load, assigned to the hook later, say)."""
    if not isinstance(started, Awaitable):
        raise HookCrashed(not_a_coroutine(event, started))
    return _await(started)


def start_local(
    event: HookEvent,
    ctx: HookContext,
    targets: Sequence[Any],
    default_timeout: float,
    sequential: bool = False,
    calls: Sequence[LocalCall] | None = None,
    timed: bool = True,
) -> list[Outcome] | Coroutine[Any, Any, list[Outcome]]:
    """``run_targets`` for hook objects of this process (``targets`` with their bound
    ``methods``; ``calls``: each one's ``LocalCall`` for ``event``, if the caller keeps them),
    without a coroutine of its own: the outcomes at once when every hook answered without
    suspending (the usual case), else a coroutine that waits for the rest. ``timed=False``:
    nobody will read the outcomes' ``elapsed`` (no observer, no tracing), so a hook that
    answers Continue at once gets its target's ready-made outcome.

    Profiled (docs/performance.md, "In-process dispatch"), the general loop spent more on its
    own calls per hook (the endpoint wrapper, ``_start``, ``eager``, tuples, a deadline worked
    out for every hook, a coroutine per level) than the hooks took. Here one driver coroutine
    (``_drive_hooks``) awaits the hooks one after the other (a lone hook is sent to directly:
    the driver's own coroutine would cost more than it saves); a deadline is worked out only for
    a hook that suspends. The caller's task finishes that hook under it (``_finish``): its first
    step ran in this task, and what it tied to the current task then (``asyncio.timeout``,
    anyio's cancel scopes: httpx) stays right. The hooks after it go on side by side in a task
    of their own (``_chain``), or, in a sequential dispatch, here one at a time. A hook's time
    is measured from the end of the one before (one clock read per hook).
    """
    if not targets:
        return []
    if calls is None:
        calls = [local_call(t.spec, t.methods[event]) for t in targets]
    began = time.perf_counter()
    inside = _inside_hook.set(True)  # the hooks started here (and their tasks) are inside
    try:
        if len(calls) == 1:
            # One hook: sent to directly. A driver costs more than it saves with one hook (a
            # coroutine of its own: 0.8 µs against the hook's 0.3 µs, docs/performance.md).
            spec, method, continued, limit = calls[0]
            try:  # a StopIteration raised by the method itself is its crash, as in the driver
                driver = method(ctx)
                if type(driver) is not types.CoroutineType:
                    driver = _started(event, driver)
            except (Exception, asyncio.CancelledError) as exc:
                return [_failure(event, spec, exc, time.perf_counter() - began)]
            try:
                step = driver.send(None)
            except StopIteration as stop:
                elapsed = time.perf_counter() - began
                if (
                    type(stop.value) is Continue
                    and not timed
                    and elapsed <= (limit or default_timeout)
                ):
                    return [continued]
                return [_judged(event, spec, stop.value, elapsed, limit or default_timeout)]
            except (Exception, asyncio.CancelledError) as exc:  # as in _drive_hooks
                return [_failure(event, spec, exc, time.perf_counter() - began)]
            outcomes: list[Outcome | None] = [None]
            cursor: _Cursor = [0, began, 0]
        else:
            outcomes = [None] * len(calls)
            cursor = [0, began, 0]
            driver = _drive_hooks(event, ctx, calls, outcomes, default_timeout, timed, 0, cursor)
            try:
                step = driver.send(None)
            except StopIteration:
                return outcomes  # type: ignore[return-value]  # every hook answered: slots filled
        # A hook suspended: the caller's task finishes it (its first step ran here: what it tied
        # to the current task is this one's), the hooks after it go on in a task of their own.
        base = asyncio.get_running_loop().time() - (time.perf_counter() - began)
        rest = _Rest(event, ctx, calls, outcomes, default_timeout, timed, base)
        others = None
        if not sequential and cursor[0] + 1 < len(calls):
            others = own_task(_chain(rest, cursor[0] + 1, False))  # copies "inside a hook"
        return _finish(rest, cursor, driver, step, others, sequential)
    finally:
        _inside_hook.reset(inside)


class _Rest(NamedTuple):
    """An in-process dispatch one of whose hooks suspended (``start_local``): what the tasks
    that finish it share. ``base``: when the dispatch began, in event-loop time."""

    event: HookEvent
    ctx: HookContext
    calls: Sequence[LocalCall]
    outcomes: list[Outcome | None]
    default_timeout: float
    timed: bool
    base: float


async def _finish(
    rest: _Rest,
    cursor: _Cursor,
    driver: Coroutine[Any, Any, Any],
    step: Any,
    others: asyncio.Task[None] | None,
    sequential: bool,
) -> list[Outcome]:
    """The rest of a dispatch whose hook ``cursor[0]`` suspended in the caller's task: finish
    that hook here; then, in a sequential dispatch, the hooks after it here one at a time,
    else wait for ``others`` (the task running them)."""
    inside = _inside_hook.set(True)
    try:
        await then_others(_see_through(rest, cursor, driver, step), others)
        if sequential:
            await _chain(rest, cursor[0] + 1, True)
    finally:
        _inside_hook.reset(inside)
    return rest.outcomes  # type: ignore[return-value]  # every slot is filled by now


async def _chain(rest: _Rest, first: int, sequential: bool) -> None:
    """The hooks from ``first`` on, in this task, each started by a driver as in
    ``start_local``; the first that suspends this task finishes, under its deadline, while
    (unless ``sequential``) the hooks after it go on in a task of their own. So every hook runs
    in one task from its first step to its end (``own_task``)."""
    calls = rest.calls
    k = first
    while k < len(calls):
        cursor: _Cursor = [k, time.perf_counter(), 0]
        driver = _drive_hooks(rest.event, rest.ctx, calls, rest.outcomes, rest.default_timeout,
                              rest.timed, k, cursor)  # fmt: skip
        try:
            step = driver.send(None)
        except StopIteration:
            return
        i: int = cursor[0]
        others = None if sequential or i + 1 == len(calls) else own_task(_chain(rest, i + 1, False))
        await then_others(_see_through(rest, cursor, driver, step), others)
        if others is not None:
            return
        k = i + 1


async def _see_through(
    rest: _Rest, cursor: _Cursor, driver: Coroutine[Any, Any, Any], step: Any
) -> None:
    """Finish hook ``cursor[0]``, which suspended in ``driver`` (its first step yielded
    ``step``), in this task, under its deadline (from the dispatch's start), and put its
    outcome in its slot. What nothing could pre-empt is still judged: a first step that held
    the loop past the timeout (``overran``), an answer after the deadline (``late``)."""
    i: int = cursor[0]
    t0: float = cursor[1]
    cursor[2] += 1  # the driver returns this hook's answer and calls no more hooks
    spec, limit = rest.calls[i].spec, rest.calls[i].timeout or rest.default_timeout
    perf = time.perf_counter
    if (t1 := perf()) - t0 > limit:  # it yielded at last, too late: the rest of it never runs
        driver.close()
        rest.outcomes[i] = Outcome(spec, None, "timeout", overran(t1 - t0, limit), t1 - t0)
        return
    deadline, timeout = rest.base + limit, limit
    cap = deadline_cap.get()
    if cap is not None and cap < deadline:
        deadline, timeout = cap, max(0.0, cap - rest.base)
    try:
        async with asyncio.timeout_at(deadline):
            answer = await _drive(driver, step)
    except TimeoutError:
        why = f"no answer within {timeout:g}s"
        rest.outcomes[i] = Outcome(spec, None, "timeout", why, perf() - t0)
        return
    except asyncio.CancelledError as exc:
        task = asyncio.current_task()
        if task is None or task.cancelling():
            raise  # the dispatch is cancelled
        rest.outcomes[i] = _failure(rest.event, spec, exc, perf() - t0)  # the hook's own
        return
    except Exception as exc:
        rest.outcomes[i] = _failure(rest.event, spec, exc, perf() - t0)
        return
    elapsed = perf() - t0
    if elapsed > timeout:  # the loop was blocked past its deadline: too late all the same
        rest.outcomes[i] = Outcome(spec, None, "timeout", late(elapsed, timeout), elapsed)
    elif type(answer) is Continue and not rest.timed:
        rest.outcomes[i] = rest.calls[i].continued
    else:
        rest.outcomes[i] = check_answer(rest.event, spec, answer, elapsed)


async def run_targets(
    event: HookEvent,
    ctx: HookContext,
    targets: Sequence[DispatchTarget],
    default_timeout: float,
    *,
    sequential: bool = False,
    after_start: Callable[[], Awaitable[None]] | None = None,
    started: float | None = None,
    local: bool = False,
) -> list[Outcome]:
    """Call every target, in parallel (or one at a time), each under its own timeout.

    Returns one outcome per target, in the order of ``targets``. Never raises for a hook's
    failure: timeouts, crashes and unreachable endpoints become failed outcomes.
    ``after_start`` runs once the hooks are started and before waiting on them (a transport
    sends every request of the dispatch there, in one round trip). ``started`` (event-loop
    time) is when the dispatch began, if earlier than now: the hooks' timeouts count from it.
    ``local``: every target is a hook object of this process with its bound ``methods`` (see
    ``start_local``).
    """
    if not targets:
        return []
    if local and started is None and after_start is None:
        now = start_local(event, ctx, targets, default_timeout, sequential)
        return now if type(now) is list else await now  # type: ignore[misc]
    loop = asyncio.get_running_loop()
    cap = deadline_cap.get()
    outcomes: list[Outcome | None] = [None] * len(targets)
    pending: dict[asyncio.Future[Any], _Pending] = {}
    base = loop.time() if started is None else started
    inside = _inside_hook.set(True)  # the hooks started below (and their tasks) are inside
    try:
        for i, target in enumerate(targets):
            timeout = target.spec.timeout or default_timeout
            deadline = base + timeout
            if cap is not None and cap < deadline:
                deadline, timeout = cap, max(0.0, cap - base)
            done, state = _start(event, ctx, target, deadline)
            if done:
                outcomes[i] = state
                continue
            future, t0 = state
            pending[future] = (i, deadline, t0, timeout)
            if sequential:
                if after_start is not None:
                    await _within(after_start, deadline)
                await _collect(event, targets, outcomes, pending, loop)
    finally:
        _inside_hook.reset(inside)
    if pending:
        if after_start is not None:
            await _within(after_start, min(p[1] for p in pending.values()))
        await _collect(event, targets, outcomes, pending, loop)
    return outcomes  # type: ignore[return-value]  # every slot is filled by now


async def _within(step: Callable[[], Awaitable[None]], deadline: float) -> None:
    """Run ``step`` (a transport sending the requests) but not past the dispatch's first
    deadline: a transport that hangs (a frozen Redis) must not hold the dispatch past it. What
    it did not send is never answered, and times out below."""
    try:
        async with asyncio.timeout_at(deadline):
            await step()
    except TimeoutError:
        pass


async def _collect(
    event: HookEvent,
    targets: Sequence[DispatchTarget],
    outcomes: list[Outcome | None],
    pending: dict[asyncio.Future[Any], _Pending],
    loop: asyncio.AbstractEventLoop,
) -> None:
    try:
        await _collect_until_done(event, targets, outcomes, pending, loop)
    except BaseException:
        for future in pending:  # the dispatch itself was cancelled: do not leave hooks running
            future.cancel()
            future.add_done_callback(_retrieve)
        raise


async def _collect_until_done(
    event: HookEvent,
    targets: Sequence[DispatchTarget],
    outcomes: list[Outcome | None],
    pending: dict[asyncio.Future[Any], _Pending],
    loop: asyncio.AbstractEventLoop,
) -> None:
    """Wait until every pending hook answered or passed its deadline.

    One waiter, woken by the first of: any answer, or the nearest deadline. (``asyncio.wait``
    would rebuild its waiter and callbacks for every answer.)
    """
    finished: dict[asyncio.Future[Any], float] = {}
    waiter: asyncio.Future[None] | None = None

    def wake(_: object = None) -> None:
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def on_done(future: asyncio.Future[Any]) -> None:
        finished[future] = time.perf_counter()
        wake()

    for future in pending:
        future.add_done_callback(on_done)
    try:
        while pending:
            if not finished:
                waiter = loop.create_future()
                timer = loop.call_at(min(p[1] for p in pending.values()), wake)
                try:
                    await waiter
                finally:
                    timer.cancel()
            for future in [f for f in pending if f in finished]:
                i, _, t0, timeout = pending.pop(future)
                elapsed = finished.pop(future) - t0
                spec = targets[i].spec
                if future.cancelled():
                    outcomes[i] = Outcome(spec, None, "error", "cancelled", elapsed)
                elif isinstance(future, asyncio.Task) and elapsed > timeout:
                    # A hook of this process (a task) that answered after its deadline: the loop
                    # was blocked, so its timer could not fire first. Too late all the same.
                    outcomes[i] = Outcome(spec, None, "timeout", late(elapsed, timeout), elapsed)
                elif (exc := future.exception()) is not None:
                    outcomes[i] = _failure(event, spec, exc, elapsed)
                else:
                    outcomes[i] = check_answer(event, spec, future.result(), elapsed)
            now = loop.time()
            for future, (i, deadline, t0, timeout) in list(pending.items()):
                if deadline <= now:
                    del pending[future]
                    future.remove_done_callback(on_done)
                    future.cancel()
                    future.add_done_callback(_retrieve)
                    outcomes[i] = Outcome(
                        targets[i].spec,
                        None,
                        "timeout",
                        f"no answer within {timeout:g}s",
                        time.perf_counter() - t0,
                    )
    finally:
        for future in pending:
            future.remove_done_callback(on_done)
