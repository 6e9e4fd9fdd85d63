"""``hookbus replay``: re-feed events to one async hook, from the stream or the dead letters.

Entries are copied to ``{p}:hook:{name}:replay``, which only that hook's group reads; the
events stream itself and the other hooks are untouched. Dead letters are re-fed only from the
hook's own ``{p}:hook:{name}:dlq`` (which only its user and the operator can write: a letter
another unit forged is never re-fed), shown first (``plan_dead_letters``), and removed as they
are re-fed.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis

from bus.errors import ConfigError, InvalidInputError, ProtocolError
from bus.protocol import DATA_FIELD, HookManifest, decode
from bus.transport.directory import read_manifest
from bus.transport.keys import Keys, check_name
from workers.ops.dead_letters import forget

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


@dataclass(frozen=True)
class DeadLetterPlan:
    """What ``replay_dead_letters`` would re-feed a hook, shown before it does: the letters of
    its own stream ``{p}:hook:{HOOK}:dlq`` up to ``upto`` (only the hook's user and the
    operator can write there), less those that hold no whole message."""

    hook: str
    stream: str
    upto: str  # the newest letter when counted: later ones wait for the next replay
    count: int  # letters to re-feed
    first_ms: int | None
    last_ms: int | None
    sample: tuple[str, ...]  # the first few messages, shortened
    cut: int  # letters holding only a prefix of their message (skipped)
    lost: int  # records of entries a stream's cap cut (no message: skipped)
    empty: int  # letters with no message (skipped)


def _replayable(fields: dict[bytes, bytes]) -> str:
    """'' if the letter can be re-fed; else why not ('cut', 'lost', 'empty')."""
    if b"lost" in fields:
        return "lost"
    if fields.get(b"cut") == b"1":
        return "cut"
    return "" if fields.get(b"data") else "empty"


async def plan_dead_letters(
    redis: Redis, keys: Keys, hook: str, samples: int = 3
) -> DeadLetterPlan:
    """Count what replaying ``hook``'s dead letters would re-feed (nothing is changed)."""
    stream = keys.hook_dlq(hook)
    count, cut, lost, empty = 0, 0, 0, 0
    first: int | None = None
    last: int | None = None
    sample: list[str] = []
    upto, cursor = "", "-"
    while True:
        rows: Any = await redis.xrange(stream, min=cursor, max="+", count=CHUNK)
        if not rows:
            break
        for entry_id, fields in rows:
            why = _replayable(fields)
            if why:
                cut, lost, empty = (
                    cut + (why == "cut"),
                    lost + (why == "lost"),
                    empty + (why == "empty"),
                )
                continue
            count += 1
            ms = int(_text(entry_id).partition("-")[0])
            first = ms if first is None else first
            last = ms
            if len(sample) < samples:
                sample.append(_text(fields[b"data"])[:160])
        upto = _text(rows[-1][0])
        cursor = "(" + upto
    return DeadLetterPlan(hook, stream, upto, count, first, last, tuple(sample), cut, lost, empty)


async def replay_dead_letters(
    redis: Redis,
    keys: Keys,
    hook: str,
    upto: str = "+",
    progress: Callable[[int], None] | None = None,
) -> int:
    """Re-feed the hook the letters of its own dead-letter stream (up to ``upto``) that hold a
    whole message; returns how many. Letters are read from ``{p}:hook:{HOOK}:dlq`` only — what
    another unit wrote is never re-fed. Records of lost entries, letters whose message was cut
    to a prefix, and letters with no message stay."""
    stream = keys.hook_dlq(hook)
    if upto == "+":
        # The end as it is now: a re-fed letter the hook dead-letters again during the replay
        # lands after it and is not re-fed a second time (nor a third: the replay would chase
        # its own tail).
        last: Any = await redis.xrevrange(stream, count=1)
        if not last:
            return 0
        upto = _text(last[0][0])
    total = 0
    cursor = "-"
    while True:
        rows: Any = await redis.xrange(stream, min=cursor, max=upto, count=CHUNK)
        if not rows:
            return total
        mine = [(i, f) for i, f in rows if not _replayable(f)]
        if mine:
            async with redis.pipeline(transaction=False) as pipe:
                for _, fields in mine:
                    pipe.xadd(keys.replay(hook), {DATA_FIELD: fields.get(b"data", b"")})
                await pipe.execute()
            await forget(redis, keys, stream, *[i for i, _ in mine])
            total += len(mine)
            if progress:
                progress(len(mine))
        cursor = "(" + _text(rows[-1][0])


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
