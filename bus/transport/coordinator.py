"""The coordinator: dispatches events to hook services over Redis, with the core's semantics.

One implementation, used two ways: inside ``HookClient`` for Python agents, and as the
``hookbus coordinator`` service for agents in any language. It is an ``EventRunner`` whose hooks
are remote: selection, timeouts, failure policies and aggregation are exactly the embedded
registry's; only the endpoint differs.

Hot path (why it goes around FastStream): a dispatch is one pipelined round trip that XADDs one
request per selected hook (plus the event itself to ``{p}:events``), then waits on futures that
one long-lived inbox reader resolves. FastStream's ``broker.request()`` opens a connection and a
subscription per call (~1 ms here) and its publisher sends one command per message; on a path
measured against a raw redis-py floor both would show, so this module talks to redis-py
directly.

Why one module: one class, the Coordinator: dispatching, batching its requests into one round
trip, reading its inbox, refreshing the hook directory and failing closed until it is read share
its pending requests and outbox.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import re
import socket
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from contextvars import ContextVar
from typing import Any, cast

import msgspec
from redis.exceptions import RedisError

from bus import breakglass, unread
from bus.actions import (
    PermissionRequestResult,
    PostToolUseResult,
    PreToolUseResult,
    ShadowedAnswer,
)
from bus.aggregation import ALLOWED_ACTIONS, Outcome, refusal
from bus.dispatch import Endpoint, check_outside_hooks, run_targets
from bus.errors import ConfigError, HookCrashed, HookUnreachable, LimitError, ProtocolError
from bus.events import (
    HookContext,
    HookEvent,
    PermissionRequestContext,
    PostToolUseContext,
    PostToolUseFailureContext,
    PreToolUseContext,
    session_of,
    tool_of,
)
from bus.hooks import SYNC_METHODS, AgentHook, HookSpec, spec_of
from bus.protocol import (
    MAX_MESSAGE_BYTES,
    AuditRecord,
    ControlMessage,
    EventMessage,
    HookReply,
    HookRequest,
    decode,
    encode,
    new_id,
    now_ms,
)
from bus.ratelog import RateLimitedLog
from bus.registry import local_target
from bus.runner import EventRunner, check_context, inspected
from bus.selection import select
from bus.settings import BusSettings, HookSettings
from bus.telemetry import tracing as telemetry
from bus.transport.backoff import Backoff
from bus.transport.clock import MAX_SKEW_MS, START_SAMPLES, RedisClock, describe
from bus.transport.directory import HookDirectory, RemoteTarget
from bus.transport.keys import Keys, session_digest
from bus.transport.redis_io import (
    Lane,
    Lanes,
    check_partitions,
    connect,
    dead_letter,
    held_connection,
    pipelined,
    release_held,
    xadd_batch,
)
from bus.transport.redis_io import close as close_client
from bus.transport.retention import hard_cap

log = logging.getLogger("hookbus.coordinator")
_failures = RateLimitedLog(log)
#: How long this coordinator's inbox outlives its last refresh (replies no one will read).
INBOX_TTL_MS = 60_000
#: The audit trail's hard cap at the default ``audit_maxlen`` (the audit log keeps it all).
AUDIT_MAXLEN = hard_cap(BusSettings().audit_maxlen)
#: The most unsent messages kept for the next flush while Redis hangs.
REQUEUE_LIMIT = 10_000
#: The inbox reader's retries while Redis is unreachable: the first delay at most 0.05 s,
#: doubling to at most 1 s, each between half its ceiling and its ceiling (transport/backoff.py).
INBOX_RETRY_FIRST_SECS, INBOX_RETRY_CAP_SECS = 0.05, 1.0
#: The longest a dispatch waits to learn a new session's own hooks.
SESSION_LOOKUP_SECS = 0.5
#: The largest reply read for any request: an answer without content (events whose actions
#: carry none), an error, a Block's reason. A tool event's allows more (``reply_bound``).
REPLY_FLOOR = 16_384
#: Replies popped from the inbox in one read; after a read that held a reply over its bound,
#: fewer, until a read holds none: a flood of big replies is not taken in 256 at a time.
READ_COUNT, WARY_READ_COUNT = 256, 8
# Where a HookReply written by msgspec (every HookBus worker) names its request: before any
# content, within the envelope's first bytes (ids, trace context). Read without parsing.
_REQUEST_ID = re.compile(rb'"request_id":"([0-9a-f]{32})"')
_HEAD_BYTES = 1024


def reply_bound(event: HookEvent, context_bytes: int) -> int:
    """The largest ``HookReply`` (bytes of JSON) a coordinator reads for a request of ``event``
    whose context is ``context_bytes`` long: ``REPLY_FLOOR`` for events whose answers carry no
    content; for the tool events (MutateInput, MutateOutput may rewrite the arguments or the
    output) twice the context and the floor, rounded up to a power of two, at most
    ``MAX_MESSAGE_BYTES``. Sent to the worker as ``HookRequest.reply_max``."""
    if event not in ALLOWED_ACTIONS:
        return REPLY_FLOOR
    need = 2 * context_bytes + REPLY_FLOOR
    return min(MAX_MESSAGE_BYTES, 1 << (need - 1).bit_length())


class _ReplyHead(msgspec.Struct):
    """What a reply names, read without decoding the rest (msgspec skips it, in C)."""

    request_id: str = ""
    hook: str = ""


_reply_head = msgspec.json.Decoder(_ReplyHead).decode
# The event this task is dispatching: its id (requests name it) and its context already encoded
# (encoded once per dispatch, not once per hook).
_dispatch: ContextVar[tuple[str, object, msgspec.Raw | None]] = ContextVar(
    "hookbus_dispatch", default=("", None, None)
)
#: Who asked for the dispatch under way, when a service dispatches for others (the HTTP gateway
#: sets the tenant its bearer token names): recorded as the ``source`` of the published event
#: and the ``by`` of audit records, instead of the coordinator's own name. Empty: the
#: coordinator's ``source``.
dispatch_source: ContextVar[str] = ContextVar("hookbus_dispatch_source", default="")


class Coordinator(EventRunner):
    """Dispatches lifecycle events to hook services and aggregates their answers.

    Args:
        settings: Redis URL, key prefix and timings.
        hook_settings: default hook timeout and truncation (``HOOK_TIMEOUT_SECS``).
        source: a name for this agent or service, recorded on published events.
    """

    sends_context = True  # every request and event carries the context's JSON

    def __init__(
        self,
        settings: BusSettings,
        hook_settings: HookSettings | None = None,
        *,
        source: str = "",
    ) -> None:
        super().__init__(hook_settings)
        self.bus = settings
        self.keys = Keys.of(settings)
        self.id = f"{socket.gethostname()}-{os.getpid()}-{new_id()[:6]}"
        self.source = source or self.id
        self.inbox = self.keys.inbox(self.id)
        self.redis = connect(settings)
        #: Redis's clock, as this process estimates it: deadlines and liveness are on it.
        self.clock = RedisClock(f"coordinator {self.id}")
        self.directory = HookDirectory(
            self.redis, self.keys, settings.liveness_secs, self._endpoint, self.clock
        )
        self.stats = {
            "malformed_replies": 0,
            "late_replies": 0,
            "publish_failures": 0,
            "oversized_events": 0,
            "skewed_calls": 0,
            "refused": 0,
            "forged_replies": 0,  # replies claiming another hook than the one asked: dropped
            "oversized_replies": 0,  # replies over what their request allowed: dropped unread
        }
        #: Calls, per hook, dispatched while every live replica of the hook was skewed.
        self.skewed_calls: dict[str, int] = {}
        self._waiting: dict[str, asyncio.Future[Any]] = {}
        #: request id → the hook asked (only it may answer) and the largest reply read for it
        self._asked: dict[str, tuple[str, int]] = {}
        self._by_bound: dict[int, int] = {}  # reply bound → how many pending requests have it
        self._read_count = READ_COUNT
        self._outbox: list[tuple[str, bytes, int, str | None]] = []
        self._flushing = False
        self._delivering = False  # the inbox reader is waking dispatches: it sends for them
        #: One send lane per master (one on a single node): one batch at a time on each keeps
        #: every stream's entries in order; a slow or dead master delays only its own lane.
        self._lanes = Lanes(self.redis)
        self._asking: str | None = None  # the stream of the request queued last (_request)
        self._session_hooks: dict[str, frozenset[str]] = {}
        self._by_digest: dict[str, str] = {}  # session_digest(sid) → sid, for control notes
        self._stale_sessions: set[str] = set()
        self._local: dict[HookEvent, list[Any]] = {e: [] for e in HookEvent}
        self._tasks: list[asyncio.Task[Any]] = []
        self._wake = asyncio.Event()
        self._closed = False
        #: Set (to the one line) while the bus's partition count is not this process's.
        self.partitions_mismatch = ""
        #: Why the hook directory has not been read yet (bus/unread.py), while it has not.
        self.unread_why = "the coordinator has not started"

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> Coordinator:
        """Read the hook directory and start the inbox reader and the refresher.

        If Redis does not answer, the refresher keeps trying; until the directory has been
        read, tool calls fail closed (bus/unread.py) unless the operator opted out."""
        telemetry.instrument(self)  # here: a service configures telemetry after building it
        if self.bus.fail_open_until_directory:
            log.warning(
                "HOOKBUS_FAIL_OPEN_UNTIL_DIRECTORY is set: until the hook directory is read, "
                "tool calls are decided without any hook service (fail-open)"
            )
        self.unread_why = "reading it at start"
        try:
            try:
                await check_partitions(self.redis, self.keys)
            except ConfigError:  # another partition count than the bus's: refuses to start
                await close_client(self.redis)
                self._closed = True
                raise
            await self.clock.measure(self.redis, START_SAMPLES)
            await self.directory.refresh()
        except (RedisError, OSError) as exc:
            self.unread_why = f"Redis unreachable since start: {unread.cause(exc)}"
            log.warning(
                "Redis unreachable at start (%s); will keep trying. Until the hook directory "
                "is read, %s",
                exc,
                "tool calls are decided without any hook service "
                "(HOOKBUS_FAIL_OPEN_UNTIL_DIRECTORY)"
                if self.bus.fail_open_until_directory
                else "tool calls are blocked, permissions denied and tool output withheld",
            )
        self._tasks = [
            asyncio.create_task(self._read_inbox(), name="hookbus-inbox"),
            asyncio.create_task(self._refresh_loop(), name="hookbus-refresh"),
            asyncio.create_task(self._listen_control(), name="hookbus-control"),
        ]
        return self

    async def close(self) -> None:
        """Flush pending events, stop the background tasks and disconnect."""
        if self._closed:
            return
        self._closed = True
        await self.drain(timeout=5)
        if self._outbox:
            await self._flush()
        lanes = list(self._lanes.lanes.values())
        with contextlib.suppress(TimeoutError):  # what the lanes still hold, sent once more
            await asyncio.wait_for(asyncio.gather(*(self._send_lane(x) for x in lanes)), 5)
        if unsent := sum(len(x.pending) for x in lanes):
            self.stats["publish_failures"] += unsent
            log.warning("closed with %d messages unsent (Redis did not take them)", unsent)
        self._wake.set()
        # The loops notice _closed within one short poll; cancelling a redis-py command in
        # flight can leave it waiting on its connection, so cancellation is only the fallback.
        if self._tasks:  # none if start() refused (another partition count)
            _, late = await asyncio.wait(self._tasks, timeout=3)
            for task in late:
                task.cancel()
        await self._lanes.release(self.redis)
        await close_client(self.redis)

    async def __aenter__(self) -> Coordinator:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- before the hook directory is read: fail closed (bus/unread.py) ----------------------

    def run_pre_tool_use(self, ctx: PreToolUseContext) -> Coroutine[Any, Any, PreToolUseResult]:
        if self.directory.known:  # a plain check and no coroutine more: the hottest path
            return super().run_pre_tool_use(ctx)
        return self._unread(HookEvent.PRE_TOOL_USE, ctx, super().run_pre_tool_use)

    def run_post_tool_use(self, ctx: PostToolUseContext) -> Coroutine[Any, Any, PostToolUseResult]:
        if self.directory.known:
            return super().run_post_tool_use(ctx)
        return self._unread(HookEvent.POST_TOOL_USE, ctx, super().run_post_tool_use)

    def run_on_post_tool_use_failure(
        self, ctx: PostToolUseFailureContext
    ) -> Coroutine[Any, Any, PostToolUseResult]:
        if self.directory.known:
            return super().run_on_post_tool_use_failure(ctx)
        return self._unread(
            HookEvent.POST_TOOL_USE_FAILURE, ctx, super().run_on_post_tool_use_failure
        )

    def run_on_permission_request(
        self, ctx: PermissionRequestContext
    ) -> Coroutine[Any, Any, PermissionRequestResult]:
        if self.directory.known:
            return super().run_on_permission_request(ctx)
        return self._unread(HookEvent.PERMISSION_REQUEST, ctx, super().run_on_permission_request)

    def not_deciding(self) -> str | None:
        """Why this coordinator answers every tool call with a refusal (bus/unread.py), or None
        once it has read the hook directory (or the operator opted out): what a readiness
        probe reports, so that a load balancer sends no agent to it meanwhile."""
        if self.directory.known or self.bus.fail_open_until_directory:
            return None
        return unread.reason(self.unread_why)

    async def _unread(
        self, event: HookEvent, ctx: Any, run: Callable[[Any], Awaitable[Any]]
    ) -> Any:
        """Decide ``event`` before the hook directory was read: fail closed (the event is still
        published, for the audit trail), or, if the operator opted out, as if no hook service
        were registered. Either way logged, one line per kind per 10 s."""
        tool, _ = tool_of(ctx)
        if self.bus.fail_open_until_directory:
            _failures.warning(
                "%s of %s decided without hook services: the hook directory is not read yet "
                "(%s) and HOOKBUS_FAIL_OPEN_UNTIL_DIRECTORY is set",
                event.value,
                tool,
                self.unread_why,
                key="unread fail-open",
            )
            return await run(ctx)
        check_context(event, ctx)
        try:
            self.fire_async(event, ctx)
        except LimitError as exc:  # input no hook could inspect: refused, as ever
            self.refused(event, ctx, exc)
            return refusal(event, str(exc))
        result = unread.decision(event, self.unread_why)
        _failures.warning(
            "%s of %s %s: %s",
            event.value,
            tool,
            unread.EFFECT[event],
            unread.reason(self.unread_why),
            key="unread fail-closed",
        )
        return result

    # -- EventRunner ---------------------------------------------------------------------------

    async def gather(
        self, event: HookEvent, ctx: HookContext, *, sequential: bool = False
    ) -> list[Outcome]:
        started = asyncio.get_running_loop().time()  # a slow session lookup counts too
        name, args = tool_of(ctx)
        session = await self._session_targets(session_of(ctx))
        candidates: list[Any] = self.directory.by_event[event]
        if self._local[event]:
            candidates = sorted([*self._local[event], *candidates], key=lambda t: t.order)
        targets = select(event, candidates, session, name, args)
        applied, reason, softened = breakglass.apply(
            self.directory.breakglass, targets, self.clock.now_ms()
        )
        outcomes = await run_targets(
            event,
            ctx,
            applied,
            self.settings.hook_timeout_secs,
            sequential=sequential,
            after_start=self._send_requests,
            started=started,
        )
        if self.directory.skewed:
            outcomes = self._name_skewed(outcomes)
        self._note_held_back(event, ctx, outcomes, reason, softened)
        return outcomes

    def _name_skewed(self, outcomes: list[Outcome]) -> list[Outcome]:
        """Count calls to hooks whose live replicas are all skewed, and report such a hook's
        missing answer as skewed, not as a timeout (its clock, not its speed, is suspect)."""
        named = []
        for o in outcomes:
            offset = self.directory.skewed.get(o.spec.name)
            if offset is not None:
                self.stats["skewed_calls"] += 1
                self.skewed_calls[o.spec.name] = self.skewed_calls.get(o.spec.name, 0) + 1
                if o.failure == "timeout":
                    detail = (
                        f"skewed: every live replica's clock is beyond the {MAX_SKEW_MS / 1000:g}"
                        f" s bound (nearest: {describe(offset)} Redis's); {o.detail}"
                    )
                    o = msgspec.structs.replace(o, failure="error", detail=detail)
            named.append(o)
        return named

    def held_back(
        self, event: HookEvent, ctx: HookContext, answers: Sequence[tuple[ShadowedAnswer, str]]
    ) -> None:
        """Queue one audit record per answer not applied (sent with the next flush)."""
        tool, _ = tool_of(ctx)
        for answer, reason in answers:
            record = AuditRecord(
                id=new_id(),
                ts=now_ms(),
                kind="shadowed",
                event=event,
                session_id=session_of(ctx),
                tool_name=tool or "",
                hook=answer.hook_name,
                mode=answer.mode,
                action=answer.action,
                detail=answer.detail,
                by=dispatch_source.get() or self.source,
                breakglass=reason,
            )
            try:
                payload = encode(record)
            except LimitError as exc:  # a hook's reason of a megabyte, say
                self.stats["publish_failures"] += 1
                _failures.warning("audit record of %s not written: %s", answer.hook_name, exc)
                continue
            self._enqueue(self.keys.audit, payload, hard_cap(self.bus.audit_maxlen), None)

    def asker(self) -> str:
        """Who the dispatch under way is for: ``tenant:NAME`` when the gateway or the coordinator
        service dispatches for a tenant, else this coordinator's ``source`` (its span's
        ``hookbus.tenant``)."""
        return dispatch_source.get() or self.source

    def refused(self, event: HookEvent, ctx: HookContext, error: LimitError) -> None:
        """Counted and logged (``EventRunner``), and recorded in the dead-letter stream: the
        event was not published, so no async hook will see it."""
        super().refused(event, ctx, error)
        self.stats["refused"] += 1
        tool, _ = tool_of(ctx)
        self.spawn(
            dead_letter(
                self.redis,
                self.keys.dlq,
                self.keys.events(str(session_of(ctx))),
                f"{event.value} refused: {error}",
                b"",
                event=event.value,
                session_id=str(session_of(ctx))[:300],
                tool_name=str(tool or "")[:300],
                by=self.source,
            )
        )

    def fire_async(self, event: HookEvent, ctx: HookContext) -> None:
        """Publish the event to ``{p}:events`` (async hooks consume it there); never waits."""
        traceparent, tracestate = telemetry.headers()
        encoded = msgspec.Raw(inspected(ctx))  # checked against the limits already
        message = EventMessage(
            id=new_id(),
            ts=now_ms(),
            event=event,
            session_id=session_of(ctx),
            context=encoded,
            source=dispatch_source.get() or self.source,
            traceparent=traceparent,
            tracestate=tracestate,
        )
        # A backstop cap only: retention (bus/transport/retention.py) trims history without losing
        # what a group has not handled yet.
        _dispatch.set((message.id, ctx, encoded))
        try:
            payload = encode(message)
        except LimitError as exc:
            self.stats["oversized_events"] += 1
            _failures.warning("%s event not published: %s", event, exc)
            return
        stream = self.keys.events(message.session_id)
        self._enqueue(stream, payload, hard_cap(self.bus.events_maxlen), None)

    # -- hooks in this process, beside the services -------------------------------------------

    def add(self, hook: AgentHook) -> HookSpec:
        """Run ``hook`` in this process, ordered among the hook services by priority.

        For hooks that share state with the agent (its metrics, say); everything else belongs
        in a hook service.
        """
        check_outside_hooks("add()")
        if not isinstance(hook, AgentHook):
            raise ConfigError(f"add() takes an AgentHook, got {type(hook).__name__}")
        spec = spec_of(hook)
        target = local_target(spec, (spec.priority, now_ms()), hook, SYNC_METHODS)
        for event in HookEvent:
            if spec.subscribes(event):
                self._local[event].append(target)
        return spec

    # -- session hooks ------------------------------------------------------------------------

    async def _session_targets(self, session_id: str) -> list[Any]:
        names = self._session_hooks.get(session_id)
        if names is None or session_id in self._stale_sessions:
            try:
                names = await self._read_session_hooks(session_id)
            except (RedisError, OSError, TimeoutError) as exc:
                if names is None:
                    return self._unknown_session(session_id, exc)
                # else the names known before stand
        if not names:
            return []
        by_name = self.directory.by_name
        return [by_name[n] for n in names if n in by_name] + [
            _Missing(n, self._endpoint(n)) for n in names if n not in by_name
        ]

    async def _read_session_hooks(self, session_id: str) -> frozenset[str]:
        """The session's hook names from Redis, within ``SESSION_LOOKUP_SECS`` (the time counts
        against the dispatch's deadlines); RedisError, OSError or TimeoutError if Redis does
        not answer (then the names known before stand, else ``_unknown_session``)."""
        async with asyncio.timeout(SESSION_LOOKUP_SECS):
            members = await self.redis.smembers(self.keys.session_hooks(session_id))
        names = frozenset(m.decode() if isinstance(m, bytes) else str(m) for m in members)
        if len(self._session_hooks) > 10_000:
            self._session_hooks.clear()
            self._stale_sessions.clear()
            self._by_digest.clear()
        self._session_hooks[session_id] = names
        self._by_digest[session_digest(session_id)] = session_id
        self._stale_sessions.discard(session_id)
        return names

    def _unknown_session(self, session_id: str, error: BaseException) -> list[Any]:
        """The targets of a session whose hooks were never read, when Redis did not answer:
        any session-scoped hook with ``failure_policy="fail"`` may be one of them, so each
        stands in, unreachable, and its policy decides (fail closed); the others are gone
        without this once. Logged, one line per 10 s."""
        why = f"the hooks of session {session_id} could not be read: {unread.cause(error)}"
        guards = [
            _Unknown(target, why)
            for target in self.directory.by_name.values()
            if target.manifest.scope == "session" and target.spec.failure_policy == "fail"
        ]
        _failures.warning(
            "%s; %s",
            why,
            f"its possible fail hooks ({', '.join(g.spec.name for g in guards)}) fail closed"
            if guards
            else "going without its own hooks this once",
            key="session hooks unknown",
        )
        return guards

    def session_changed(self, session_id: str, known: frozenset[str] | None = None) -> None:
        """The session's hook set changed: read it again at its next event (``known``, or the
        set read before, stands in if Redis does not answer then)."""
        if known is not None:
            self._session_hooks[session_id] = known
            self._by_digest[session_digest(session_id)] = session_id
        self._stale_sessions.add(session_id)

    def forget_session(self, session_id: str) -> None:
        """The session is over: drop what is known of its hooks."""
        self._session_hooks.pop(session_id, None)
        self._by_digest.pop(session_digest(session_id), None)
        self._stale_sessions.discard(session_id)

    # -- the remote endpoint ------------------------------------------------------------------

    def _endpoint(self, hook: str) -> Endpoint:
        def call(event: HookEvent, ctx: HookContext, deadline: float) -> asyncio.Future[Any]:
            return self._request(hook, event, ctx, deadline)

        return call  # a Future is awaitable: the dispatcher waits on it as is

    def _request(
        self, hook: str, event: HookEvent, ctx: HookContext, deadline: float
    ) -> asyncio.Future[Any]:
        """Queue one request; the future resolves to the hook's action (or its failure).

        No coroutine and no task per request: the inbox reader resolves the future directly.
        """
        if not self.directory.live(hook):
            raise HookUnreachable(f"no live replica of hook {hook}")
        loop = asyncio.get_running_loop()
        traceparent, tracestate = telemetry.headers()  # the dispatch span: the hook's parent
        event_id, published, encoded = _dispatch.get()
        context = (
            encoded if published is ctx and encoded is not None else msgspec.Raw(inspected(ctx))
        )
        bound = reply_bound(event, len(context))
        request = HookRequest(
            id=new_id(),
            ts=now_ms(),
            hook=hook,
            event=event,
            session_id=session_of(ctx),
            context=context,
            deadline=self.clock.now_ms() + int((deadline - loop.time()) * 1000),
            reply_to=self.inbox,
            event_id=event_id if published is ctx else "",
            traceparent=traceparent,
            tracestate=tracestate,
            reply_max=bound,
        )
        payload = encode(request)  # LimitError: this hook fails, under its policy
        future: asyncio.Future[Any] = loop.create_future()
        self._waiting[request.id] = future
        self._asked[request.id] = (hook, bound)
        self._by_bound[bound] = self._by_bound.get(bound, 0) + 1
        future.add_done_callback(lambda _: self._forget(request.id))
        stream = self.directory.requests(hook, request.session_id)
        self._enqueue(stream, payload, self.bus.requests_maxlen, request.id, False)
        self._asking = stream  # the dispatch sends it (_send_requests) before it next awaits
        return future

    def _forget(self, request_id: str) -> None:
        self._waiting.pop(request_id, None)
        asked = self._asked.pop(request_id, None)
        if asked is not None:
            bound = asked[1]
            left = self._by_bound[bound] - 1
            if left:
                self._by_bound[bound] = left
            else:
                del self._by_bound[bound]

    def _largest_bound(self) -> int:
        """The largest reply any pending request allows (a handful of powers of two)."""
        return max(self._by_bound, default=REPLY_FLOOR)

    # -- batching: every command of one dispatch goes out in one round trip --------------------

    def _enqueue(
        self,
        stream: str,
        payload: bytes,
        maxlen: int,
        request_id: str | None,
        schedule: bool = True,
    ) -> None:
        """Queue one XADD. Requests are sent by the dispatch itself (``after_start``); an event
        with nobody waiting on it is sent on the next turn of the loop."""
        self._outbox.append((stream, payload, maxlen, request_id))
        if schedule and not self._flushing:
            self._flushing = True
            # Runs after the dispatcher has started every hook of this event.
            asyncio.get_running_loop().call_soon(self._schedule_flush)

    async def _send_requests(self) -> None:
        """A dispatch's requests go out now, or, when the inbox reader's replies woke this
        dispatch, with every other dispatch they woke, in the reader's one round trip: agents
        that share a client share round trips too."""
        own, self._asking = self._asking, None
        if not self._delivering:
            await self._flush(own)

    def _schedule_flush(self) -> None:
        if self._outbox:
            self.spawn(self._flush())
        else:
            self._flushing = False

    async def _flush(self, own: str | None = None) -> None:
        """Send what the outbox holds, each master's share in its own lane (:class:`Lanes`).
        On one node (one lane) it is sent here. On a cluster, here only the lane of ``own``,
        the stream of the calling dispatch's own request: the dispatch waits on its own master
        only, never on another's (a dead one, a durable ``WAIT`` without a replica); every
        other lane is sent in a task of its own, and so is every lane when the inbox reader
        flushes."""
        self._flushing = False
        batch, self._outbox = self._outbox, []
        if not batch:
            return
        lanes = self._lanes.add(batch, _stream_of)
        if self._lanes.cluster is None:
            await self._send_lane(lanes[0])
            return
        inline = None if own is None else self._lanes.lane(own)
        for lane in lanes:
            if lane is not inline:
                self.spawn(self._send_lane(lane))
        if inline is not None and inline in lanes:
            await self._send_lane(inline)

    async def _send_lane(self, lane: Lane) -> None:
        """Send what ``lane`` holds, in one batch, once the send before it is done (one at a
        time keeps each stream's entries in order). Whoever puts entries in a lane sends it
        afterwards, so every entry goes out, in its own send or in one before that took it;
        a send takes what is there and no more (a dispatch never sends for others until its
        deadline). Cancelled (a dispatch's deadline passed while its master hung), waiting or
        sending: what it took goes back ahead of what came since, and a task of its own sends
        the lane again (part of it may have gone out already: at least once, as everywhere on
        the bus)."""
        batch: list[tuple[str, bytes, int, str | None]] = []
        try:
            async with lane.lock:
                batch, lane.pending = self._wanted(lane.pending), []
                if batch:
                    await self._send(batch, lane)
        except asyncio.CancelledError:
            lane.pending[:0] = batch
            batch = []
            if not self._closed:
                self.spawn(self._send_lane(lane))
            raise
        except Exception as exc:  # a send that failed otherwise than Redis answers
            for stream, _, _, request_id in batch:
                self._failed(stream, request_id, exc)
        finally:
            self._lanes.done(batch, _stream_of)

    def _wanted(
        self, items: list[tuple[str, bytes, int, str | None]]
    ) -> list[tuple[str, bytes, int, str | None]]:
        """``items`` but the requests nobody waits for any more, and at most
        ``REQUEUE_LIMIT`` of them (a master that hangs: its lane is bounded; the oldest go)."""
        kept: list[tuple[str, bytes, int, str | None]] = []
        gone: list[tuple[str, bytes, int, str | None]] = []
        for item in items:
            (kept if item[3] is None or self._still_waited(item[3]) else gone).append(item)
        if len(kept) > REQUEUE_LIMIT:
            dropped = len(kept) - REQUEUE_LIMIT
            self.stats["publish_failures"] += dropped
            log.warning("a master is not taking messages; %d unsent dropped", dropped)
            gone += kept[:dropped]
            kept = kept[dropped:]
        self._lanes.done(gone, _stream_of)
        return kept

    def _failed(self, stream: str, request_id: str | None, exc: BaseException) -> None:
        """One entry Redis did not take: an event is counted and logged (rate-limited), a
        request fails its hook as unreachable (its failure policy decides)."""
        if request_id is None:
            self.stats["publish_failures"] += 1
            _failures.warning("could not publish an event to %s: %s", stream, exc)
            return
        future = self._waiting.get(request_id)
        if future is not None and not future.done():
            future.set_exception(HookUnreachable(f"Redis unreachable: {exc}"))

    def _still_waited(self, request_id: str) -> bool:
        future = self._waiting.get(request_id)
        return future is not None and not future.done()

    async def _send(self, batch: list[tuple[str, bytes, int, str | None]], lane: Lane) -> None:
        if lane.conn is None:  # kept: no trip through the pool per flush (redis_io.py)
            with contextlib.suppress(RedisError, OSError):  # else the pool's, which says why
                lane.conn = await held_connection(self.redis)
        results = await xadd_batch(
            self.redis,
            [(stream, payload, maxlen) for stream, payload, maxlen, _ in batch],
            replicas=self.bus.durable_replicas,
            wait_ms=self.bus.durable_wait_ms,
            conn=lane.conn,
        )
        for (stream, _, _, request_id), result in zip(batch, results, strict=True):
            if isinstance(result, Exception):
                self._failed(stream, request_id, result)

    # -- the inbox: one long-lived reader resolves every waiting request -----------------------

    async def _read_inbox(self) -> None:
        backoff = Backoff(INBOX_RETRY_FIRST_SECS, INBOX_RETRY_CAP_SECS)
        conn: Any = None  # the reader's own connection: no trip through the pool per read
        try:
            while not self._closed:
                try:
                    if conn is None:
                        conn = await held_connection(self.redis)
                    # pipelined(): redis-py's command path costs more per call (redis_io.py)
                    read = ("BLMPOP", 0.5, 1, self.inbox, "LEFT", "COUNT", self._read_count)
                    [popped] = await pipelined(self.redis, [read], conn)
                    if isinstance(popped, Exception):
                        raise popped
                    backoff.reset()
                except (RedisError, OSError) as exc:
                    delay = backoff.next()
                    log.warning("inbox reader lost Redis (%s); retrying in %.2fs", exc, delay)
                    await asyncio.sleep(delay)
                    continue
                if popped:
                    await self._take(cast(list[bytes], popped[1]))
        finally:
            if conn is not None:
                await release_held(self.redis, conn)

    async def _take(self, replies: list[bytes]) -> None:
        """Deliver what one read of the inbox brought."""
        # One reply wakes one dispatch at most: it sends its own requests, while this
        # reader re-arms its read. Several may wake several: they share one round trip.
        self._delivering = len(replies) > 1
        oversized = self.stats["oversized_replies"]
        try:
            for data in replies:
                try:
                    self._deliver(data)
                except Exception:  # no reply can stop the reader that all dispatches need
                    self.stats["malformed_replies"] += 1
                    _failures.error("could not deliver a reply", exc_info=True)
            # Let the dispatches waiting on these replies run (future callback, then their
            # task) before this reader spends time re-arming its blocking read.
            await asyncio.sleep(0)
            await asyncio.sleep(0)
        finally:
            self._delivering = False
            wary = self.stats["oversized_replies"] > oversized
            self._read_count = WARY_READ_COUNT if wary else READ_COUNT
        if self._outbox:  # what the woken dispatches asked next: one round trip for all
            await self._flush()  # (their replies cannot come before it is done)

    def _deliver(self, data: bytes) -> None:
        if len(data) > REPLY_FLOOR:
            big = self._read_big(data)
            if big is None:
                return
            reply = big
        else:
            try:
                reply = decode(data, HookReply)
            except ProtocolError as exc:
                self.stats["malformed_replies"] += 1
                _failures.warning("dropping a malformed reply in %s: %s", self.inbox, exc)
                return
        future = self._waiting.get(reply.request_id)
        if future is None or future.done():
            self.stats["late_replies"] += 1
            return
        asked, _ = self._asked.get(reply.request_id, (None, 0))
        if reply.hook != asked:  # only the hook asked may answer: a forged or misrouted reply
            self.stats["forged_replies"] += 1
            _failures.warning(
                "dropped a reply from hook %r to a request for hook %r", reply.hook, asked
            )
            return
        if reply.status == "error":
            future.set_exception(HookCrashed(reply.error or "the hook failed"))
        else:
            future.set_result(reply.action)

    def _read_big(self, data: bytes) -> HookReply | None:
        """A reply over ``REPLY_FLOOR``, decoded only if it is within what its request allows
        and names a pending request of the hook it names; else None, counted. Any hook may
        push to any inbox (it learns them from ``reply_to``), so what it pushes must cost next
        to nothing unless it answers a request that hook was asked. A reply over every pending
        request's bound is dropped unread (its length only); else its request is read from its
        first bytes (where HookBus's workers write it) or, failing that, by msgspec skipping
        the rest in C; a reply to no pending request is late, one over its own request's bound
        dropped unread, one naming another hook than the one asked forged. A reply that names
        a pending request but cannot be read fails that request: only the hook asked knows its
        id, and no second such reply is read for it."""
        size, largest = len(data), self._largest_bound()
        if size > largest:
            self._oversized(size, largest, "")
            return None
        found = _REQUEST_ID.search(data, 0, _HEAD_BYTES)
        request_id = found[1].decode() if found is not None else ""
        hook = None
        if request_id not in self._asked:
            try:
                head = _reply_head(data)
            except Exception:  # malformed, or nested past what msgspec skips: not read further
                self.stats["malformed_replies"] += 1
                _failures.warning(
                    "dropping a malformed reply of %d bytes in %s, unread", size, self.inbox
                )
                return None
            request_id, hook = head.request_id, head.hook
        future = self._waiting.get(request_id)
        if request_id not in self._asked or future is None or future.done():
            self.stats["late_replies"] += 1
            return None
        asked, bound = self._asked[request_id]
        if size > bound:
            self._oversized(size, bound, f" to a request for hook {asked!r}")
            return None
        if hook is not None and hook != asked:
            self.stats["forged_replies"] += 1
            _failures.warning("dropped a reply from hook %r to a request for hook %r", hook, asked)
            return None
        try:
            return decode(data, HookReply)
        except ProtocolError as exc:
            self.stats["malformed_replies"] += 1
            _failures.warning("a malformed reply of hook %r in %s: %s", asked, self.inbox, exc)
            future.set_exception(HookCrashed(f"its reply could not be read: {exc}"[:500]))
            return None

    def _oversized(self, size: int, bound: int, to: str) -> None:
        self.stats["oversized_replies"] += 1
        telemetry.count_dropped_replies("oversized")
        _failures.warning(
            "dropped a reply of %d bytes in %s%s, unread: over the %d bytes its request "
            "allows (reply_max; a hook credential may be pushing junk to this inbox)",
            size, self.inbox, to, bound, key="oversized reply",
        )  # fmt: skip

    # -- keeping the directory fresh -----------------------------------------------------------

    async def _check_partitions(self) -> None:
        """On every refresh: the bus's partition count (``{p}:config``) still this process's?
        If not (an operator changed it, or the bus was set up after this process started while
        Redis was away), say so once, as an ERROR: this process's events go where no hook
        reads them until it is restarted with the bus's count."""
        try:
            await check_partitions(self.redis, self.keys)
        except ConfigError as exc:
            if not self.partitions_mismatch:
                log.error("%s", exc)
            self.partitions_mismatch = str(exc)
        else:
            self.partitions_mismatch = ""

    async def _refresh_loop(self) -> None:
        # The first wait is a random part of the period: clients started together (an agent
        # host's, a benchmark's) then refresh apart. In step, 32 of them stalled every
        # dispatch of the process together once a second (p99 at 32 agents, paced, 2.9x the
        # floor's; 1.4x without refreshes).
        wait = random.uniform(0, self.bus.refresh_secs)
        while not self._closed:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), wait)
            wait = self.bus.refresh_secs
            self._wake.clear()
            if self._closed:
                return
            known = self.directory.known
            try:
                await self._check_partitions()
                await self.clock.measure(self.redis)
                await self.directory.refresh()
                # The inbox's TTL is set here, by its owner only (hooks may only RPUSH): replies
                # left when this coordinator dies go with it.
                await self.redis.pexpire(self.inbox, INBOX_TTL_MS)
            except (RedisError, OSError) as exc:
                log.debug("directory refresh failed: %s", exc)
                if not known:
                    self.unread_why = f"Redis unreachable since start: {unread.cause(exc)}"
                continue
            if not known:
                log.warning(
                    "hook directory read at last (%d hooks): the hooks decide from now on",
                    len(self.directory.by_name) + len(self.directory.async_hooks),
                )

    async def _listen_control(self) -> None:
        while not self._closed:
            pubsub = self.redis.pubsub()
            try:
                await pubsub.subscribe(self.keys.control)
                while not self._closed:
                    message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=0.5)
                    if message is None or message.get("type") != "message":
                        continue
                    try:
                        note = decode(message["data"], ControlMessage)
                    except ProtocolError as exc:
                        _failures.warning("ignoring a malformed control message: %s", exc)
                        continue
                    if note.type == "session":  # names a session by its digest only
                        known = self._by_digest.get(note.session_id)
                        if known is not None:
                            self.session_changed(known)
                    else:
                        self._wake.set()
            except (RedisError, OSError) as exc:
                log.debug("control channel lost (%s); resubscribing", exc)
                await asyncio.sleep(0.2)
            finally:
                await pubsub.aclose()


def _stream_of(item: tuple[str, bytes, int, str | None]) -> str:
    return item[0]


class _Unknown:
    """A session-scoped ``fail`` hook that may belong to a session whose hooks could not be
    read: unreachable, so its failure policy decides (``_unknown_session``)."""

    def __init__(self, target: RemoteTarget, why: str) -> None:
        self.spec = target.spec
        self.order = target.order

        def endpoint(event: HookEvent, ctx: HookContext, deadline: float) -> Any:
            raise HookUnreachable(why)

        self.endpoint = endpoint


class _Missing:
    """A session hook whose service has never registered: unreachable, decided by 'ignore'."""

    def __init__(self, name: str, endpoint: Endpoint) -> None:
        self.spec = HookSpec(name=name)
        self.order = (0, 0)
        self.endpoint = endpoint
