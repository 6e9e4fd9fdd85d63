"""Dead letters: listing, reading, counting and purging them (``hookbus dlq …``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis

from bus.errors import InvalidInputError
from bus.transport.keys import Keys
from workers.ops.common import _STREAM_ID, CHUNK, _id_ms, _text


@dataclass(frozen=True)
class DeadLetter:
    """One entry of ``{p}:dlq``: source, reason, data, ts (+ hook, entry_id, deliveries)."""

    id: str
    fields: dict[str, str]

    @property
    def ts(self) -> int:
        ts = self.fields.get("ts", "")
        return int(ts) if ts.isdigit() else _id_ms(self.id)

    @property
    def hook(self) -> str:
        return self.fields.get("hook", "")

    @property
    def source(self) -> str:
        return self.fields.get("source", "")

    @property
    def reason(self) -> str:
        return self.fields.get("reason", "")

    @property
    def deliveries(self) -> str:
        return self.fields.get("deliveries", "")

    @property
    def data(self) -> str:
        return self.fields.get("data", "")


def _letter(raw_id: Any, fields: Mapping[Any, Any] | None) -> DeadLetter:
    return DeadLetter(_text(raw_id), {_text(k): _text(v) for k, v in (fields or {}).items()})


def _is_of(fields: Mapping[Any, Any] | None, hook: str | None) -> bool:
    return hook is None or _text((fields or {}).get(b"hook", b"")) == hook


def check_stream_id(entry_id: str) -> str:
    if not _STREAM_ID.match(entry_id):
        raise InvalidInputError(f"{entry_id!r} is not a stream id (like 1700000000000-0)")
    return entry_id


async def list_dead_letters(
    redis: Redis, keys: Keys, hook: str | None = None, limit: int = 50
) -> tuple[list[DeadLetter], bool]:
    """The ``limit`` newest dead letters (of ``hook``, if given), oldest first; and whether
    there are more."""
    found: list[DeadLetter] = []
    cursor = "+"
    while len(found) <= limit:
        rows: Any = await redis.xrevrange(keys.dlq, max=cursor, min="-", count=CHUNK)
        if not rows:
            break
        found.extend(_letter(i, f) for i, f in rows if _is_of(f, hook))
        cursor = "(" + _text(rows[-1][0])
    return list(reversed(found[:limit])), len(found) > limit


async def get_dead_letter(redis: Redis, keys: Keys, entry_id: str) -> DeadLetter | None:
    rows: Any = await redis.xrange(keys.dlq, min=entry_id, max=entry_id, count=1)
    return _letter(*rows[0]) if rows else None


async def count_dead_letters(
    redis: Redis, keys: Keys, hook: str | None = None
) -> tuple[int, str | None]:
    """How many dead letters (of ``hook``, if given), and the id of the newest of them."""
    if hook is None:
        last: Any = await redis.xrevrange(keys.dlq, count=1)
        return int(await redis.xlen(keys.dlq)), _text(last[0][0]) if last else None
    total, newest, cursor = 0, None, "-"
    while True:
        rows: Any = await redis.xrange(keys.dlq, min=cursor, max="+", count=CHUNK)
        if not rows:
            return total, newest
        mine = [_text(i) for i, f in rows if _is_of(f, hook)]
        if mine:
            total, newest = total + len(mine), mine[-1]
        cursor = "(" + _text(rows[-1][0])


async def purge_dead_letters(
    redis: Redis,
    keys: Keys,
    hook: str | None = None,
    upto: str = "+",
    progress: Callable[[int], None] | None = None,
) -> int:
    """Delete the dead letters (of ``hook``, if given) up to the id ``upto``; how many."""
    total, cursor = 0, "-"
    while True:
        rows: Any = await redis.xrange(keys.dlq, min=cursor, max=upto, count=CHUNK)
        if not rows:
            return total
        mine = [i for i, f in rows if _is_of(f, hook)]
        if mine:
            total += int(await redis.xdel(keys.dlq, *mine))
            if progress:
                progress(len(mine))
        cursor = "(" + _text(rows[-1][0])
