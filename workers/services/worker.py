"""The hook-worker service: serves one AgentHook over Redis (``hookbus worker MODULE:CLASS``).

Replicas of one hook share the consumer group ``workers`` on ``{p}:hook:{name}:requests``. Each
request is checked (a malformed one goes to the dead-letter stream with its reason), dropped
unanswered if its deadline has passed, else run under the time it has left; the reply goes to
the requester's inbox, then the entry is acknowledged. The replies of all the requests of a read
whose hook answers without waiting go out in one write, and their XACK in the write of the next
read (the request stream's node; on a cluster the inboxes are on other masters).

A replica that dies holding requests does not lose them: every live replica keeps its own
in-flight entries fresh (XCLAIM … JUSTID) and takes over entries left idle longer than
``claim_idle_secs`` by a silent one (XAUTOCLAIM) — still only while their deadline holds.

Why raw redis-py rather than a FastStream subscriber: this is the synchronous hot path, measured
against a raw redis-py floor. FastStream acknowledges each message with its own round trip and
parses its own framing first; here a read's replies share one write, and its XACK the next read's.

Why one module: one class, a replica's loop: reading requests, running the hook under its
deadline, replying, heartbeats and taking over a dead replica's entries share the replica's in-
flight entries. What does not (the loop watchdog, the probes, loading a hook class) has modules
of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
import types
from collections.abc import Awaitable
from typing import Any

import msgspec
from opentelemetry.trace import Status, StatusCode
from redis.asyncio import Redis
from redis.exceptions import RedisError

from bus.aggregation import ALLOWED_ACTIONS, check_answer
from bus.dispatch import eager, late, log_raised, not_a_coroutine, overran, own_task
from bus.errors import ConfigError, HookCrashed, HookRetired, LimitError, ProtocolError
from bus.events import tool_of
from bus.hooks import SYNC_METHODS, AgentHook, spec_of
from bus.protocol import (
    DATA_FIELD,
    ControlMessage,
    HookManifest,
    HookReply,
    HookRequest,
    decode,
    decode_context,
    decode_head,
    encode,
    new_id,
    now_ms,
    retired_hook,
)
from bus.ratelog import RateLimitedLog
from bus.settings import BusSettings
from bus.telemetry import metrics
from bus.telemetry import tracing as telemetry
from bus.transport.backoff import Backoff
from bus.transport.clock import START_SAMPLES, ExpiredDrops, RedisClock
from bus.transport.directory import read_manifest, write_manifest
from bus.transport.keys import MAX_SHARDS, WORKERS_GROUP, Keys, check_name
from bus.transport.redis_io import (
    Acks,
    CutWatch,
    Entry,
    Settled,
    check_partitions,
    connect,
    consume,
    current_manifest,
    dead_letter,
    ensure_group,
    hand_over,
    hook_problem,
    keep_and_claim,
    partitions_changed,
    pipelined,
    publish_problem,
    refuse_retired,
    retire_replica,
)
from bus.transport.redis_io import (
    close as close_client,
)
from bus.transport.retention import group_backlogs
from workers.services.loading import load_hook as load_hook  # where callers have found it
from workers.services.loopwatch import LoopWatch, hook_codes
from workers.services.probes import Health

log = logging.getLogger("hookbus.worker")
_failures = RateLimitedLog(log)
REPLY_TTL_MS = 60_000
#: Registration's retries while Redis is unreachable (:meth:`HookWorker._retry`).
RETRY_FIRST_SECS, RETRY_CAP_SECS = 0.1, 2.0


async def _awaited(awaitable: Awaitable[Any]) -> Any:
    return await awaitable


async def idle_while_removed(
    redis: Redis,
    keys: Keys,
    name: str,
    health: Health,
    every: float,
    stop: asyncio.Event,
    why: str = "",
    *,
    say: bool = True,
) -> bool:
    """A replica of a hook an operator removed: up, ready (``health`` beats while Redis
    answers) but idle, until the hook is restored (True) or ``stop`` is set (False). Looks
    every ``every`` seconds; says once (if ``say``) why, and how to undo it: ``why``, else the
    tombstone's own words. Exiting instead would make a Deployment restart it in a loop."""
    said = False
    while not stop.is_set():
        try:
            tomb = retired_hook(await read_manifest(redis, keys, name))
        except (RedisError, OSError) as exc:
            log.debug("could not read the manifest of %s: %s", name, exc)
        else:
            if tomb is None:
                log.info("hook %s was restored: serving it again", name)
                return True
            health.beat()  # ready: Redis answers, and this replica does what it should
            if not said and say:
                log.warning(
                    "%s; this replica stays up, idle (it answers nothing), until then",
                    why or refuse_retired(tomb),
                )
            said = True
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), every)
    return False


