"""Small typed helpers over redis-py shared by the coordinator and the worker services."""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Collection
from typing import Any, cast

from redis.asyncio import Redis
from redis.asyncio import connection as redis_connection
from redis.exceptions import RedisError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from bus.keys import Keys
from bus.protocol import now_ms
from bus.ratelog import RateLimitedLog
from bus.settings import BusSettings

log = logging.getLogger("hookbus.redis")
_failures = RateLimitedLog(log)

Entry = tuple[bytes, dict[bytes, bytes]]

#: Errors that mean "Redis is not reachable right now": retry later, never crash.
UNREACHABLE = (RedisError, OSError)


SOCKET_TIMEOUT = 10.0


class _Connection(redis_connection.Connection):
    """redis-py's connection, sending under ``asyncio.timeout`` instead of ``wait_for``.

    With a socket timeout set, redis-py wraps every send in ``asyncio.wait_for``, which on
    Python 3.11 creates a task and costs an event-loop turn per command (about 45 µs of a
    350 µs dispatch here). Reads keep redis-py's own (cheap) timeout.
    """

    async def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        timeout, self.socket_timeout = self.socket_timeout, None
        try:
            async with asyncio.timeout(timeout):
                await super().send_packed_command(command, check_health)
        except TimeoutError:
            await self.disconnect(nowait=True)
            raise RedisTimeoutError("Timeout writing to socket") from None
        finally:
            self.socket_timeout = timeout


def connect(settings: BusSettings) -> Redis:
    """A redis-py asyncio client for HookBus: bytes in and out, reconnecting on demand."""
    client = Redis.from_url(
        settings.redis_url,
        socket_connect_timeout=2,
        socket_timeout=SOCKET_TIMEOUT,
        health_check_interval=0,
        retry_on_timeout=False,
    )
    pool = client.connection_pool
    if pool.connection_class is redis_connection.Connection:  # not for TLS or unix sockets
        pool.connection_class = _Connection
    return client


def group_lost(exc: ResponseError) -> bool:
    """NOGROUP, or a blocked read woken because its stream was deleted: recreate the group."""
    text = str(exc)
    return "NOGROUP" in text or "no longer exists" in text


async def ensure_group(redis: Redis, stream: str, group: str, start: str = "$") -> None:
    """Create ``group`` on ``stream`` (and the stream) unless it exists."""
    try:
        await redis.xgroup_create(stream, group, id=start, mkstream=True)
    except ResponseError as exc:
        if "BUSYGROUP" not in str(exc):
            raise


async def read_group(
    redis: Redis, group: str, consumer: str, stream: str, *, count: int, block_ms: int | None
) -> list[Entry]:
    """New entries for ``consumer`` (XREADGROUP … >), or [] after ``block_ms`` (None: at once)."""
    response: Any = await redis.xreadgroup(
        group, consumer, {stream: ">"}, count=count, block=block_ms
    )
    entries: list[Entry] = []
    for _, batch in response or ():
        entries.extend(cast(list[Entry], batch))
    return entries


async def consume(
    redis: Redis,
    stream: str,
    group: str,
    consumer: str,
    *,
    count: int,
    stop: asyncio.Event,
    handle: Callable[[list[Entry]], Awaitable[None]],
    recreate: Callable[[], Awaitable[None]],
) -> None:
    """Read a consumer group until ``stop``: new entries go to ``handle``; a lost group is
    recreated; while Redis is unreachable the loop backs off and retries (it never dies)."""
    backoff = 0.1
    while not stop.is_set():
        try:
            entries = await read_group(redis, group, consumer, stream, count=count, block_ms=200)
            backoff = 0.1
        except ResponseError as exc:
            if group_lost(exc):
                log.warning("%s or its group %s vanished; recreating it", stream, group)
                try:
                    await recreate()
                except UNREACHABLE as lost:  # tried again at the next read
                    log.warning("could not recreate %s (%s); retrying", group, lost)
                    await asyncio.sleep(backoff)
            else:
                log.error("Redis refused a read of %s (%s); retrying", stream, exc)
                await asyncio.sleep(backoff)
            continue
        except UNREACHABLE as exc:
            log.warning("Redis unreachable (%s); retrying in %.1fs", exc, backoff)
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 2.0)
            continue
        try:
            await handle(entries)
        except UNREACHABLE as exc:  # lost while handling: what was not acknowledged stays
            log.warning("Redis unreachable while handling %s (%s); retrying", stream, exc)
            await asyncio.sleep(backoff)
        except Exception:  # no message stops the loop; what was not acknowledged is claimed
            _failures.error("handling a batch of %s failed", stream, exc_info=True)


async def keep_and_claim(
    redis: Redis,
    stream: str,
    group: str,
    consumer: str,
    in_flight: Collection[bytes],
    idle_ms: int,
    count: int = 16,
) -> list[Entry]:
    """Keep ``consumer``'s in-flight entries its own (XCLAIM resets their idle time) and take
    over entries another consumer has left idle for ``idle_ms`` (XAUTOCLAIM): a replica that
    died or froze mid-entry loses it to a live one. Returns the entries taken over."""
    # Entries in flight when this pass began are ours even if they finish meanwhile: one
    # acknowledged just after XAUTOCLAIM read it as pending must not be taken over again.
    ours = set(in_flight)
    if ours:
        await redis.xclaim(stream, group, consumer, 0, list(ours), justid=True)
    result = await redis.xautoclaim(stream, group, consumer, idle_ms, start_id="0-0", count=count)
    return [
        (entry_id, fields)
        for entry_id, fields in result[1]
        if entry_id not in ours and entry_id not in in_flight
    ]


class Settled:
    """The last ``size`` entry ids this consumer acknowledged. An entry can reach a consumer
    twice at once — its XREADGROUP reply still being read while a takeover pass (XAUTOCLAIM)
    finds it idle — and must then be handled once: dead-lettered once, answered once."""

    def __init__(self, size: int = 4096) -> None:
        self.size = size
        self._ids: OrderedDict[bytes, None] = OrderedDict()

    def add(self, entry_id: bytes) -> None:
        self._ids[entry_id] = None
        if len(self._ids) > self.size:
            self._ids.popitem(last=False)

    def __contains__(self, entry_id: object) -> bool:
        return entry_id in self._ids


def dead_letter_entry(source: str, reason: str, data: Any, **extra: str) -> dict[Any, Any]:
    """The fields of one dead letter: where it came from, why, the message, when (+ extra)."""
    return {
        "source": source,
        "reason": reason[:2000],
        "data": data if isinstance(data, bytes | str) else repr(data),
        "ts": str(now_ms()),
        **extra,
    }


async def dead_letter(
    redis: Redis, keys: Keys, source: str, reason: str, data: Any, **extra: str
) -> None:
    """Keep a message nobody could use, with why, in ``{p}:dlq`` (bounded)."""
    entry = dead_letter_entry(source, reason, data, **extra)
    try:
        await redis.xadd(keys.dlq, entry, maxlen=100_000, approximate=True)
    except UNREACHABLE as exc:
        _failures.error("could not dead-letter a message from %s (%s): %s", source, reason, exc)
