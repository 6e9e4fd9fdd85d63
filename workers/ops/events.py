"""Following the events streams live (``hookbus events tail``)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

import msgspec
from redis.asyncio import Redis

from bus.errors import HookBusError, InvalidInputError
from bus.protocol import DATA_FIELD, EventMessage, decode
from bus.transport.keys import Keys
from bus.transport.redis_io import until_reachable
from workers.ops.common import _DATA, CHUNK, _id_ms, _text


@dataclass(frozen=True)
class TailedEvent:
    """One entry of ``{p}:events`` as ``hookbus events tail`` shows it."""

    entry_id: str
    ts: int  # epoch ms
    event: str
    session_id: str
    tool: str
    context: dict[str, Any] = field(default_factory=dict)
    problem: str = ""  # set for an entry that is not a valid event message


def _tailed(entry_id: str, fields: Mapping[bytes, bytes] | None) -> TailedEvent:
    data = (fields or {}).get(_DATA)
    try:
        if data is None:
            raise InvalidInputError(f"entry has no {DATA_FIELD!r} field")
        message = decode(data, EventMessage)
        context = msgspec.json.decode(bytes(message.context))
        if not isinstance(context, dict):
            raise InvalidInputError("its context is not an object")
    except (HookBusError, msgspec.DecodeError) as exc:
        return TailedEvent(entry_id, _id_ms(entry_id), "?", "", "", problem=str(exc))
    return TailedEvent(
        entry_id=entry_id,
        ts=message.ts,
        event=message.event.value,
        session_id=message.session_id,
        tool=str(context.get("tool_name") or context.get("subagent_name") or ""),
        context=context,
    )


async def events_end(redis: Redis, keys: Keys, retry_secs: float = 0.0) -> dict[str, str]:
    """The id of the newest event of each partition (``0-0`` if empty): tail from there. Each
    read is retried while Redis cannot be reached, for up to ``retry_secs``."""
    ends: dict[str, str] = {}
    loop = asyncio.get_running_loop()
    for partition in keys.event_partitions:
        last: Any = await until_reachable(
            lambda p=partition: redis.xrevrange(p, count=1), loop.time() + retry_secs
        )
        ends[partition] = _text(last[0][0]) if last else "0-0"
    return ends


async def follow_events(
    redis: Redis,
    keys: Keys,
    after: dict[str, str],
    stop: asyncio.Event,
    *,
    block_ms: int = 500,
    retry_secs: float = 0.0,
) -> AsyncGenerator[TailedEvent, None]:
    """Events added after the ids ``after`` (per partition), as they arrive, until ``stop``.
    One partition blocks per read (each may be on another cluster node); the others are
    polled between, so no partition waits longer than ``block_ms``. A read that cannot reach
    Redis (a failover's promotion, a restart) is retried, from the same ids, for up to
    ``retry_secs`` each time; then what it raised."""
    cursors = dict(after)
    partitions = list(keys.event_partitions)
    turn = 0
    loop = asyncio.get_running_loop()

    async def xread(streams: dict[str, str], **options: Any) -> Any:
        return await until_reachable(
            lambda: redis.xread(streams, **options), loop.time() + retry_secs
        )

    while not stop.is_set():
        found = False
        for partition in partitions:
            response: Any = await xread({partition: cursors[partition]}, count=CHUNK)
            for _, entries in response or ():
                for raw_id, fields in entries:
                    found = True
                    cursors[partition] = _text(raw_id)
                    yield _tailed(cursors[partition], fields)
        if not found:
            partition = partitions[turn % len(partitions)]
            turn += 1
            wait = max(20, block_ms // len(partitions))
            await xread({partition: cursors[partition]}, count=1, block=wait)


def event_matches(
    event: TailedEvent, sessions: Collection[str] = (), events: Collection[str] = ()
) -> bool:
    """Whether the event passes the ``--session`` and ``--event`` filters (empty: any)."""
    if sessions and event.session_id not in sessions:
        return False
    return not events or event.event in events