async def _relay(source: asyncio.Event, target: asyncio.Event) -> None:
    await source.wait()
    target.set()


class _Head(msgspec.Struct):
    """Just enough of a malformed request to answer it."""

    id: str = ""
    reply_to: str = ""


class Replies:
    """The replies of one batch of requests, by inbox, and the entries they answer."""

    __slots__ = ("acks", "inboxes", "open")

    def __init__(self) -> None:
        self.inboxes: dict[str, list[bytes]] = {}
        self.acks: list[bytes] = []
        self.open = True

    def add(self, inbox: str, payload: bytes, entry_id: bytes) -> bool:
        """Join the batch, if it has not gone out yet."""
        if self.open:
            self.add_one(inbox, payload, entry_id)
        return self.open

    def add_one(self, inbox: str, payload: bytes, entry_id: bytes) -> Replies:
        self.inboxes.setdefault(inbox, []).append(payload)
        self.acks.append(entry_id)
        return self

    def close(self) -> Replies:
        self.open = False
        return self


async def send_replies(
    redis: Redis,
    stream: str,
    group: str,
    replies: Replies,
    *,
    expire: bool = False,
    ack: bool = True,
) -> int | None:
    """Send the replies of a batch and acknowledge its requests: one pipelined round trip (one
    ``RPUSH`` per inbox, with ``expire`` a ``PEXPIRE`` too, one ``XACK``). A hook worker sets
    no TTL: an inbox's TTL is its owner's (bus/transport/coordinator.py), and a hook's user
    may not PEXPIRE (it could delete the other hooks' replies waiting there); the coordinator
    service sets it on the inboxes of the agents it answers. Returns how many replies could not
    be delivered (an inbox key that is not a list: that asker times out, the others of the batch
    are answered; retrying cannot help), or None if the requests were not acknowledged (Redis
    away, or it refused the XACK): they stay pending, answered again when claimed. Every
    failure is logged. ``ack=False``: the caller acknowledges them itself (a hook worker's
    next read carries the XACK), and None means the replies were not sent."""
    if not replies.acks:
        return 0
    commands: list[tuple[Any, ...]] = []
    for inbox, payloads in replies.inboxes.items():
        commands.append(("RPUSH", inbox, *payloads))
        if expire:
            commands.append(("PEXPIRE", inbox, REPLY_TTL_MS))
    if ack:
        commands.append(("XACK", stream, group, *replies.acks))
    try:
        sent = await pipelined(redis, commands)
    except (RedisError, OSError) as exc:
        _failures.warning("could not send %d replies: %s", len(replies.acks), exc)
        return None
    acked = sent.pop() if ack else 0
    if isinstance(acked, Exception):
        _failures.warning("could not acknowledge %d requests: %s", len(replies.acks), acked)
        return None
    unsent = 0
    pushes = sent[:: 2 if expire else 1]
    for (inbox, payloads), pushed in zip(replies.inboxes.items(), pushes, strict=True):
        if isinstance(pushed, Exception):
            unsent += len(payloads)
            _failures.warning("could not reply to %r: %s", inbox, pushed)  # named by the asker
    return unsent


