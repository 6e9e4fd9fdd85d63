"""``hookbus coordinator``: decisions for agents written in any language.

An agent XADDs a ``DecisionRequest`` to ``{p}:decisions`` (field ``data``, JSON) and waits on
the list named in its ``reply_to``. Replicas of this service share the consumer group
``coordinators``; each request is dispatched with the same Coordinator (and so the same
semantics) a Python agent embeds, and answered with a ``DecisionReply``. A request that breaks
the protocol gets an error reply that names the field when its ``reply_to`` can be read, and
goes to the dead-letter stream otherwise; the service never stops because of it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import msgspec
from opentelemetry import context as otel_context
from redis.exceptions import RedisError

from bus import telemetry
from bus.coordinator import Coordinator
from bus.dispatch import deadline_cap
from bus.errors import InvalidInputError, ProtocolError
from bus.keys import COORDINATORS_GROUP
from bus.protocol import (
    DATA_FIELD,
    DecisionReply,
    DecisionRequest,
    decode,
    decode_context,
    encode,
    new_id,
    now_ms,
)
from bus.redis_io import (
    UNREACHABLE,
    Entry,
    consume,
    dead_letter,
    ensure_group,
    hand_over,
    keep_and_claim,
)
from bus.runner import check_context
from bus.settings import BusSettings, HookSettings
from workers.worker import REPLY_TTL_MS

log = logging.getLogger("hookbus.coordinator.service")


class _ReplyTo(msgspec.Struct):
    """Just enough of a broken request to answer it."""

    id: str = ""
    reply_to: str = ""


class CoordinatorService:
    """One replica of the coordinator service."""

    def __init__(self, settings: BusSettings, hook_settings: HookSettings | None = None) -> None:
        self.coordinator = Coordinator(settings, hook_settings, source="coordinator-service")
        self.keys = self.coordinator.keys
        self.redis = self.coordinator.redis
        self.settings = settings
        self.stats = {"answered": 0, "rejected": 0, "dead_lettered": 0, "expired": 0, "claimed": 0}
        self._in_flight: dict[bytes, asyncio.Task[None]] = {}
        self.ready = asyncio.Event()

    async def run(self, stop: asyncio.Event) -> None:
        await self.coordinator.start()
        try:
            await self._ensure_group()
            await self._beat()
            self.ready.set()
            log.info("coordinator %s answering %s", self.coordinator.id, self.keys.decisions)
            keeper = asyncio.create_task(self._keep_and_claim(stop))
            try:
                await self._loop(stop)
            finally:
                keeper.cancel()
        finally:
            if self._in_flight:
                await asyncio.wait(list(self._in_flight.values()), timeout=30)
            with contextlib.suppress(*UNREACHABLE):
                await self._retire()
            await self.coordinator.close()
            log.info("coordinator %s stopped: %s", self.coordinator.id, self.stats)

    async def _ensure_group(self) -> None:
        # From "0": requests sent while no replica was up are still answered if their agent is
        # still waiting (requests past ts + timeout_ms are dropped below).
        await ensure_group(self.redis, self.keys.decisions, COORDINATORS_GROUP, start="0")

    async def _loop(self, stop: asyncio.Event) -> None:
        async def answer_all(entries: list[Entry]) -> None:
            for entry_id, fields in entries:
                self._start(entry_id, fields)

        await consume(
            self.redis,
            self.keys.decisions,
            COORDINATORS_GROUP,
            self.coordinator.id,
            count=64,
            stop=stop,
            handle=answer_all,
            recreate=self._ensure_group,
        )

    def _start(self, entry_id: bytes, fields: dict[bytes, bytes]) -> None:
        if entry_id in self._in_flight:
            return
        task = asyncio.create_task(self._answer(entry_id, fields))
        self._in_flight[entry_id] = task
        task.add_done_callback(lambda _: self._in_flight.pop(entry_id, None))

    async def _beat(self) -> None:
        """The heartbeat: ``hookbus coordinator --check`` counts replicas that beat lately."""
        await self.redis.zadd(self.keys.coordinators, {self.coordinator.id: now_ms()})

    async def _retire(self) -> None:
        """Clean shutdown: no longer counted live; unanswered requests go to the live replicas
        at once (not discarded, nor left waiting ``claim_idle_secs``)."""
        await self.redis.zrem(self.keys.coordinators, self.coordinator.id)
        idle_ms = int(self.settings.claim_idle_secs * 1000)
        stream, me = self.keys.decisions, self.coordinator.id
        if left := await hand_over(self.redis, stream, COORDINATORS_GROUP, me, idle_ms):
            log.warning("%d unanswered decision requests handed over to the other replicas", left)

    async def _keep_and_claim(self, stop: asyncio.Event) -> None:
        """Beat; keep the requests being answered ours, and answer those a replica that died or
        froze left unanswered (while their agent still waits: expired ones are dropped)."""
        idle_ms = int(self.settings.claim_idle_secs * 1000)
        last_beat = asyncio.get_running_loop().time()
        while not stop.is_set():
            try:
                if asyncio.get_running_loop().time() - last_beat >= self.settings.heartbeat_secs:
                    await self._beat()
                    last_beat = asyncio.get_running_loop().time()
                for entry_id, fields in await keep_and_claim(
                    self.redis,
                    self.keys.decisions,
                    COORDINATORS_GROUP,
                    self.coordinator.id,
                    self._in_flight,
                    idle_ms,
                ):
                    self.stats["claimed"] += 1
                    log.info("took over decision request %s from a silent replica", entry_id)
                    self._start(entry_id, fields)
            except UNREACHABLE as exc:
                log.debug("claiming failed: %s", exc)
            await asyncio.sleep(
                min(self.settings.heartbeat_secs, self.settings.claim_idle_secs / 3)
            )

    async def _answer(self, entry_id: bytes, fields: dict[bytes, bytes]) -> None:
        data = (fields or {}).get(DATA_FIELD.encode(), b"")
        try:
            request = decode(data, DecisionRequest)
            ctx = decode_context(request.event, request.context)
            check_context(request.event, ctx)
            if not self.keys.is_inbox(request.reply_to):
                raise ProtocolError(
                    f"reply_to must be a key under {self.keys.prefix}:inbox:", "$.reply_to"
                )
        except InvalidInputError as exc:
            await self._reject(entry_id, data, exc)
            return
        timeout = (request.ts + request.timeout_ms - now_ms()) / 1000
        if timeout <= 0:
            self.stats["expired"] += 1
            log.info("decision request %s expired before it was read; dropped", request.id)
            with contextlib.suppress(*UNREACHABLE):  # else it is dropped when claimed again
                await self.redis.xack(self.keys.decisions, COORDINATORS_GROUP, entry_id)
            return
        # Every hook of this dispatch must answer within what the agent will wait, so that a
        # slow hook is skipped under its failure policy rather than failing the whole decision.
        deadline_cap.set(asyncio.get_running_loop().time() + timeout * 0.95)
        if request.traceparent:  # the agent's trace continues through this dispatch
            otel_context.attach(telemetry.context_from(request.traceparent, request.tracestate))
        try:
            result = await asyncio.wait_for(self.coordinator.run(request.event, ctx), timeout)
            reply = DecisionReply(
                id=new_id(), ts=now_ms(), request_id=request.id, event=request.event, result=result
            )
        except TimeoutError:
            reply = DecisionReply(
                id=new_id(),
                ts=now_ms(),
                request_id=request.id,
                event=request.event,
                status="error",
                error=f"no decision within timeout_ms={request.timeout_ms}",
            )
        await self._send(entry_id, request.reply_to, reply)
        self.stats["answered"] += 1

    async def _reject(self, entry_id: bytes, data: bytes, exc: InvalidInputError) -> None:
        field = exc.field if isinstance(exc, ProtocolError) else ""
        self.stats["rejected"] += 1
        log.warning("rejected decision request %s: %s", entry_id.decode(), exc)
        try:
            head = msgspec.json.decode(data, type=_ReplyTo)
        except msgspec.DecodeError:
            head = _ReplyTo()
        if self.keys.is_inbox(head.reply_to):
            reply = DecisionReply(
                id=new_id(),
                ts=now_ms(),
                request_id=head.id,
                status="error",
                error=str(exc),
                field=field,
            )
            await self._send(entry_id, head.reply_to, reply)
        else:
            self.stats["dead_lettered"] += 1
            await dead_letter(self.redis, self.keys, self.keys.decisions, str(exc), data)
            await self.redis.xack(self.keys.decisions, COORDINATORS_GROUP, entry_id)

    async def _send(self, entry_id: bytes, reply_to: str, reply: Any) -> None:
        try:
            async with self.redis.pipeline(transaction=False) as pipe:
                pipe.rpush(reply_to, encode(reply))
                pipe.pexpire(reply_to, REPLY_TTL_MS)
                pipe.xack(self.keys.decisions, COORDINATORS_GROUP, entry_id)
                await pipe.execute()
        except (RedisError, OSError) as exc:
            log.warning("could not answer %s: %s", reply.request_id, exc)
