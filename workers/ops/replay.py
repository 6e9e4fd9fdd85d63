"""``hookbus replay``: re-feed events to one async hook, from the stream or the dead letters.

Entries are copied to ``{p}:hook:{name}:replay``, which only that hook's group reads; the
events stream itself and the other hooks are untouched. Dead letters are removed from
``{p}:dlq`` as they are re-fed.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import Any

from redis.asyncio import Redis

from bus.errors import ConfigError, InvalidInputError, ProtocolError
from bus.protocol import DATA_FIELD, HookManifest, decode
from bus.transport.directory import read_manifest
from bus.transport.keys import Keys, check_name

_DATA = DATA_FIELD.encode()
CHUNK = 500


def parse_position(text: str) -> str:
    """A stream position from ``0``, ``$``, ``-``, ``+``, a stream id, epoch ms or ISO time."""
    if text in ("0", "$", "-", "+"):
        return text
    ms, sep, seq = text.partition("-")
    if ms.isdigit() and (not sep or seq.isdigit()):
        return text if sep else f"{ms}-0"
    try:
        moment = dt.datetime.fromisoformat(text)
    except ValueError:
        raise InvalidInputError(
            f"{text!r} is not a stream position: use 0, $, a stream id (1700000000000-0), "
            "epoch milliseconds or an ISO time (2026-11-30T06:00:00+00:00)"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=dt.UTC)
    return f"{int(moment.timestamp() * 1000)}-0"


async def check_replayable(redis: Redis, keys: Keys, hook: str) -> None:
    """Refuse to re-feed a hook that would never read its replay stream: one that is not
    registered (a typo, or retired), or a sync hook (only async hooks read a replay stream)."""
    check_name("hook name", hook)
    raw = await read_manifest(redis, keys, hook)
    if raw is None:
        raise ConfigError(
            f"no hook named {hook!r} is registered in {keys.hooks}: nothing would read "
            f"{keys.replay(hook)} (see hookbus hooks list)"
        )
    try:
        kind = decode(raw, HookManifest).kind
    except ProtocolError as exc:
        raise ConfigError(f"the manifest of {hook!r} does not decode: {exc}") from None
    if kind != "async":
        raise ConfigError(
            f"{hook} is a {kind} hook: only async hooks read a replay stream (a sync hook "
            "answers requests as they come; there is nothing to re-feed it)"
        )


async def replay_range(
    redis: Redis,
    keys: Keys,
    hook: str,
    start: str = "-",
    end: str = "+",
    progress: Callable[[int], None] | None = None,
) -> int:
    """Copy events ``start``..``end`` of every partition to the hook's replay stream (one
    partition after the other: each session's events stay in order); returns how many."""
    start, end = parse_position(start), parse_position(end)
    total = 0
    for partition in keys.event_partitions:
        total += await _replay_partition(redis, keys, hook, partition, start, end, progress)
    return total


async def _replay_partition(
    redis: Redis,
    keys: Keys,
    hook: str,
    partition: str,
    start: str,
    end: str,
    progress: Callable[[int], None] | None,
) -> int:
    total = 0
    cursor = start
    while True:
        rows: Any = await redis.xrange(partition, min=cursor, max=end, count=CHUNK)
        if not rows:
            return total
        async with redis.pipeline(transaction=False) as pipe:
            for _, fields in rows:
                pipe.xadd(keys.replay(hook), {DATA_FIELD: fields.get(_DATA, b"")})
            await pipe.execute()
        total += len(rows)
        if progress:
            progress(len(rows))
        last = rows[-1][0]
        cursor = "(" + (last.decode() if isinstance(last, bytes) else last)


async def replay_dead_letters(
    redis: Redis, keys: Keys, hook: str, progress: Callable[[int], None] | None = None
) -> int:
    """Re-feed the hook's dead letters (those with ``hook`` = its name); returns how many.
    Records of lost entries (bus/transport/retention.py) have no message and stay."""
    total = 0
    cursor = "-"
    while True:
        rows: Any = await redis.xrange(keys.dlq, min=cursor, max="+", count=CHUNK)
        if not rows:
            return total
        # Records of entries a stream's cap cut ("lost") hold no message to re-feed: kept.
        mine = [
            (i, f) for i, f in rows if f.get(b"hook", b"").decode() == hook and b"lost" not in f
        ]
        if mine:
            async with redis.pipeline(transaction=False) as pipe:
                for _, fields in mine:
                    pipe.xadd(keys.replay(hook), {DATA_FIELD: fields.get(b"data", b"")})
                pipe.xdel(keys.dlq, *[i for i, _ in mine])
                await pipe.execute()
            total += len(mine)
            if progress:
                progress(len(mine))
        last = rows[-1][0]
        cursor = "(" + (last.decode() if isinstance(last, bytes) else last)