class HookWorker:
    """One replica of one synchronous hook service.

    Args:
        hook: the AgentHook to serve.
        settings: Redis URL, prefix and timings.
        scope: "global", or "session" for a hook called only where a session attaches it.
        concurrency: requests handled at once by this replica.
    """

    def __init__(
        self,
        hook: AgentHook,
        settings: BusSettings,
        *,
        scope: str = "global",
        concurrency: int = 64,
        shard: int = 0,
        shards: int = 1,
        owns_hook: bool = True,
    ) -> None:
        self.hook = hook
        self.problem = ""  # what the last heartbeat published of the hook's problem()
        self.spec = spec_of(hook)
        check_name("hook name", self.spec.name)
        self.settings = settings
        self.keys = Keys.of(settings)
        if not 0 <= shard < shards <= MAX_SHARDS:
            raise ConfigError(f"shard {shard} of {shards}: shards must be 1-{MAX_SHARDS}")
        self.shards = shards
        self.owns_hook = owns_hook  # the lane that closes the hook when the service stops
        self.stream = self.keys.requests(self.spec.name, shard, shards)
        #: This hook's own dead letters (its user may write no other unit's).
        self.dlq = self.keys.hook_dlq(self.spec.name)
        self.cuts = CutWatch()
        self.scope = scope
        lane = f"#{shard}" if shards > 1 else ""
        self.replica = f"{socket.gethostname()}-{os.getpid()}-{new_id()[:4]}{lane}"
        self.redis = connect(settings)
        self.stats = {"handled": 0, "expired": 0, "malformed": 0, "errors": 0, "claimed": 0,
                      "unsent": 0, "overran": 0}  # fmt: skip
        # Deadlines are on Redis's clock (bus/transport/clock.py); drops past them are counted and
        # logged.
        self.clock = RedisClock(f"hook {self.spec.name} replica {self.replica}")
        self.expired = ExpiredDrops(log, f"requests for {self.spec.name}")
        self._in_flight: dict[bytes, asyncio.Task[None] | None] = {}
        self._settled = Settled()
        self._acks = Acks()  # answered; the read loop's next read acknowledges them
        self._slots = asyncio.Semaphore(concurrency)
        self.registered = asyncio.Event()
        self.removed = False  # an operator removed the hook while this replica served it
        self.manifest = b""
        self.health = Health(settings.liveness_secs, self.clock)  # what its probes answer
        metrics.track(self, "worker", self.spec.name)  # its stats, at /metrics
        metrics.track_backlog(self, self.spec.name)
        self.backlog = 0  # requests waiting in its stream, read every metrics.BACKLOG_SECS

    # -- registration ------------------------------------------------------------------------

    async def register(self) -> None:
        """Publish the manifest, make sure the group exists, and announce this replica."""
        await check_partitions(self.redis, self.keys)  # ConfigError: refuses to start
        previous = await current_manifest(self.redis, self.keys, self.spec.name)
        registered_at = now_ms()
        if previous:
            with contextlib.suppress(ProtocolError):
                registered_at = decode(previous, HookManifest).registered_at or registered_at
        manifest = HookManifest.of(self.spec, "sync", registered_at, self.scope)  # type: ignore[arg-type]
        manifest = msgspec.structs.replace(manifest, shards=self.shards)
        self.manifest = encode(manifest)
        await write_manifest(self.redis, self.keys, self.spec.name, self.manifest)
        await self._ensure_group()
        await self.clock.measure(self.redis, START_SAMPLES)
        async with self.redis.pipeline(transaction=False) as pipe:
            self._beat(pipe)
            await pipe.execute()
        self.health.beat()
        await self._announce("manifest")
        self.registered.set()
        log.info("hook %s replica %s serving %s", self.spec.name, self.replica, self.stream)

    async def deregister(self) -> None:
        await retire_replica(self.redis, self.keys, self.spec.name, self.replica)
        await self._announce("deregister")
        idle_ms = int(self.settings.claim_idle_secs * 1000)
        if left := await hand_over(self.redis, self.stream, WORKERS_GROUP, self.replica, idle_ms):
            log.warning("%d unfinished requests handed over to the other replicas", left)

    async def _announce(self, kind: str) -> None:
        note = ControlMessage(type=kind, name=self.spec.name, replica=self.replica)  # type: ignore[arg-type]
        await self.redis.publish(self.keys.control, encode(note))

    async def _ensure_group(self) -> None:
        # From "0": after a restart, requests sent before the group existed are still served
        # (expired ones are dropped by their deadline, as always).
        await ensure_group(self.redis, self.stream, WORKERS_GROUP, start="0")

    # -- the service loop ----------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Serve until ``stop`` is set, then finish in-flight requests and deregister.

        While an operator has removed the hook (``hookbus hooks remove``), whether before this
        replica started or while it serves, it stays up, ready but idle: it answers nothing,
        says once why and how to undo it, and serves again once the hook is restored (``hookbus
        hooks restore``). Exiting instead would make a Deployment restart it in a loop.
        """
        watch = None
        if self.owns_hook:  # one watchdog per process, whatever the lanes
            threshold = max(0.25, min(1.0, self.spec.timeout or 1.0))
            watch = LoopWatch(self.spec.name, hook_codes(self.hook), threshold)
            watch.start()
        try:
            while not stop.is_set():
                try:
                    await self._retry(self.register, stop)
                except HookRetired as exc:
                    if await self._idle(str(exc), stop):
                        continue
                    break
                if not await self._serve(stop) or not await self._idle("", stop):
                    break
        finally:
            if watch is not None:
                watch.stop()
            self.health.stopping()
            await close_client(self.redis)  # with the per-node clients a cluster opened
            close = getattr(self.hook, "close", None) if self.owns_hook else None
            if callable(close):  # let the hook release what it holds (files, connections)
                result = close()
                if asyncio.iscoroutine(result):
                    await result
            self.expired.flush()
            log.info("hook %s replica %s stopped: %s", self.spec.name, self.replica, self.stats)

    async def _serve(self, stop: asyncio.Event) -> bool:
        """Serve until ``stop`` is set or an operator removes the hook (then True), then
        finish in-flight requests and deregister."""
        serving = asyncio.Event()  # set by ``stop``, or by the keep-alive seeing a tombstone
        relay = asyncio.create_task(_relay(stop, serving))
        self.removed = False
        keeper = asyncio.create_task(self._keep_alive(serving))
        try:
            await self._read_loop(serving)
        finally:
            if tasks := [t for t in self._in_flight.values() if t is not None]:
                await asyncio.wait(tasks, timeout=30)
            for task in (keeper, relay):
                task.cancel()
            await asyncio.gather(keeper, relay, return_exceptions=True)
            try:
                await self.deregister()
            except RedisError as exc:
                log.warning("could not deregister %s: %s", self.replica, exc)
        return self.removed and not stop.is_set()

    async def _idle(self, why: str, stop: asyncio.Event) -> bool:
        """Ready but idle while the hook stays removed (``idle_while_removed``)."""
        return await idle_while_removed(
            self.redis, self.keys, self.spec.name, self.health, self.settings.heartbeat_secs,
            stop, why, say=self.owns_hook,
        )  # fmt: skip

    async def _retry(self, fn: Any, stop: asyncio.Event) -> None:
        """Call ``fn`` until it succeeds or ``stop`` is set, backing off while Redis is
        unreachable: at most 0.1 s first, doubling to at most 2 s (bus/transport/backoff.py)."""
        backoff = Backoff(RETRY_FIRST_SECS, RETRY_CAP_SECS)
        while not stop.is_set():
            try:
                await fn()
                return
            except (RedisError, OSError) as exc:
                delay = backoff.next()
                log.warning("Redis unreachable (%s); retrying in %.1fs", exc, delay)
                await asyncio.sleep(delay)

    async def _read_loop(self, stop: asyncio.Event) -> None:
        self._acks = Acks()
        await consume(
            self.redis,
            self.stream,
            WORKERS_GROUP,
            self.replica,
            count=32,
            stop=stop,
            handle=self._start_all,
            recreate=lambda: self._retry(self._ensure_group, stop),
            acks=self._acks,
        )

    async def _start_all(self, entries: list[Entry]) -> None:
        """Start every request of one read; the answers ready at once go out together."""
        replies = Replies()
        for entry_id, fields in entries:
            if self._slots.locked():  # the next waits for a slot: what is answered goes first
                await asyncio.sleep(0)
                if replies.acks:
                    await self._send(replies.close())
                    replies = Replies()
            await self._start(entry_id, fields, replies)
        await asyncio.sleep(0)  # the requests' tasks take their first step: most answer in it
        # The reply goes to the asker's inbox; the XACK waits for the read that follows at once
        # (consume), on this stream's node: on a cluster, one write to each instead of two.
        await self._send(replies.close(), carry=True)

    async def _start(
        self, entry_id: bytes, fields: dict[bytes, bytes] | None, replies: Replies | None = None
    ) -> None:
        if entry_id in self._in_flight or entry_id in self._settled:
            return
        await self._slots.acquire()
        # A task of its own from the first step on (bus/dispatch.py, own_task): a hook that
        # answers without waiting joins the batch's replies (_start_all lets the tasks take
        # their first step before it sends them); one that waits replies on its own.
        task = own_task(self._handle_safely(entry_id, fields, replies))
        self._in_flight[entry_id] = task
        task.add_done_callback(lambda _: self._finished(entry_id))

    def _finished(self, entry_id: bytes) -> None:
        self._in_flight.pop(entry_id, None)
        self._slots.release()

    # -- one request ---------------------------------------------------------------------------

    async def _handle_safely(
        self, entry_id: bytes, fields: dict[bytes, bytes] | None, replies: Replies | None
    ) -> None:
        """``_handle``, and whatever it raises besides Redis being away makes the entry a dead
        letter, acknowledged once: a message never stops this replica, nor comes back."""
        try:
            await self._handle(entry_id, fields, replies)
        except (RedisError, OSError) as exc:  # left pending: retried once Redis is back
            _failures.warning("request %s not handled, Redis away: %s", entry_id.decode(), exc)
        except Exception as exc:
            self.stats["malformed"] += 1
            _failures.error(
                "request %s could not be handled; dead-lettered: %r",
                entry_id.decode(),
                exc,
                exc_info=True,
            )
            data = (fields or {}).get(DATA_FIELD.encode(), b"")
            why = f"could not be handled: {type(exc).__name__}: {exc}"
            await dead_letter(
                self.redis, self.dlq, self.stream, why, data, entry_id=entry_id.decode()
            )
            await self._ack(entry_id)

    async def _handle(
        self, entry_id: bytes, fields: dict[bytes, bytes] | None, replies: Replies | None = None
    ) -> None:
        data = (fields or {}).get(DATA_FIELD.encode())
        try:
            if data is None:
                raise ProtocolError(f"entry has no {DATA_FIELD!r} field", "$")
            request = decode(data, HookRequest)
            ctx = decode_context(request.event, request.context)
            if request.hook != self.spec.name:
                raise ProtocolError(f"request for hook {request.hook!r} sent to {self.spec.name}")
            if not self.keys.is_inbox(request.reply_to):
                raise ProtocolError(f"reply_to {request.reply_to!r} is not an inbox", "$.reply_to")
        except ProtocolError as exc:
            self.stats["malformed"] += 1
            _failures.warning("malformed request %s dead-lettered: %s", entry_id.decode(), exc)
            await dead_letter(
                self.redis,
                self.dlq,
                self.stream,
                str(exc),
                data or b"",
                entry_id=entry_id.decode(),
            )
            await self._refuse(data or b"", exc)
            await self._ack(entry_id)
            return
        remaining = (request.deadline - self.clock.now_ms()) / 1000
        if remaining <= 0:
            self.stats["expired"] += 1
            self.expired.drop(
                f"request {request.id} for {request.event} read {-remaining:.3f} s after its "
                f"deadline; this clock's offset from Redis's: {self.clock.offset_ms:+d} ms"
            )
            await self._ack(entry_id)
            return
        t0 = time.perf_counter()
        if telemetry.enabled():
            outcome = await self._traced(request, ctx, remaining)
        else:
            outcome = await self._run_hook(request, ctx, remaining)
        if outcome is None:
            self.stats["expired"] += 1
            self.expired.drop(f"request {request.id} for {request.event} ran past its deadline")
            await self._ack(entry_id)  # the coordinator has given up on it: no reply
            return
        status, action, error = outcome
        metrics.answered(self.spec.name, request.event, action, status != "ok",
                         time.perf_counter() - t0)  # fmt: skip
        reply = HookReply(
            id=new_id(),
            ts=now_ms(),
            request_id=request.id,
            hook=self.spec.name,
            replica=self.replica,
            status=status,  # type: ignore[arg-type]
            action=action,
            error=error,
            elapsed_ms=(time.perf_counter() - t0) * 1000,
            traceparent=request.traceparent,
            tracestate=request.tracestate,
        )
        try:
            payload = encode(reply)
        except LimitError as exc:  # an answer too deep or too large to send fails the hook
            self.stats["errors"] += 1
            error = f"the hook's answer could not be sent: {exc}"
            payload = encode(
                msgspec.structs.replace(reply, status="error", action=None, error=error[:2000])
            )
        if request.reply_max and len(payload) > request.reply_max:
            payload = self._over_bound(request, reply, len(payload))
        if replies is None or not replies.add(request.reply_to, payload, entry_id):
            await self._send(Replies().add_one(request.reply_to, payload, entry_id))

    def _over_bound(self, request: HookRequest, reply: HookReply, size: int) -> bytes:
        """A reply over the bound its coordinator set (``HookRequest.reply_max``) would be
        dropped unread there, and the hook taken for one that timed out: the hook fails here,
        loudly, with an error reply that says why (within the bound: an error is short)."""
        if reply.status == "ok":
            error = (  # its first 40 characters are the same every time: one log line per 10 s
                f"answer over its reply bound (reply_max): {size} bytes as a HookReply to "
                f"{request.event.value}, over the {request.reply_max} bytes its coordinator reads "
                "for this request (twice the context and 16 KiB for a tool event, 16 KiB for the "
                "others; docs/protocol.md 3.2)"
            )
            self._failed(request.event, error)
        else:
            error = reply.error
        cut = msgspec.structs.replace(reply, status="error", action=None, error=error[:1000])
        return encode(cut)

    async def _send(self, replies: Replies, carry: bool = False) -> None:
        """Send a batch's replies and acknowledge its requests, with ``carry`` by the read loop's
        next read (``self._acks``)."""
        carry = carry and self._acks.taken
        unsent = await send_replies(self.redis, self.stream, WORKERS_GROUP, replies, ack=not carry)
        if unsent is None:  # not acknowledged: answered again when claimed
            return
        if carry and not self._acks.hand(replies.acks):  # the reader stopped meanwhile
            await self._ack(*replies.acks)
        for entry_id in replies.acks:
            self._settled.add(entry_id)
        self.stats["unsent"] += unsent
        self.stats["handled"] += len(replies.acks) - unsent

    async def _run_hook(
        self, request: HookRequest, ctx: Any, remaining: float
    ) -> tuple[str, Any, str] | None:
        """(status, action, error) of one hook call, or None if it ran out of time. Decided as
        the embedded dispatcher decides (bus/dispatch.py), and every failure is logged here,
        where the hook ran (once per kind, then counted: bus/ratelog.py)."""
        event = request.event
        t0 = time.perf_counter()
        try:
            started = getattr(self.hook, SYNC_METHODS[event])(ctx)
            if type(started) is not types.CoroutineType:
                if not isinstance(started, Awaitable):  # a plain def (refused at load)
                    raise HookCrashed(not_a_coroutine(event, started))
                started = _awaited(started)
            done, answer = eager(started)  # most hooks answer without awaiting anything
            if (elapsed := time.perf_counter() - t0) > remaining:
                if not done:  # it yielded at last, too late: what is left of it never runs
                    answer.close()
                    started.close()
                self._too_late(event, overran(elapsed, remaining))
                return None
            if not done:  # the rest in this same task (not wait_for's: a task of its own)
                async with asyncio.timeout(remaining - elapsed):
                    answer = await answer
                if (elapsed := time.perf_counter() - t0) > remaining:
                    self._too_late(event, late(elapsed, remaining))
                    return None
        except TimeoutError:
            return None
        except HookCrashed as exc:
            return self._failed(event, str(exc))
        except Exception as exc:
            detail = f"{type(exc).__name__}: {exc}"
            log_raised(self.spec.name, event, detail, exc)
            self.stats["errors"] += 1
            return "error", None, detail
        outcome = check_answer(event, self.spec, answer, 0.0)
        if outcome.failure is not None:  # the wrong type, or an answer too large to send
            return self._failed(event, outcome.detail)
        return "ok", (outcome.action if event in ALLOWED_ACTIONS else None), ""

    def _failed(self, event: Any, detail: str) -> tuple[str, Any, str]:
        self.stats["errors"] += 1
        _failures.error(
            "hook %s failed on %s: %s (it fails under its failure policy)",
            self.spec.name,
            event.value,
            detail,
            key=f"failed {detail[:40]}",
        )
        return "error", None, detail

    def _too_late(self, event: Any, detail: str) -> None:
        """A hook that held the event loop past the request's deadline: no reply (the asker
        has timed out), and a line that says what to change."""
        self.stats["overran"] += 1
        _failures.error(
            "hook %s %s; the request for %s was dropped (its asker timed out)",
            self.spec.name,
            detail,
            event.value,
            key="overran",
        )

    async def _traced(
        self, request: HookRequest, ctx: Any, remaining: float
    ) -> tuple[str, Any, str] | None:
        tool, _ = tool_of(ctx)
        attrs = {
            "hook.name": self.spec.name,
            "hook.event": request.event.value,
            "session.id": request.session_id,
            "hook.failure_policy": self.spec.failure_policy,
            "hook.replica": self.replica,
            # its own timeout, else the time its coordinator gave it (that one's default)
            "hook.timeout_ms": int(self.spec.timeout * 1000)
            if self.spec.timeout
            else request.deadline - request.ts,
            **({"gen_ai.tool.name": tool} if tool else {}),
        }
        name = f"hook {self.spec.name}"
        with telemetry.hook_span(name, attrs, request.traceparent, request.tracestate) as span:
            outcome = await self._run_hook(request, ctx, remaining)
            span.set_attribute("hook.timed_out", outcome is None)
            if outcome is None:
                span.set_status(Status(StatusCode.ERROR, "ran past the request's deadline"))
                return None
            status, action, error = outcome
            tag = telemetry.action_tag(action) if status == "ok" else "error"
            span.set_attribute("hook.action", tag)
            telemetry.annotate(span, action)
            if status == "error":
                span.set_status(Status(StatusCode.ERROR, error))
            return outcome

    async def _refuse(self, data: bytes, exc: ProtocolError) -> None:
        """Tell the requester at once, when it can be told, instead of letting it time out. A
        request over the bounds of ``bus/limits.py`` is not read further (no coordinator of
        HookBus sends one: it refuses such a context before asking any hook)."""
        if isinstance(exc, LimitError):
            return
        head = decode_head(data, _Head)
        if head is None or not (head.id and self.keys.is_inbox(head.reply_to)):
            return
        reply = HookReply(
            id=new_id(),
            ts=now_ms(),
            request_id=head.id,
            hook=self.spec.name,
            replica=self.replica,
            status="error",
            error=f"malformed request: {exc}"[:2000],
        )
        with contextlib.suppress(RedisError, OSError, ProtocolError):
            await self.redis.rpush(head.reply_to, encode(reply))

    async def _ack(self, *entry_ids: bytes) -> None:
        try:
            await self.redis.xack(self.stream, WORKERS_GROUP, *entry_ids)
            for entry_id in entry_ids:
                self._settled.add(entry_id)
        except (RedisError, OSError) as exc:
            log.warning("could not acknowledge %s: %s", entry_ids[0].decode(), exc)

    # -- liveness: heartbeat, keeping our entries ours, taking over a dead replica's -------------

    async def _keep_alive(self, stop: asyncio.Event) -> None:
        interval = min(self.settings.heartbeat_secs, self.settings.claim_idle_secs / 3)
        last_beat = last_backlog = 0.0
        while not stop.is_set():
            try:
                if time.monotonic() - last_backlog >= metrics.BACKLOG_SECS:
                    last_backlog = time.monotonic()
                    mine = (await group_backlogs(self.redis, self.stream)).get(WORKERS_GROUP)
                    self.backlog = (mine["lag"] or 0) + mine["pending"] if mine else 0
                if time.monotonic() - last_beat >= self.settings.heartbeat_secs:
                    if await partitions_changed(self.redis, self.keys):
                        stop.set()
                        return
                    if self.owns_hook:  # what its dead-letter cap cut: logged as it grows
                        await self.cuts.check(self.redis, self.keys, [self.dlq])
                    if await self._heartbeat():
                        log.warning(
                            "hook %s was removed by an operator: this replica stops serving it",
                            self.spec.name,
                        )
                        self.removed = True
                        stop.set()
                        return
                    last_beat = time.monotonic()
                    self.health.beat()
                idle_ms = int(self.settings.claim_idle_secs * 1000)
                for entry_id, fields in await keep_and_claim(
                    self.redis, self.stream, WORKERS_GROUP, self.replica, self._in_flight, idle_ms,
                    dlq=self.dlq, hook=self.spec.name,
                ):  # fmt: skip
                    self.stats["claimed"] += 1
                    await self._start(entry_id, fields)
            except (RedisError, OSError) as exc:
                log.debug("keep-alive failed: %s", exc)
            except Exception:  # the keep-alive outlives anything: heartbeats and takeovers
                _failures.error("keep-alive pass failed", exc_info=True)
            self.expired.tick()
            await asyncio.sleep(interval)

    def _beat(self, pipe: Any) -> None:
        """The heartbeat (on Redis's clock), with this replica's clock offset and its hook's
        problem, if it has one, beside it."""
        pipe.zadd(self.keys.replicas(self.spec.name), {self.replica: self.clock.now_ms()})
        if self.clock.measured:
            pipe.hset(self.keys.clocks(self.spec.name), self.replica, self.clock.offset_ms)
        problem = hook_problem(self.hook)
        publish_problem(pipe, self.keys, self.spec.name, self.replica, problem, self.problem)
        self.problem = problem

    async def _heartbeat(self) -> bool:
        """Measure the clock, say this replica is alive; restore the manifest if Redis lost it
        (a restart). True if an operator removed the hook (its manifest is a tombstone): time
        to stop."""
        await self.clock.measure(self.redis)
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.set(self.keys.manifest(self.spec.name), self.manifest, nx=True)
            pipe.get(self.keys.manifest(self.spec.name))
            pipe.sadd(self.keys.hooks, self.spec.name)
            self._beat(pipe)
            restored, current = (await pipe.execute())[:2]
        if retired_hook(current) is not None:
            return True
        if restored:
            log.warning("manifest of %s was missing (Redis restarted?); restored", self.spec.name)
            await self._ensure_group()
            await self._announce("manifest")
        return False
