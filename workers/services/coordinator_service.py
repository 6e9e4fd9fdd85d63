"""``hookbus coordinator``: decisions for agents written in any language.

An agent XADDs a ``DecisionRequest`` to ``{p}:decisions`` (field ``data``, JSON) and waits on
the list named in its ``reply_to``. Replicas of this service share the consumer group
``coordinators``; each request is dispatched with the same Coordinator (and so the same
semantics) a Python agent embeds, and answered with a ``DecisionReply``. A request that breaks
the protocol gets an error reply that names the field when its ``reply_to`` can be read, and
goes to the dead-letter stream otherwise; the service never stops because of it.

``decide()`` is that decision, shared with the HTTP gateway (``workers/services/gateway.py``).

Why one module: one service class, whose parts (a reader per stream, decoding a request's head,
deciding, replying, taking over a silent replica's requests) share its in-flight entries and its
bounds on I/O; ``decide()`` beside it is what the gateway shares with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import NamedTuple, Protocol, TypeVar

import msgspec
from opentelemetry import context as otel_context
from redis.exceptions import ResponseError

from bus import limits
from bus.aggregation import refusal
from bus.dispatch import deadline_cap
from bus.errors import ConfigError, InvalidInputError, LimitError, ProtocolError
from bus.events import HookContext, HookEvent
from bus.protocol import (
    DATA_FIELD,
    MAX_MESSAGE_BYTES,
    CancelRequest,
    DecisionReply,
    DecisionRequest,
    decode,
    decode_context,
    decode_head,
    encode,
    new_id,
    now_ms,
)
from bus.ratelog import RateLimitedLog
from bus.runner import check_context
from bus.settings import BusSettings, HookSettings
from bus.telemetry import metrics
from bus.telemetry import tracing as telemetry
from bus.transport.clock import MAX_SKEW_MS, ExpiredDrops, describe
from bus.transport.coordinator import Coordinator, dispatch_source
from bus.transport.keys import COORDINATORS_GROUP
from bus.transport.redis_io import (
    UNREACHABLE,
    Acks,
    CutWatch,
    Entry,
    Settled,
    cancel_session,
    consume,
    dead_letter,
    ensure_group,
    hand_over,
    keep_and_claim,
)
from workers.services.probes import Health
from workers.services.worker import Replies, send_replies

log = logging.getLogger("hookbus.coordinator.service")
_failures = RateLimitedLog(log)
#: Round trips of its own a replica has in flight at most (redis-py's pool holds 100).
IO_SLOTS = 32
#: Events whose result decides something: a result that cannot be sent becomes a refusal.
_DECIDING = (
    HookEvent.PRE_TOOL_USE,
    HookEvent.PERMISSION_REQUEST,
    HookEvent.POST_TOOL_USE,
    HookEvent.POST_TOOL_USE_FAILURE,
)


class _ReplyTo(msgspec.Struct):
    """Just enough of a broken request to answer it."""

    id: str = ""
    reply_to: str = ""


class _Head(_ReplyTo):
    """Enough of a request too deep or too large to decode to decide it."""

    event: str = ""
    ts: int = 0
    timeout_ms: int = 30_000


class Asked(Protocol):
    """What a decision needs of its request: a ``DecisionRequest`` read from ``{p}:decisions``,
    or the same JSON posted to the HTTP gateway."""

    @property
    def id(self) -> str: ...
    @property
    def ts(self) -> int: ...
    @property
    def event(self) -> HookEvent: ...
    @property
    def context(self) -> msgspec.Raw: ...
    @property
    def timeout_ms(self) -> int: ...
    @property
    def traceparent(self) -> str: ...
    @property
    def tracestate(self) -> str: ...


R = TypeVar("R", bound=Asked)


def read_request(data: bytes, kind: type[R]) -> tuple[R, HookContext]:
    """Decode one decision request and its context; ``InvalidInputError`` naming the field."""
    request = decode(data, kind)
    ctx = decode_context(request.event, request.context)
    check_context(request.event, ctx)
    return request, ctx


async def decide(
    coordinator: Coordinator,
    request: Asked,
    ctx: HookContext,
    *,
    source: str = "",
    sent_ms: int | None = None,
    now: Callable[[], int] | None = None,
) -> DecisionReply | None:
    """Dispatch one decision request with ``coordinator``: the reply to send back.

    The one decision for agents that do not embed a coordinator, whichever way they ask (the
    coordinator service over Redis, the HTTP gateway). ``None``: the request had expired
    (``ts + timeout_ms``) before it could start; nothing was dispatched. Every hook of the
    dispatch must answer within what the agent will wait, so that a slow hook is skipped under
    its failure policy rather than failing the whole decision; only a dispatch still not done at
    the expiry (an overloaded service) gets the error reply "no decision within timeout_ms".
    ``source`` names who asked (the gateway's tenant) on the published event and audit records.
    ``sent_ms`` is when the wait started (default: the request's ``ts``), on the clock ``now``
    (default: Redis's, as the coordinator estimates it; bus/transport/clock.py).
    """
    start = request.ts if sent_ms is None else sent_ms
    timeout = (start + request.timeout_ms - (now or coordinator.clock.now_ms)()) / 1000
    if timeout <= 0:
        return None
    cap = deadline_cap.set(asyncio.get_running_loop().time() + timeout * 0.95)
    asker = dispatch_source.set(source)
    traced = None
    if request.traceparent:  # the agent's trace continues through this dispatch
        traced = otel_context.attach(
            telemetry.context_from(request.traceparent, request.tracestate)
        )
    try:
        async with asyncio.timeout(timeout):  # in this task (wait_for would start another)
            result = await coordinator.run(request.event, ctx)
        metrics.decided(request.event, result)
        return DecisionReply(
            id=new_id(), ts=now_ms(), request_id=request.id, event=request.event, result=result
        )
    except TimeoutError:
        metrics.decided(request.event, None, error=True)
        return DecisionReply(
            id=new_id(),
            ts=now_ms(),
            request_id=request.id,
            event=request.event,
            status="error",
            error=f"no decision within timeout_ms={request.timeout_ms}",
        )
    finally:
        if traced is not None:
            otel_context.detach(traced)
        dispatch_source.reset(asker)
        deadline_cap.reset(cap)


class Source(NamedTuple):
    """A stream the service answers: a partition of ``{p}:decisions`` (trusted agents,
    ``tenant`` empty) or one tenant's ``{p}:t:{TENANT}:decisions``."""

    stream: str
    tenant: str = ""


class _Op(msgspec.Struct):
    op: str = "decide"


def qualify(ctx: HookContext, tenant: str) -> HookContext:
    """The context as the bus sees it: a tenant's session ids are prefixed ``TENANT/``, so that
    no tenant can name (cancel, read, attach to) another's sessions, whatever it sends."""
    changes = {
        name: f"{tenant}/{getattr(ctx, name)}"
        for name in ("session_id", "parent_session_id")
        if hasattr(ctx, name)
    }
    return msgspec.structs.replace(ctx, **changes)


def refused_reply(request_id: str, event: HookEvent, error: LimitError) -> DecisionReply:
    """The reply to a decision request whose context no hook could be shown (``read_request``
    raised LimitError): the refusal's result (protocol.md 5.6), never an error the agent could
    take for "no objection"."""
    result = None if event == HookEvent.PERMISSION_DENIED else refusal(event, str(error))
    return DecisionReply(
        id=new_id(), ts=now_ms(), request_id=request_id, event=event, result=result
    )


class CoordinatorService:
    """One replica of the coordinator service.

    It answers every partition of ``{p}:decisions`` and the decision stream of every tenant in
    ``{p}:tenants`` (re-read every ``TENANTS_REFRESH_SECS``), one reader per stream (a cluster
    keeps each on its own slot). A tenant's requests are answered only into that tenant's
    inboxes, with its sessions qualified ``TENANT/SID``: the tenant is where a request arrived,
    never what it says.
    """

    TENANTS_REFRESH_SECS = 2.0

    def __init__(self, settings: BusSettings, hook_settings: HookSettings | None = None) -> None:
        self.coordinator = Coordinator(settings, hook_settings, source="coordinator-service")
        self.keys = self.coordinator.keys
        self.redis = self.coordinator.redis
        self.settings = settings
        #: What the caps of the dead-letter streams it writes cut (logged as it grows).
        self.cuts = CutWatch()
        self.stats = {
            "answered": 0,
            "rejected": 0,
            "refused": 0,
            "dead_lettered": 0,
            "expired": 0,
            "claimed": 0,
            "agent_clock_skewed": 0,
            "cancelled": 0,
            "unsent": 0,
        }
        self.expired = ExpiredDrops(log, "decision requests")
        self._skew_logged_at = -1e9
        self._in_flight: dict[Source, dict[bytes, asyncio.Task[None]]] = {}
        self._settled: dict[Source, Settled] = {}
        self._acks: dict[Source, Acks] = {}
        self._readers: dict[Source, asyncio.Task[None]] = {}
        #: Requests still being answered for tenants removed meanwhile.
        self._retired: list[asyncio.Task[None]] = []
        # The service's own round trips at once (replies, dead letters, acknowledgements): a
        # burst of requests, poison ones above all, must not exhaust the connection pool.
        self._io = asyncio.Semaphore(IO_SLOTS)
        self._walking = asyncio.Semaphore(1)  # heads of requests over the bounds: _head()
        self.ready = asyncio.Event()
        self.health = Health(settings.liveness_secs)  # what its probes answer (probes.py)
        self.health.not_deciding = self.coordinator.not_deciding
        metrics.watch(self.coordinator, "coordinator")  # at /metrics (bus/telemetry/metrics.py)
        metrics.track(self, "coordinator-service", "coordinators")
        metrics.track_refusals(self, "request", lambda s: s.stats["refused"])

    @property
    def sources(self) -> list[Source]:
        return list(self._in_flight)

    async def run(self, stop: asyncio.Event) -> None:
        await self.coordinator.start()
        try:
            for partition in self.keys.decision_partitions:
                await self._serve(Source(partition), stop)
            with contextlib.suppress(*UNREACHABLE):
                await self._serve_tenants(stop)
            await self._beat()
            self.health.beat()
            self.ready.set()
            log.info(
                "coordinator %s answering %s",
                self.coordinator.id,
                ", ".join(s.stream for s in self.sources),
            )
            keeper = asyncio.create_task(self._keep_and_claim(stop))
            try:
                await stop.wait()
            finally:
                keeper.cancel()
                await asyncio.gather(*self._readers.values(), return_exceptions=True)
        finally:
            self.health.stopping()
            tasks = [t for flights in self._in_flight.values() for t in flights.values()]
            tasks += [t for t in self._retired if not t.done()]
            if tasks:
                await asyncio.wait(tasks, timeout=30)
            with contextlib.suppress(*UNREACHABLE):
                await self._retire()
            await self.coordinator.close()
            self.expired.flush()
            log.info(
                "coordinator %s stopped: %s; dispatch: %s",
                self.coordinator.id,
                self.stats,
                self.coordinator.stats,
            )

    async def _serve(self, source: Source, stop: asyncio.Event) -> None:
        """Start answering one stream (its group created first)."""
        if source in self._in_flight:
            return
        # From "0": requests sent while no replica was up are still answered if their agent is
        # still waiting (requests past ts + timeout_ms are dropped below).
        await ensure_group(self.redis, source.stream, COORDINATORS_GROUP, start="0")
        self._register(source)
        self._readers[source] = asyncio.create_task(self._loop(source, stop))

    def _register(self, source: Source) -> None:
        """Track what is in flight and settled on ``source``."""
        self._in_flight[source] = {}
        self._settled[source] = Settled()
        self._acks[source] = Acks()  # answered; the source's reader acknowledges them

    async def _serve_tenants(self, stop: asyncio.Event) -> None:
        """Answer every tenant in ``{p}:tenants``, and stop answering those removed from it."""
        served = set()
        for member in sorted(await self.redis.smembers(self.keys.tenants)):
            name = member.decode() if isinstance(member, bytes) else str(member)
            try:
                stream = self.keys.tenant_decisions(name)
            except ConfigError as exc:  # only the operator writes {p}:tenants; still checked
                _failures.error("ignoring tenant %r in %s: %s", name, self.keys.tenants, exc)
                continue
            served.add(Source(stream, name))
            await self._serve(Source(stream, name), stop)
        for source in [s for s in self._in_flight if s.tenant and s not in served]:
            self._readers.pop(source).cancel()  # what it is answering is still answered
            self._retired += self._in_flight.pop(source).values()
            self._retired = [t for t in self._retired if not t.done()]
            log.info("tenant %s removed: no longer answering %s", source.tenant, source.stream)

    async def _loop(self, source: Source, stop: asyncio.Event) -> None:
        async def answer_all(entries: list[Entry]) -> None:
            for entry_id, fields in entries:
                self._start(source, entry_id, fields)
            # The dispatches just started send their requests before this reader re-arms its
            # read: that send is on the path of every decision, the re-arm is not.
            await asyncio.sleep(0)

        await consume(
            self.redis,
            source.stream,
            COORDINATORS_GROUP,
            self.coordinator.id,
            count=64,
            stop=stop,
            handle=answer_all,
            recreate=lambda: ensure_group(self.redis, source.stream, COORDINATORS_GROUP, start="0"),
            acks=self._acks[source],
        )

    def _start(self, source: Source, entry_id: bytes, fields: dict[bytes, bytes]) -> None:
        flights = self._in_flight[source]
        if entry_id in flights or entry_id in self._settled[source]:
            return
        task = asyncio.create_task(self._answer_safely(source, entry_id, fields))
        flights[entry_id] = task
        task.add_done_callback(lambda _: flights.pop(entry_id, None))

    async def _beat(self) -> None:
        """The heartbeat: ``hookbus coordinator --check`` counts replicas that beat lately."""
        await self.redis.zadd(
            self.keys.coordinators, {self.coordinator.id: self.coordinator.clock.now_ms()}
        )

    async def _retire(self) -> None:
        """Clean shutdown: no longer counted live; unanswered requests go to the live replicas
        at once (not discarded, nor left waiting ``claim_idle_secs``)."""
        await self.redis.zrem(self.keys.coordinators, self.coordinator.id)
        idle_ms = int(self.settings.claim_idle_secs * 1000)
        me = self.coordinator.id
        for source in self.sources:
            stream = source.stream
            if left := await hand_over(self.redis, stream, COORDINATORS_GROUP, me, idle_ms):
                log.warning("%d unanswered decision requests of %s handed over", left, stream)

    async def _keep_and_claim(self, stop: asyncio.Event) -> None:
        """Keep the requests being answered ours, and answer those a replica that died or froze
        left unanswered (while their agent still waits: expired ones are dropped); pick up
        tenants added since."""
        idle_ms = int(self.settings.claim_idle_secs * 1000)
        next_tenants = time.monotonic() + self.TENANTS_REFRESH_SECS
        last_beat = time.monotonic()
        while not stop.is_set():
            if time.monotonic() - last_beat >= self.settings.heartbeat_secs:
                try:
                    await self._beat()
                    self.health.beat()
                    last_beat = time.monotonic()
                except UNREACHABLE as exc:
                    log.debug("heartbeat failed: %s", exc)
            for source in self.sources:
                try:
                    for entry_id, fields in await keep_and_claim(
                        self.redis,
                        source.stream,
                        COORDINATORS_GROUP,
                        self.coordinator.id,
                        self._in_flight[source],
                        idle_ms,
                        dlq=self._dlq(source),
                    ):
                        self.stats["claimed"] += 1
                        _failures.info(
                            "took over decision request %s from a silent replica", entry_id
                        )
                        self._start(source, entry_id, fields)
                except UNREACHABLE as exc:
                    log.debug("claiming failed: %s", exc)
                except Exception:  # claiming outlives anything
                    _failures.error("claim pass failed", exc_info=True)
            try:  # what the dead-letter caps of the units this service writes cut: logged
                units = [self._dlq(source) for source in self.sources]
                await self.cuts.check(self.redis, self.keys, list(dict.fromkeys(units)))
            except (*UNREACHABLE, ResponseError) as exc:
                log.debug("could not read the dead-letter streams: %s", exc)
            if time.monotonic() >= next_tenants:
                next_tenants = time.monotonic() + self.TENANTS_REFRESH_SECS
                try:
                    await self._serve_tenants(stop)
                except UNREACHABLE as exc:
                    log.debug("reading tenants failed: %s", exc)
            self.expired.tick()
            await asyncio.sleep(
                min(self.settings.heartbeat_secs, self.settings.claim_idle_secs / 3)
            )

    async def _answer_safely(
        self, source: Source, entry_id: bytes, fields: dict[bytes, bytes]
    ) -> None:
        """``_answer``; anything it raises besides Redis being away makes the request a dead
        letter, acknowledged once: no request stops this replica or comes back forever."""
        try:
            await self._answer(source, entry_id, fields)
        except UNREACHABLE as exc:  # left pending: taken over or retried once Redis is back
            _failures.warning("decision request %s not answered: %s", entry_id.decode(), exc)
        except Exception as exc:
            self.stats["dead_lettered"] += 1
            _failures.error(
                "decision request %s could not be answered; dead-lettered: %r",
                entry_id.decode(),
                exc,
                exc_info=True,
            )
            data = (fields or {}).get(DATA_FIELD.encode(), b"")
            why = f"could not be answered: {type(exc).__name__}: {exc}"
            async with self._io:
                await dead_letter(
                    self.redis,
                    self._dlq(source),
                    source.stream,
                    why,
                    data,
                    entry_id=entry_id.decode(),
                )
            with contextlib.suppress(*UNREACHABLE):
                await self._ack(source, entry_id)

    def _dlq(self, source: Source) -> str:
        """Dead letters about a tenant's requests go to that tenant's unit (its cap bounds only
        its own letters); about trusted requests, to the coordinators' ``{p}:dlq``."""
        return self.keys.tenant_dlq(source.tenant) if source.tenant else self.keys.dlq

    def _may_reply(self, source: Source, key: str) -> bool:
        if source.tenant:
            return self.keys.is_tenant_inbox(source.tenant, key)
        return self.keys.is_inbox(key)

    def _inboxes(self, source: Source) -> str:
        if source.tenant:
            return self.keys.tenant_inbox(source.tenant, "")
        return self.keys.inbox("")

    async def _answer(self, source: Source, entry_id: bytes, fields: dict[bytes, bytes]) -> None:
        data = (fields or {}).get(DATA_FIELD.encode(), b"")
        try:
            limits.check(data, "DecisionRequest")  # over a bound: read no further here
            limits.check_text(data, "DecisionRequest")  # else decoding finds it, three times
            op = decode_head(data, _Op)
            if op is not None and op.op == "cancel":
                await self._cancel(source, entry_id, decode(data, CancelRequest))
                return
            request, ctx = read_request(data, DecisionRequest)
            if not self._may_reply(source, request.reply_to):
                raise ProtocolError(
                    f"reply_to must be a key under {self._inboxes(source)}", "$.reply_to"
                )
        except LimitError as exc:
            await self._refuse(source, entry_id, data, exc)
            return
        except InvalidInputError as exc:
            await self._reject(source, entry_id, data, exc)
            return
        if source.tenant:
            ctx = qualify(ctx, source.tenant)
        sent = self._sent(entry_id, request)
        reply = await decide(
            self.coordinator,
            request,
            ctx,
            source=f"tenant:{source.tenant}" if source.tenant else "",
            sent_ms=sent,
        )
        if reply is None:
            late = (self._now() - sent - request.timeout_ms) / 1000
            self.stats["expired"] += 1
            self.expired.drop(f"request {request.id} for {request.event}, {late:.3f} s late")
            with contextlib.suppress(*UNREACHABLE):  # else it is dropped when claimed again
                await self._ack(source, entry_id)
            return
        if await self._send(source, entry_id, request.reply_to, reply):
            self.stats["answered"] += 1

    async def _cancel(self, source: Source, entry_id: bytes, request: CancelRequest) -> None:
        """Cancel one of the asker's own sessions (a tenant's are qualified). Cancelling only
        adds: no request lifts a cancellation, which ends with its TTL."""
        if not self._may_reply(source, request.reply_to):
            raise ProtocolError(
                f"reply_to must be a key under {self._inboxes(source)}", "$.reply_to"
            )
        session = f"{source.tenant}/{request.session_id}" if source.tenant else request.session_id
        by = f"tenant:{source.tenant}" if source.tenant else "agent"
        await cancel_session(self.redis, self.keys, session, self.settings.session_ttl_secs, by)
        self.stats["cancelled"] += 1
        log.info("session %s cancelled by %s", session, by)
        reply = DecisionReply(
            id=new_id(), ts=now_ms(), request_id=request.id, result={"cancelled": session}
        )
        await self._send(source, entry_id, request.reply_to, reply)

    def _now(self) -> int:
        return self.coordinator.clock.now_ms()

    def _sent(self, entry_id: bytes, request: DecisionRequest | _Head) -> int:
        """When the request's ``timeout_ms`` starts: its ``ts``, unless that is further than the
        clock bound from when Redis took it (the entry id's milliseconds, on Redis's clock): an
        agent whose clock is off must not have its requests dropped (or kept) by that error."""
        try:
            taken = int(entry_id.split(b"-", 1)[0])
        except ValueError:
            return request.ts
        off = request.ts - taken
        if abs(off) <= MAX_SKEW_MS:
            return request.ts
        self.stats["agent_clock_skewed"] += 1
        now = time.monotonic()
        if now - self._skew_logged_at >= 60:
            self._skew_logged_at = now
            log.error(
                "decision request %s has a ts %s Redis's clock (bound %g s): the agent's clock "
                "is not in sync; its timeout_ms counts from when Redis took it (%d such so far)",
                request.id,
                describe(off),
                MAX_SKEW_MS / 1000,
                self.stats["agent_clock_skewed"],
            )
        return taken

    async def _refuse(self, source: Source, entry_id: bytes, data: bytes, exc: LimitError) -> None:
        """A request whose context no hook could be shown (too large, too deep): decided at once
        as a refusal — PreToolUse Blocked, PermissionRequest Denied, tool output withheld —
        whatever the hooks' policies, and recorded as a dead letter. A request whose event or
        reply_to cannot be read is rejected as any other malformed one."""
        head = await self._head(data)
        try:
            event = HookEvent(head.event) if head is not None else None
        except ValueError:
            event = None
        if head is None or event is None or not self._may_reply(source, head.reply_to):
            await self._reject(source, entry_id, data, exc, head or _ReplyTo())
            return
        self.stats["refused"] += 1
        _failures.warning("refused decision request %s: %s", entry_id.decode(), exc)
        why = f"{event.value} refused: {exc}"
        async with self._io:
            await dead_letter(
                self.redis,
                self._dlq(source),
                source.stream,
                why,
                data,
                entry_id=entry_id.decode(),
            )
        if head.ts and self._sent(entry_id, head) + head.timeout_ms < self._now():
            self.stats["expired"] += 1
            self.expired.drop(f"refused request {head.id} for {event.value}")
            with contextlib.suppress(*UNREACHABLE):
                await self._ack(source, entry_id)
            return
        await self._send(source, entry_id, head.reply_to, refused_reply(head.id, event, exc))

    async def _head(self, data: bytes) -> _Head | None:
        """What is needed to answer a request that cannot be decoded. Within the message bounds
        msgspec reads it at once, in C; over them it may have to be walked in Python (nested
        past what msgspec skips: up to ~1 s a megabyte), so it is read in a thread, one such
        request at a time: a tenant sending many must neither hold up the event loop nor take
        more than one thread's share of the interpreter from it."""
        if (
            len(data) <= MAX_MESSAGE_BYTES
            and limits.openers(data) <= limits.MAX_DEPTH
            and not limits.has_surrogate_escape(data)  # read around: ~0.1 s for a megabyte
        ):
            return decode_head(data, _Head)
        async with self._walking:
            return await asyncio.to_thread(decode_head, data, _Head)

    async def _reject(
        self,
        source: Source,
        entry_id: bytes,
        data: bytes,
        exc: InvalidInputError,
        head: _ReplyTo | None = None,
    ) -> None:
        field = exc.field if isinstance(exc, ProtocolError) else ""
        self.stats["rejected"] += 1
        _failures.warning("rejected decision request %s: %s", entry_id.decode(), exc)
        if head is None:  # within the bounds (else read by _refuse): cheap to read
            head = decode_head(data, _ReplyTo) or _ReplyTo()
        if self._may_reply(source, head.reply_to):
            reply = DecisionReply(
                id=new_id(),
                ts=now_ms(),
                request_id=head.id,
                status="error",
                error=str(exc)[:4000],
                field=field[:300],
            )
            await self._send(source, entry_id, head.reply_to, reply)
        else:
            self.stats["dead_lettered"] += 1
            async with self._io:
                await dead_letter(
                    self.redis,
                    self._dlq(source),
                    source.stream,
                    str(exc),
                    data,
                    entry_id=entry_id.decode(),
                )
            await self._ack(source, entry_id)

    async def _ack(self, source: Source, entry_id: bytes) -> None:
        async with self._io:
            await self.redis.xack(source.stream, COORDINATORS_GROUP, entry_id)
        self._settled[source].add(entry_id)

    async def _send(
        self, source: Source, entry_id: bytes, reply_to: str, reply: DecisionReply
    ) -> bool:
        """Send ``reply`` and acknowledge its request; False if the agent did not get it."""
        try:
            payload = encode(reply)
        except LimitError as exc:
            # A result too deep or too large to send (a hook's answer echoed in it): a deciding
            # event gets the refusal instead, never an approval by default; others an error.
            why = f"its result could not be sent: {exc}"
            _failures.warning("decision %s %s", reply.request_id, why)
            if reply.event in _DECIDING:
                fallback = msgspec.structs.replace(reply, result=refusal(reply.event, why))
            else:
                fallback = msgspec.structs.replace(reply, status="error", result=None, error=why)
            payload = encode(fallback)
        # The reply goes to the agent's inbox; the XACK with the source reader's next read (on
        # the stream's node: on a cluster the inbox is often on another master).
        acks = self._acks[source]
        carry = acks.taken
        async with self._io:
            replies = Replies().add_one(reply_to, payload, entry_id)
            unsent = await send_replies(self.redis, source.stream, COORDINATORS_GROUP, replies,
                                        expire=True, ack=not carry)  # fmt: skip
        if unsent is None:  # not acknowledged: answered again when claimed
            return False
        if carry and not acks.hand([entry_id]):  # the reader stopped while the reply went out
            with contextlib.suppress(*UNREACHABLE):  # else pending: answered again if claimed
                await self._ack(source, entry_id)
        self._settled[source].add(entry_id)
        self.stats["unsent"] += unsent
        return not unsent
