"""The async hook service: one AsyncAgentHook as a consumer group on the events stream.

``hookbus worker MODULE:AsyncHookClass`` joins the group named after the hook on ``{p}:events``
(and on its own replay stream, ``{p}:hook:{name}:replay``); its replicas share the group.

* Partitions shared: each replica reads its share of the events partitions (:func:`share`),
  computed from the replicas alive in the hook's ``{p}:hook:{name}:replicas`` set, re-read with
  each heartbeat: a replica that comes or goes changes every share within a heartbeat, a dead
  one's within ``liveness_secs`` (its pending entries are claimed by the partition's new
  reader). Each stream read has a lane (a task): it reads while entries come, and when none
  does, waits in one ``XREAD BLOCK`` (``BLOCK_MS``), so an idle replica sends a few commands a
  second, not a read of every partition every few milliseconds.
* Batches: XREADGROUP COUNT ``batch_size``; each event runs under the async timeout (5 s);
  every entry handled in a batch is acknowledged in one XACK, sent with the lane's next read of
  the stream (one round trip a batch) unless the batch also has dead letters or failures to
  record. A batch hook (``on_batch``,
  ``on_audit``) gets the whole batch in one call; if that call fails, the batch is halved until
  the entries it fails on are alone, so one poison entry holds back no other.
* At least once: an entry is acknowledged only after the hook returned. One that failed stays
  pending; once idle past the backoff for its delivery count (``claim_idle_secs`` after the
  first delivery, then doubling with jitter: bus/transport/backoff.py) the replica reading its
  stream claims it (XPENDING IDLE, then XCLAIM, once per ``claim_idle_secs``) and runs it
  again, so a replica killed mid-batch loses nothing and a failing hook is retried at growing
  intervals.
* Once without faults: while the hook runs (within its timeout), the keep-alive keeps the
  replica's in-flight entries its own (XCLAIM … JUSTID resets their idle time, as the sync
  worker does), so a hook slower than ``claim_idle_secs`` is not run again by another replica.
* Nothing lost silently: reads go through bus/transport/retention.py, which counts and reports what
  a stream's hard cap cut before the group read it; a pending entry the cap cut (one XCLAIM
  does not return and the stream no longer has) becomes a dead letter, "trimmed before it was
  handled". Every replica runs the retention pass on the streams it reads.
* Dead letters (the hook's own ``{p}:hook:{NAME}:dlq``): a malformed entry goes there at once;
  an entry delivered ``max_deliveries`` times goes there, ``claim_idle_secs`` after its last
  failure, with the hook, the last failure and the delivery count.
* A lost stream or group (NOGROUP) is recreated and logged. Stopping finishes the batch in hand,
  acknowledges it, and leaves the rest pending for the other replicas.

Why not a FastStream stream subscriber here: it acknowledges a batch as one unit (one bad event
would hold back the good ones), has no delivery count to dead-letter on, and stops on NOGROUP;
the consumer-group protocol is small enough that owning it is simpler than working around that.

Why one module: one class, a consumer group's replica: reading, running the hook (batches halved
around a poison entry), acknowledging, claiming and dead-lettering share the replica's in-flight
entries and delivery counts.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import socket
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar, cast

from opentelemetry.trace import Status, StatusCode
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import ResponseError

from bus.dispatch import eager, own_task, then_others
from bus.errors import HookRetired, ProtocolError
from bus.events import TOOL_EVENTS, HookEvent, session_of, tool_of
from bus.hooks import ASYNC_METHODS, AsyncAgentHook, DeliveredEvent, current_event, spec_of
from bus.protocol import (
    DATA_FIELD,
    AuditRecord,
    ControlMessage,
    HookManifest,
    decode,
    decode_event,
    encode,
    new_id,
    now_ms,
    retired_hook,
)
from bus.ratelog import RateLimitedLog
from bus.settings import BusSettings, HookSettings
from bus.telemetry import metrics
from bus.telemetry import tracing as telemetry
from bus.transport.backoff import redelivery_idle_ms
from bus.transport.clock import START_SAMPLES, RedisClock
from bus.transport.directory import write_manifest
from bus.transport.keys import DLQ_MAXLEN, Keys, check_name
from bus.transport.redis_io import (
    UNREACHABLE,
    CutWatch,
    Entry,
    check_partitions,
    connect,
    current_manifest,
    dead_letter_entry,
    group_lost,
    hook_problem,
    partitions_changed,
    pipelined,
    publish_problem,
    retire_replica,
    xadd_dead_letter,
)
from bus.transport.redis_io import (
    close as close_client,
)
from bus.transport.retention import Gap, Retention, group_backlogs
from workers.services.probes import Health
from workers.services.worker import idle_while_removed

log = logging.getLogger("hookbus.async")
_failures = RateLimitedLog(log)
FAILURE_TTL_SECS = 86_400
#: How long the mark that a cut pending entry was recorded stays (Keys.cut_recorded).
CUT_RECORDED_MS = 86_400_000
_DATA = DATA_FIELD.encode()
T = TypeVar("T")
#: How long one wait of an idle lane blocks (XREAD BLOCK): one command per stream this long.
BLOCK_MS = 1000
#: An idle lane reads its stream again this often, whatever its waits saw.
RECHECK_SECS = 10.0


def share(partitions: Sequence[str], live: Sequence[str], replica: str) -> tuple[str, ...]:
    """The partitions ``replica`` reads, given the live replicas of its hook (it included):
    with the replicas sorted by id, the k-th of n reads every partition i with i mod n = k, so
    each partition has one reader; more replicas than partitions share them (replica k reads
    partition k mod P), as a consumer group allows. Every replica computes the same from the
    same set; while their sets differ (a replica just came or went, for about a heartbeat) a
    partition may have two readers, which the group keeps apart, or none, until the next
    heartbeat."""
    replicas = sorted(set(live) | {replica})
    n, p, k = len(replicas), len(partitions), replicas.index(replica)
    if n > p:
        return (partitions[k % p],)
    return tuple(partitions[k::n])


def _flat(mapping: dict[Any, Any]) -> list[Any]:
    return [item for pair in mapping.items() for item in pair]


async def _finished_by(call: Any, deadline: float, timeout: float) -> str | None:
    """Finish a suspended hook call in this task by ``deadline`` (loop time): None if it
    returned, else why it did not."""
    try:
        async with asyncio.timeout_at(deadline):
            await call
    except TimeoutError:
        return f"timed out after {timeout:g}s"
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


class AsyncHookWorker:
    """One replica of one async hook service.

    Args:
        hook: the AsyncAgentHook to run.
        settings: Redis URL, prefix and timings.
        start: where a new group starts on the events stream: "$" (new events only, the
            default), "0" (all retained history), or a stream id. An existing group keeps its
            position (use ``hookbus replay`` to re-feed a range).
        batch_size: entries read at once.
        max_deliveries: deliveries before an entry is dead-lettered.
    """

    def __init__(
        self,
        hook: AsyncAgentHook,
        settings: BusSettings,
        hook_settings: HookSettings | None = None,
        *,
        start: str = "$",
        batch_size: int = 100,
        max_deliveries: int = 5,
    ) -> None:
        self.hook = hook
        self.problem = ""  # what the last heartbeat published of the hook's problem()
        self.spec = spec_of(hook)
        self.group = check_name("hook name", self.spec.name)
        self.settings = settings
        self.keys = Keys.of(settings)
        # The events (every partition), the hook's own replay stream, and the audit trail if it
        # follows it (the side streams).
        self.events = self.keys.event_partitions
        #: This hook's own dead letters (its user may write no other unit's).
        self.dlq = self.keys.hook_dlq(self.group)
        self.cuts = CutWatch()
        self.sides: tuple[str, ...] = (self.keys.replay(self.group),)
        if hook.follows_audit_trail:
            self.sides += (self.keys.audit,)
        self.streams = self.events + self.sides
        #: The streams this replica reads now: its share of the partitions (_assign), the sides.
        self._reading: tuple[str, ...] = self.events + self.sides
        self._reassigned = asyncio.Event()  # _reading changed: the read loop starts/ends lanes
        self.start = start
        self.batch_size = batch_size
        self.max_deliveries = max_deliveries
        self.timeout = self.spec.timeout or (hook_settings or HookSettings()).async_timeout_secs
        filtered = bool(
            self.spec.match_filter.name_patterns or self.spec.match_filter.content_patterns
        )
        self._wanted: dict[HookEvent, bool | None] = {
            event: (None if filtered and event in TOOL_EVENTS else True)
            if self.spec.subscribes(event)
            else False
            for event in HookEvent
        }
        # The hook's method for each event it takes, looked up once.
        self._methods = {
            event: getattr(hook, ASYNC_METHODS[event])
            for event in HookEvent
            if self._wanted[event] is not False
        }
        self.replica = f"{socket.gethostname()}-{os.getpid()}-{new_id()[:4]}"
        self.redis = connect(settings)
        self.retention = Retention(self.redis, self.keys)
        self.stats = {"handled": 0, "failed": 0, "dead_lettered": 0, "claimed": 0, "skipped": 0}
        self.clock = RedisClock(f"async hook {self.group} replica {self.replica}")
        self.stats |= {"lost": 0}
        # Entries this replica holds, by stream: read or claimed, not yet settled. The keep-alive
        # keeps them claimed; claimed entries wait in _claimed for their stream's lane.
        self._in_flight: dict[str, set[bytes]] = {stream: set() for stream in self.streams}
        self._claim_from: dict[str, str] = {}  # where each stream's next claim pass looks
        self._claimed: dict[str, collections.deque[list[Entry]]] = {
            stream: collections.deque() for stream in self.streams
        }
        self._wake = {stream: asyncio.Event() for stream in self.streams}  # a waiting lane's
        self._gaps: list[Gap] = []  # settled by a read, not yet recorded (Redis failed)
        self._recording = asyncio.Lock()  # lanes and the keep-alive record gaps one at a time
        self._last_id: dict[str, str] = {}  # the newest id seen per stream, to wait past it
        self.registered = asyncio.Event()
        self.health = Health(settings.liveness_secs, self.clock)  # what its probes answer
        metrics.track(self, "async-worker", self.group)  # at /metrics, with its backlog
        metrics.track_group(self, self.group, self.streams)
        self._trace: dict[str, tuple[str, str]] = {}  # event id → its publisher's trace context
        self.backlog = 0
        if telemetry.enabled():
            telemetry.meter.create_observable_gauge(
                "hookbus.consumer.lag",
                callbacks=[self._observe_lag],
                description="events not yet handled by this async hook's group",
            )

    def _observe_lag(self, _options: Any) -> list[Any]:
        from opentelemetry.metrics import Observation

        return [Observation(self.backlog, {"hook.name": self.group})]

    # -- registration ------------------------------------------------------------------------

    async def register(self) -> None:
        # On another partition count than the bus's it would read streams no agent writes.
        await check_partitions(self.redis, self.keys)  # ConfigError: refuses to start
        # The group first: once the manifest is visible, every later event reaches this hook.
        for partition in self.events:
            await self.retention.create_group(partition, self.group, start=self.start)
        for side in self.sides:
            await self.retention.create_group(side, self.group, start="0")
        manifest = HookManifest.of(self.spec, "async", now_ms())
        await current_manifest(self.redis, self.keys, self.group)  # refused if it was removed
        await write_manifest(self.redis, self.keys, self.group, encode(manifest))
        await self.clock.measure(self.redis, START_SAMPLES)
        await self._heartbeat(measure=False)
        self.health.beat()
        note = ControlMessage(type="manifest", name=self.group, replica=self.replica)
        await self.redis.publish(self.keys.control, encode(note))
        self.registered.set()
        log.info("async hook %s replica %s registered", self.group, self.replica)

    async def deregister(self) -> None:
        await retire_replica(self.redis, self.keys, self.group, self.replica)
        note = ControlMessage(type="deregister", name=self.group, replica=self.replica)
        await self.redis.publish(self.keys.control, encode(note))

    # -- the service loop ----------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Handle events until ``stop`` is set; the batch in hand is finished first."""
        while not stop.is_set():
            try:
                await self.register()
                break
            except UNREACHABLE as exc:
                log.warning("Redis unreachable (%s); retrying", exc)
                await asyncio.sleep(0.5)
            except HookRetired as exc:  # removed: up, ready but idle until restored (issue 30)
                await idle_while_removed(self.redis, self.keys, self.group, self.health,
                                         self.settings.heartbeat_secs, stop, str(exc))  # fmt: skip
        keeper = asyncio.create_task(self._keep_alive(stop))
        try:
            await self._read_loop(stop)
        finally:
            self.health.stopping()
            keeper.cancel()
            await asyncio.gather(keeper, return_exceptions=True)
            with contextlib.suppress(*UNREACHABLE):
                await self.deregister()
            await close_client(self.redis)  # with the per-node clients a cluster opened
            close = getattr(self.hook, "close", None)
            if callable(close):
                result = close()
                if asyncio.iscoroutine(result):
                    await result
            log.info("async hook %s replica %s stopped: %s", self.group, self.replica, self.stats)

    async def _read_loop(self, stop: asyncio.Event) -> None:
        """One lane (a task) per stream this replica reads: its share of the partitions, and the
        side streams; lanes come and go as the share changes (:meth:`_assign`). Returns once
        every lane has finished the batch in hand."""
        lanes: dict[str, asyncio.Task[None]] = {}
        try:
            while not stop.is_set():
                self._reassigned.clear()
                for stream, task in list(lanes.items()):
                    if task.done():
                        del lanes[stream]
                for stream in self._reading:
                    if stream not in lanes:
                        lanes[stream] = asyncio.create_task(self._lane(stream, stop))
                        # a lane that ended while its stream is still read is started again
                        lanes[stream].add_done_callback(lambda _: self._reassigned.set())
                for stream in set(lanes) - set(self._reading):
                    self._wake[stream].set()  # it leaves after the batch in hand
                waits = [asyncio.ensure_future(e.wait()) for e in (stop, self._reassigned)]
                try:
                    await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    for waiting in waits:
                        waiting.cancel()
        finally:
            for stream in lanes:
                self._wake[stream].set()
            await asyncio.gather(*lanes.values(), return_exceptions=True)

    async def _lane(self, stream: str, stop: asyncio.Event) -> None:
        """Read ``stream`` while this replica reads it: entries claimed from a silent replica
        first, then new ones; when it has none, wait for one (:meth:`_wait`)."""
        held, claimed, wake = self._in_flight[stream], self._claimed[stream], self._wake[stream]
        # Handled, not yet acknowledged: the lane's next read sends the XACK in its own write
        # (the stream's node), one round trip a batch instead of two; the lane's end sends it.
        acks: list[bytes] = []
        try:
            while not stop.is_set() and stream in self._reading:
                wake.clear()
                if claimed:
                    # No read goes before this batch to carry what the last one handled: sent
                    # now, for those entries are no longer held (kept fresh), and while this
                    # batch runs a claim pass would take them over and run them again.
                    await self._ack_carried(stream, acks)
                    entries = claimed.popleft()  # already held (_claim)
                else:
                    try:
                        entries = await self._read_new(stream, acks)
                        if not entries:
                            await self._wait(stream, wake)
                            continue
                    except ResponseError as exc:
                        await self._refused(exc)
                        continue
                    except UNREACHABLE as exc:
                        log.warning("Redis unreachable (%s); retrying", exc)
                        await asyncio.sleep(0.5)
                        continue
                    except Exception:  # a lane outlives anything: its stream has no other reader
                        _failures.error("reading %s failed; retrying", stream, exc_info=True)
                        await asyncio.sleep(0.5)
                        continue
                ids = [entry_id for entry_id, _ in entries]
                held.update(ids)
                try:
                    await self.process(stream, entries, acks)
                except UNREACHABLE as exc:  # lost mid-batch: what was not acknowledged stays
                    log.warning(
                        "Redis unreachable mid-batch (%s); its entries will be retried", exc
                    )
                    await asyncio.sleep(0.5)
                except Exception:  # left pending: claimed again, dead-lettered after retries
                    _failures.error(
                        "a batch of %s failed; it will be retried", stream, exc_info=True
                    )
                finally:
                    held.difference_update(ids)
        finally:  # claimed and not run: given back (pending; the stream's reader claims them)
            while claimed:
                held.difference_update(entry_id for entry_id, _ in claimed.popleft())
            # handled: acknowledged before another replica may take the stream over
            await self._ack_carried(stream, acks)

    async def _ack_carried(self, stream: str, acks: list[bytes]) -> None:
        """Acknowledge what a lane carries for its next read, now (a failure keeps them)."""
        if not acks:
            return
        try:
            await self.redis.xack(stream, self.group, *acks)
            acks.clear()
        except UNREACHABLE as exc:  # pending: claimed and run again (at least once)
            log.warning("could not acknowledge %d of %s: %s", len(acks), stream, exc)

    async def _refused(self, exc: ResponseError) -> None:
        if not group_lost(exc):
            log.error("Redis refused a read (%s); retrying", exc)
            await asyncio.sleep(0.5)
            return
        log.warning("events stream or group %s vanished; recreating it", self.group)
        with contextlib.suppress(*UNREACHABLE):  # else tried again at the next read
            for stream in self.streams:
                await self.retention.create_group(stream, self.group, start="0")

    async def _wait(self, stream: str, wake: asyncio.Event) -> None:
        """Until ``stream`` has an entry newer than the last this replica saw, ``wake`` is set
        (stop, a new share, entries claimed) or ``RECHECK_SECS`` passed (then the lane reads
        again whatever happened: a failover may have reset the stream's ids). One ``XREAD
        BLOCK`` per ``BLOCK_MS`` on an idle stream. Why not ``XREADGROUP BLOCK``: a blocked read
        could pass over entries the cap cut meanwhile without counting them; the lane reads
        through :meth:`_read_new`, which counts them."""
        last = self._last_id.get(stream) or "$"
        deadline = time.monotonic() + RECHECK_SECS
        while not wake.is_set() and time.monotonic() < deadline:
            read = asyncio.ensure_future(self.redis.xread({stream: last}, count=1, block=BLOCK_MS))
            woken = asyncio.ensure_future(wake.wait())
            try:
                await asyncio.wait((read, woken), return_when=asyncio.FIRST_COMPLETED)
            finally:
                woken.cancel()
                if not read.done():  # a blocked command cancelled: redis-py drops its connection
                    read.cancel()
                    await asyncio.gather(read, return_exceptions=True)
            if read.done() and not read.cancelled() and read.result():  # raises what it met
                return

    # -- this replica's share of the partitions ------------------------------------------------

    def _assign(self, live: Sequence[str]) -> None:
        """The streams this replica reads, from the replicas alive now (heartbeats younger than
        ``liveness_secs``, this one included): :func:`share`, and every side stream."""
        mine = share(self.events, live, self.replica) + self.sides
        if mine != self._reading:
            self._reading = mine
            self._reassigned.set()
            log.info(
                "async hook %s replica %s (%d live) reading %s",
                self.group, self.replica, len(set(live) | {self.replica}), ", ".join(mine),
            )  # fmt: skip

    async def _read_new(self, stream: str, acks: list[bytes] | None = None) -> list[Entry]:
        """New entries of ``stream`` for this replica, without blocking; what the hard cap cut
        before them is recorded (bus/transport/retention.py). Why not XREADGROUP BLOCK: a blocked
        read could pass over entries the cap cut meanwhile without counting them; so the read loop
        waits with a plain XREAD BLOCK and then reads here."""
        entries, gap, self._last_id[stream] = await self.retention.read(
            stream, self.group, self.replica, self.batch_size, acks or ()
        )
        if acks:
            acks.clear()  # acknowledged by that read
        if gap:
            self._gaps.append(gap)
        try:
            await self._record_gaps()
        except UNREACHABLE as exc:  # the entries read are handled; the keep-alive retries
            log.warning("could not record entries lost yet (%s); retrying", exc)
        return entries

    async def _record_gaps(self) -> None:
        """Report the gaps settled by reads; one Redis refused stays for the next try."""
        async with self._recording:
            while self._gaps:
                gap = self._gaps[0]
                await self.retention.record(gap)
                self._gaps.pop(0)
                self.stats["lost"] += gap.count

    # -- one batch -----------------------------------------------------------------------------

    async def process(
        self, stream: str, entries: Sequence[Entry], carry: list[bytes] | None = None
    ) -> None:
        """Run the hook on ``entries``; acknowledge what it handled, dead-letter what is bad.
        ``carry``: when there is nothing but acknowledgements to send, they go there instead,
        for the lane's next read to send (:meth:`_lane`)."""
        if stream == self.keys.audit:
            await self._process_audit(entries, carry)
            return
        decoded, dead, acks = self._decode(stream, entries, decode_event)
        todo: list[tuple[bytes, DeliveredEvent]] = []
        wanted_by_event, trace, skipped = self._wanted, self._trace, 0
        for entry_id, (message, event, ctx) in decoded:
            wanted = wanted_by_event[event]  # True, False, or None: the tool filter decides
            if wanted is None:
                try:
                    wanted = self._matches(ctx)
                except Exception as exc:  # no event can stop the batch: it is a dead letter
                    reason = f"could not be matched: {type(exc).__name__}: {exc}"
                    extra = {"hook": self.group, "entry_id": entry_id.decode(), "deliveries": "1"}
                    dead.append(dead_letter_entry(stream, reason, b"", **extra))
                    acks.append(entry_id)
                    continue
            if not wanted:
                skipped += 1
                acks.append(entry_id)
                continue
            todo.append((entry_id, DeliveredEvent(message.id, event, message.ts, ctx)))
            if message.traceparent:
                trace[message.id] = (message.traceparent, message.tracestate)
        self.stats["skipped"] += skipped
        failures: dict[bytes, str] = {}
        if todo:
            if self.hook.handles_batches:
                failures = await self._call_batch("on_batch", self.hook.on_batch, todo)
            elif telemetry.enabled():  # one span per event
                reasons = await asyncio.gather(*(self._call_one(d) for _, d in todo))
                failures = {
                    entry_id: why for (entry_id, _), why in zip(todo, reasons, strict=True) if why
                }
            else:
                failures = await self._call_each(todo)
            if failures:
                acks.extend(entry_id for entry_id, _ in todo if entry_id not in failures)
            else:
                acks.extend([entry_id for entry_id, _ in todo])
        for _, delivered in todo:  # this batch's (lanes run batches side by side)
            trace.pop(delivered.id, None)
        self.stats["handled"] += len(todo) - len(failures)
        self.stats["failed"] += len(failures)
        self.stats["dead_lettered"] += len(dead)
        if dead:
            telemetry.count_dead_letters(self.group, len(dead))
        await self._settle(stream, acks, dead, failures, carry)

    async def _process_audit(self, entries: Sequence[Entry], carry: list[bytes] | None) -> None:
        """Hand audit records to ``on_audit`` in one call (split only if it fails:
        :meth:`_call_batch`); acknowledge those handled, leave the others to be retried."""
        records, dead, acks = self._decode(
            self.keys.audit, entries, lambda data: decode(data, AuditRecord)
        )
        failures: dict[bytes, str] = {}
        if records:
            failures = await self._call_batch("on_audit", self.hook.on_audit, records)
            acks.extend(entry_id for entry_id, _ in records if entry_id not in failures)
        self.stats["dead_lettered"] += len(dead)
        if dead:
            telemetry.count_dead_letters(self.group, len(dead))
        await self._settle(self.keys.audit, acks, dead, failures, carry)

    def _decode(
        self, stream: str, entries: Sequence[Entry], parse: Callable[[bytes], T]
    ) -> tuple[list[tuple[bytes, T]], list[dict[Any, Any]], list[bytes]]:
        """Each entry's message, parsed; one that does not parse becomes a dead letter with its
        reason (and is acknowledged). Returns (parsed, dead letters, acknowledgements)."""
        parsed: list[tuple[bytes, T]] = []
        dead: list[dict[Any, Any]] = []
        acks: list[bytes] = []
        for entry_id, fields in entries:
            data = (fields or {}).get(_DATA)
            try:
                if data is None:
                    raise ProtocolError(f"entry has no {DATA_FIELD!r} field", "$")
                parsed.append((entry_id, parse(data)))
            except Exception as exc:  # ProtocolError, or anything else: a dead letter, once
                if not isinstance(exc, ProtocolError):
                    exc = ProtocolError(f"could not be decoded: {type(exc).__name__}: {exc}")
                _failures.warning(
                    "malformed entry %s of %s dead-lettered: %s", entry_id, stream, exc
                )
                extra = {"hook": self.group, "entry_id": entry_id.decode(), "deliveries": "1"}
                dead.append(dead_letter_entry(stream, str(exc), data or b"", **extra))
                acks.append(entry_id)
        return parsed, dead, acks

    def _matches(self, ctx: Any) -> bool:
        """Whether the hook's tool filter takes this tool event."""
        name, args = tool_of(ctx)
        return name is None or self.spec.match_filter.matches(name, args)

    async def _call_each(self, todo: list[tuple[bytes, DeliveredEvent]]) -> dict[bytes, str]:
        """Run the hook on each event, side by side, each under the timeout; failure reasons by
        entry id. The calls run in a task of the batch's own (``_chain``), never in the lane's:
        what a hook ties to its current task (``asyncio.timeout`` around a slow call of its own,
        anyio's cancel scopes: httpx) tied itself to the lane, whose read loop such a timeout
        cancelled, and leaving the scope in another task failed."""
        failures: dict[bytes, str] = {}
        if todo:
            await own_task(self._chain(todo, 0, failures))
        return failures

    async def _chain(
        self, todo: list[tuple[bytes, DeliveredEvent]], first: int, failures: dict[bytes, str]
    ) -> None:
        """Call the hook on the events from ``first`` on, one after the other, in this task.
        Most calls finish without suspending (observers): no task or timer each (about 2 µs an
        event against 14 with a task each). When one suspends, the events after it go on in a
        task of their own, and this task finishes that call, under the timeout: every call runs
        in one task from its first step to its end."""
        methods, timeout = self._methods, self.timeout
        loop = asyncio.get_running_loop()
        for k in range(first, len(todo)):
            entry_id, delivered = todo[k]
            current_event.set(delivered)  # this task's own context (a new task copies it)
            began = loop.time()
            try:
                done, rest = eager(methods[delivered.event](delivered.context))
            except Exception as exc:
                failures[entry_id] = f"{type(exc).__name__}: {exc}"
                continue
            if done:
                continue
            others = own_task(self._chain(todo, k + 1, failures)) if k + 1 < len(todo) else None
            why = _finished_by(rest, began + timeout, timeout)
            if (failed := await then_others(why, others)) is not None:
                failures[entry_id] = failed
            return

    async def _call_batch(
        self, method: str, handle: Callable[[list[Any]], Any], todo: Sequence[tuple[bytes, Any]]
    ) -> dict[bytes, str]:
        """Hand ``todo`` (entry id, event or audit record) to ``on_batch`` or ``on_audit`` in one
        call; failure reasons by entry id.

        If the call fails on more than one entry, the batch is halved and each half handed over
        again, down to single entries: one entry the hook cannot take (poison) then fails alone,
        with its own reason, and is retried and dead-lettered alone, while the others are
        handled now, in about 2·log2(n) calls more. A batch hook should therefore apply a batch
        whole or not at all (the audit log and metrics hooks do); one that does not may see an
        event of a failed batch again, as on any retry (at least once). A timeout is not split:
        it tells no entry from another (a store that is slow or unreachable), and the halves
        could take up to 2n - 1 timeouts; that batch is retried whole, as before.
        """
        items = [item for _, item in todo]
        why = await self._traced_batch(method, handle(items), items)
        if not why:
            return {}
        if len(todo) == 1 or why.startswith("timed out"):
            return {entry_id: why for entry_id, _ in todo}
        half = len(todo) // 2
        failures = await self._call_batch(method, handle, todo[:half])
        return failures | await self._call_batch(method, handle, todo[half:])

    async def _traced_batch(self, method: str, coro: Any, batch: Sequence[Any]) -> str | None:
        """Run one ``on_batch`` or ``on_audit`` call, in a span of its own when tracing: one
        per batch, linked to the span that published each entry."""
        if not telemetry.enabled():
            return await self._call(coro, None)
        events = sorted({e.value for e in (getattr(x, "event", None) for x in batch) if e})
        attrs = {
            "hook.name": self.group,
            "hook.method": method,
            "hook.batch_size": len(batch),
            "hook.events": ",".join(events),
            "hook.replica": self.replica,
        }
        parents = [self._trace.get(x.id, ("", "")) for x in batch]
        if method == "on_audit":
            parents = [(r.traceparent, r.tracestate) for r in batch]
        with telemetry.batch_span(f"hook {self.group}", attrs, parents) as span:
            why = await self._call(coro, None)
            span.set_attribute("hook.timed_out", bool(why and why.startswith("timed out")))
            if why:
                span.set_status(Status(StatusCode.ERROR, why))
            return why

    async def _call_one(self, delivered: DeliveredEvent) -> str | None:
        method = self._methods[delivered.event]
        if not telemetry.enabled():
            return await self._call(method(delivered.context), delivered)
        tool, _ = tool_of(delivered.context)
        attrs = {
            "hook.name": self.group,
            "hook.event": delivered.event.value,
            "session.id": session_of(delivered.context),
            "hook.replica": self.replica,
            **({"gen_ai.tool.name": tool} if tool else {}),
        }
        parent = self._trace.get(delivered.id, ("", ""))
        with telemetry.hook_span(f"hook {self.group}", attrs, *parent, link_only=True) as span:
            why = await self._call(method(delivered.context), delivered)
            span.set_attribute("hook.timed_out", bool(why and why.startswith("timed out")))
            if why:
                span.set_status(Status(StatusCode.ERROR, why))
            return why

    async def _call(self, coro: Any, delivered: DeliveredEvent | None) -> str | None:
        """None if the hook returned, else why it did not."""
        current_event.set(delivered)
        try:
            await asyncio.wait_for(coro, self.timeout)
        except TimeoutError:
            return f"timed out after {self.timeout:g}s"
        except Exception as exc:
            return f"{type(exc).__name__}: {exc}"
        return None

    async def _settle(
        self,
        stream: str,
        acks: list[bytes],
        dead: list[dict[Any, Any]],
        failed: dict[bytes, str],
        carry: list[bytes] | None = None,
    ) -> None:
        """Dead letters, failure reasons and acknowledgements in one round trip; with ``carry``
        and nothing but acknowledgements, none: they go with the lane's next read."""
        if carry is not None and not dead and not failed:
            carry += acks
            return
        commands: list[tuple[Any, ...]] = [
            ("XADD", self.dlq, "MAXLEN", "~", DLQ_MAXLEN, "*", *_flat(entry)) for entry in dead
        ]
        if failed:
            failures = self.keys.failures(self.group)
            commands += [
                ("HSET", failures, *_flat(failed)),
                ("EXPIRE", failures, FAILURE_TTL_SECS),
            ]
        if acks:
            commands.append(("XACK", stream, self.group, *acks))
        if not commands:
            return
        if len(commands) == 1 and isinstance(self.redis, RedisCluster):
            # the usual case, acknowledgements alone: one command, not redis-py's cluster
            # pipeline, which costs more CPU per batch (docs/performance.md, async on a cluster)
            await self.redis.execute_command(*commands[0])
            return
        for reply in await pipelined(self.redis, commands):
            if isinstance(reply, Exception):
                raise reply
        for entry_id, why in failed.items():
            _failures.warning(
                "%s failed on %s (will retry): %s", self.group, entry_id.decode(), why
            )

    # -- liveness, claiming, retention ---------------------------------------------------------

    async def _keep_alive(self, stop: asyncio.Event) -> None:
        """Heartbeat (and this replica's share of the partitions); keep its in-flight entries
        its own, three times per ``claim_idle_secs``, so that an entry in flight never looks idle
        that long to another replica; once per ``claim_idle_secs``, take over entries a silent
        replica left on the streams it reads; every 10 s, the retention pass on those."""
        interval = min(self.settings.heartbeat_secs, self.settings.claim_idle_secs / 3)
        last_beat = last_trim = last_claim = 0.0
        while not stop.is_set():
            try:
                if time.monotonic() - last_beat >= self.settings.heartbeat_secs:
                    if await partitions_changed(self.redis, self.keys):
                        stop.set()
                        return
                    await self.cuts.check(self.redis, self.keys, [self.dlq])
                    if await self._heartbeat():
                        log.warning("hook %s was removed by an operator; stopping", self.group)
                        stop.set()
                        return
                    last_beat = time.monotonic()
                    self.health.beat()
                for stream in self.streams:
                    await self._keep(stream)
                if time.monotonic() - last_claim >= self.settings.claim_idle_secs:
                    last_claim = time.monotonic()
                    for stream in self._reading:
                        if not self._claimed[stream]:  # one claimed batch waiting is enough
                            await self._claim(stream)
                await self._record_gaps()
                if time.monotonic() - last_trim > 10:
                    last_trim = time.monotonic()
                    await self._retention_pass()
            except ResponseError as exc:
                log.debug("claim skipped: %s", exc)
            except UNREACHABLE as exc:
                log.debug("keep-alive failed: %s", exc)
            except Exception:  # heartbeats, takeovers and retention outlive anything
                _failures.error("keep-alive pass failed", exc_info=True)
            await asyncio.sleep(interval)

    async def _keep(self, stream: str) -> None:
        """Reset the idle time of the entries this replica holds (XCLAIM … JUSTID: no new
        delivery is counted), so that no other replica takes them over while the hook runs. An
        entry stays held no longer than the hook's timeout, so a hook that hangs is still
        bounded; entries claimed and waiting for the read loop are kept the same way."""
        held = list(self._in_flight[stream])
        for start in range(0, len(held), 1000):
            await self.redis.xclaim(
                stream, self.group, self.replica, 0, held[start : start + 1000], justid=True
            )

    async def _retention_pass(self) -> None:
        """Trim the streams this replica reads (each partition has a reader in every group);
        the backlog of the whole group (the lag gauge)."""
        for stream in self._reading:
            audit = stream == self.keys.audit
            maxlen = self.settings.audit_maxlen if audit else self.settings.events_maxlen
            await self.retention.trim(stream, maxlen)
        backlog = 0
        for partition in self.events:
            mine = (await group_backlogs(self.redis, partition)).get(self.group)
            if mine:
                backlog += (mine["lag"] or 0) + mine["pending"]
        self.backlog = backlog

    async def _heartbeat(self, measure: bool = True) -> bool:
        """Measure the clock; the heartbeat (on Redis's clock) with the offset beside it, and
        the live replicas (this replica's share of the partitions follows them). True if an
        operator removed the hook (its manifest is a tombstone): time to stop."""
        if measure:
            await self.clock.measure(self.redis)
        now = self.clock.now_ms()
        replicas = self.keys.replicas(self.group)
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.get(self.keys.manifest(self.group))
            pipe.zadd(replicas, {self.replica: now})
            # ZRANGE … BYSCORE, not ZRANGEBYSCORE: the hook's ACL user has +zrange (acl.py).
            # Bounded on both sides: a heartbeat dated in the future (a skewed clock, or a
            # member written by hand) is not a live replica, or its share would go unread.
            window = int(self.settings.liveness_secs * 1000)
            pipe.zrange(replicas, now - window, now + window, byscore=True)
            if self.clock.measured:
                pipe.hset(self.keys.clocks(self.group), self.replica, self.clock.offset_ms)
            problem = hook_problem(self.hook)
            publish_problem(pipe, self.keys, self.group, self.replica, problem, self.problem)
            current, _, live, *_ = await pipe.execute()
        self.problem = problem
        self._assign([r.decode() if isinstance(r, bytes) else r for r in live])
        return retired_hook(current) is not None

    async def _claim(self, stream: str) -> None:
        """Take over entries left pending (their hook failed, or their replica died or froze)
        once idle past the backoff for their delivery count (:func:`redelivery_idle_ms`:
        ``claim_idle_secs`` after the first delivery, then doubling, jittered): they go to the
        read loop, or to the dead letters past ``max_deliveries`` (idle ``claim_idle_secs`` after
        the last try). Each is claimed with ``XCLAIM`` at its own idle threshold, so a replica
        that claimed it first wins; a pending entry the hard cap cut is dead-lettered.

        Why not ``XAUTOCLAIM``: it claims every entry past one idle time, whatever its count.
        ``XPENDING … IDLE`` lists the candidates with their counts, ``COUNT`` ten times the
        batch, as ``XAUTOCLAIM`` scans at most ten times its ``COUNT``."""
        floor_ms = int(self.settings.claim_idle_secs * 1000)
        held = self._in_flight[stream]
        # One window a pass, each pass starting after the last one's: entries still backing
        # off fill a window as well as due ones, and a due entry behind ten batches of them
        # (a dead replica's, say) waited until they were dead-lettered.
        start = self._claim_from.get(stream, "-")
        window = self.batch_size * 10
        rows: Any = await self.redis.xpending_range(
            stream, self.group, start, "+", window, idle=floor_ms
        )
        self._claim_from[stream] = (
            "(" + rows[-1]["message_id"].decode() if len(rows) == window else "-"
        )
        due: dict[int, list[bytes]] = {}  # idle threshold (ms) → the entries due at it
        counts: dict[bytes, int] = {}
        for row in rows:
            entry_id, n = row["message_id"], int(row["times_delivered"])
            if entry_id in held or len(counts) >= self.batch_size:
                continue
            last = n >= self.max_deliveries
            idle_ms = floor_ms if last else redelivery_idle_ms(n, entry_id, floor_ms / 1000)
            if int(row["time_since_delivered"]) < idle_ms:
                continue
            counts[entry_id] = n + 1  # XCLAIM counts a delivery
            due.setdefault(idle_ms, []).append(entry_id)
            log.debug(
                "%s: %s of %s delivered %d times, idle past %d ms: claimed",
                self.group, entry_id.decode(), stream, n, idle_ms,
            )  # fmt: skip
        if not due:
            return
        async with self.redis.pipeline(transaction=False) as pipe:
            for idle_ms, ids in due.items():
                pipe.xclaim(stream, self.group, self.replica, idle_ms, ids)
            replies = await pipe.execute()
        returned = [(i, f) for reply in replies for i, f in cast(list[Entry], reply) if f]
        await self._record_cut(stream, [i for i in counts if i not in dict(returned)])
        claimed = [(i, f) for i, f in returned if i not in held]
        if not claimed:
            return
        self.stats["claimed"] += len(claimed)
        retry = [(i, f) for i, f in claimed if counts[i] <= self.max_deliveries]
        give_up = [(i, f) for i, f in claimed if counts[i] > self.max_deliveries]
        if give_up:
            await self._bury(stream, give_up, counts)
        if retry:
            held.update(i for i, _ in retry)  # kept from now on, run by the stream's lane
            self._claimed[stream].append(retry)
            self._wake[stream].set()

    async def _record_cut(self, stream: str, missed: list[bytes]) -> None:
        """Of the entries due that ``XCLAIM`` did not return, those gone from the stream were
        cut by the hard cap while pending (``XCLAIM`` drops them from the group): dead letters.
        The others another replica claimed first."""
        if not missed:
            return
        async with self.redis.pipeline(transaction=False) as pipe:
            for entry_id in missed:
                pipe.xrange(stream, entry_id, entry_id)
            found = await pipe.execute()
        deleted = [i for i, rows in zip(missed, found, strict=True) if not rows]
        if deleted:
            # Two replicas can claim one cut entry at once: the first XCLAIM drops it from the
            # group, the second finds it gone, and both see it missing here. The first to mark
            # it records it (it was counted twice).
            async with self.redis.pipeline(transaction=False) as pipe:
                for entry_id in deleted:
                    mark = self.keys.cut_recorded(self.group, stream, entry_id)
                    pipe.set(mark, self.replica, nx=True, px=CUT_RECORDED_MS)
                first = await pipe.execute()
            deleted = [i for i, won in zip(deleted, first, strict=True) if won]
        if deleted:
            await self.retention.record_trimmed(stream, self.group, deleted)
            self.stats["lost"] += len(deleted)

    async def _bury(self, stream: str, entries: list[Entry], counts: dict[bytes, int]) -> None:
        """Dead-letter entries that failed ``max_deliveries`` times, with the last reason."""
        reasons: Any = await self.redis.hmget(
            self.keys.failures(self.group), [i for i, _ in entries]
        )
        dead = []
        for (entry_id, fields), reason in zip(entries, reasons, strict=True):
            why = reason.decode() if reason else "no reason recorded (the replica died)"
            n = counts.get(entry_id, self.max_deliveries + 1) - 1
            dead.append(
                dead_letter_entry(
                    stream,
                    f"failed {n} deliveries; last: {why}",
                    fields.get(_DATA, b""),
                    hook=self.group,
                    entry_id=entry_id.decode(),
                    deliveries=str(n),
                )
            )
            _failures.error(
                "%s gave up on %s after %d deliveries: %s", self.group, entry_id, n, why
            )
        self.stats["dead_lettered"] += len(dead)
        telemetry.count_dead_letters(self.group, len(dead))
        async with self.redis.pipeline(transaction=False) as pipe:
            for entry in dead:
                xadd_dead_letter(pipe, self.dlq, entry)
            pipe.xack(stream, self.group, *[i for i, _ in entries])
            pipe.hdel(self.keys.failures(self.group), *[i for i, _ in entries])
            await pipe.execute()
