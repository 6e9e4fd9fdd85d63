"""Dead letters: listing, reading, counting and purging them (``hookbus dlq …``).

Key layout 3 keeps one dead-letter stream per unit (bus/transport/keys.py): each hook's
``{p}:hook:{NAME}:dlq`` (hooks from ``{p}:hooks``), each tenant's ``{p}:t:{T}:dlq`` (tenants from
``{p}:tenants``) and the coordinators' ``{p}:dlq``. These functions read them together and say of
each letter which unit it is in. What a unit's cap cut is counted from Redis's own figures:
entries-added − length − the letters the operator deleted (``{p}:dlq:purged``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import ResponseError

from bus.errors import HookBusError, InvalidInputError
from bus.transport.keys import Keys, check_name
from workers.ops.common import _STREAM_ID, CHUNK, _id_ms, _text


@dataclass(frozen=True)
class Unit:
    """One dead-letter stream: whose it is (``hook NAME``, ``tenant T``, ``coordinators``)."""

    name: str
    stream: str


@dataclass(frozen=True)
class DeadLetter:
    """One dead letter: source, reason, data (a bounded prefix: size, sha256, cut), ts (+ hook,
    entry_id, deliveries); and the unit whose stream holds it."""

    id: str
    fields: dict[str, str]
    unit: str = ""
    stream: str = ""

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

    @property
    def cut(self) -> bool:
        """Whether ``data`` is only a prefix of the message (never replayed)."""
        return self.fields.get("cut") == "1"


def _letter(raw_id: Any, fields: Mapping[Any, Any] | None, unit: Unit | None = None) -> DeadLetter:
    return DeadLetter(
        _text(raw_id),
        {_text(k): _text(v) for k, v in (fields or {}).items()},
        unit.name if unit else "",
        unit.stream if unit else "",
    )


def _key(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


def check_stream_id(entry_id: str) -> str:
    if not _STREAM_ID.match(entry_id):
        raise InvalidInputError(f"{entry_id!r} is not a stream id (like 1700000000000-0)")
    return entry_id


async def dead_letter_units(redis: Redis, keys: Keys, hook: str | None = None) -> list[Unit]:
    """The dead-letter streams to read: ``hook``'s only, if given; else the coordinators', each
    registered hook's and each served tenant's."""
    if hook is not None:
        return [Unit(f"hook {hook}", keys.hook_dlq(check_name("hook name", hook)))]
    out = [Unit("coordinators", keys.dlq)]
    for name in sorted(_text(n) for n in await redis.smembers(keys.hooks)):  # type: ignore[misc]
        try:
            out.append(Unit(f"hook {name}", keys.hook_dlq(name)))
        except HookBusError:  # not a name a hook could have: no stream of its own
            continue
    for tenant in sorted(_text(t) for t in await redis.smembers(keys.tenants)):  # type: ignore[misc]
        try:
            out.append(Unit(f"tenant {tenant}", keys.tenant_dlq(tenant)))
        except HookBusError:
            continue
    return out


async def list_dead_letters(
    redis: Redis, keys: Keys, hook: str | None = None, limit: int = 50
) -> tuple[list[DeadLetter], bool]:
    """The ``limit`` newest dead letters of every unit (of ``hook``'s, if given), oldest first;
    and whether there are more."""
    found: list[DeadLetter] = []
    for unit in await dead_letter_units(redis, keys, hook):
        rows: Any = await redis.xrevrange(unit.stream, max="+", min="-", count=limit + 1)
        found.extend(_letter(i, f, unit) for i, f in rows)
    found.sort(key=lambda d: (_key(d.id), d.stream), reverse=True)
    return list(reversed(found[:limit])), len(found) > limit


async def get_dead_letter(redis: Redis, keys: Keys, entry_id: str) -> DeadLetter | None:
    """The dead letter ``entry_id`` of whichever unit holds it (the first, should two)."""
    for unit in await dead_letter_units(redis, keys):
        rows: Any = await redis.xrange(unit.stream, min=entry_id, max=entry_id, count=1)
        if rows:
            return _letter(*rows[0], unit)
    return None


async def count_dead_letters(
    redis: Redis, keys: Keys, hook: str | None = None
) -> tuple[int, dict[str, str]]:
    """How many dead letters (of ``hook``'s unit, if given), and the id of the newest of each
    stream that holds any."""
    total, newest = 0, {}
    for unit in await dead_letter_units(redis, keys, hook):
        n = int(await redis.xlen(unit.stream))
        if n:
            last: Any = await redis.xrevrange(unit.stream, count=1)
            if last:
                total += n
                newest[unit.stream] = _text(last[0][0])
    return total, newest


async def forget(redis: Redis, keys: Keys, stream: str, *ids: Any) -> int:
    """Delete dead letters as the operator, counted in ``{p}:dlq:purged`` (so they are not
    taken for letters the stream's cap cut)."""
    deleted = int(await redis.xdel(stream, *ids))
    if deleted:
        await redis.hincrby(keys.dlq_purged, stream, deleted)  # type: ignore[misc]
    return deleted


async def purge_dead_letters(
    redis: Redis,
    keys: Keys,
    upto: Mapping[str, str],
    progress: Callable[[int], None] | None = None,
) -> int:
    """Delete the dead letters of each stream of ``upto`` up to its id there; how many."""
    total = 0
    for stream, last in upto.items():
        cursor = "-"
        while True:
            rows: Any = await redis.xrange(stream, min=cursor, max=last, count=CHUNK)
            if not rows:
                break
            total += await forget(redis, keys, stream, *[i for i, _ in rows])
            if progress:
                progress(len(rows))
            cursor = "(" + _text(rows[-1][0])
    return total


@dataclass(frozen=True)
class Cut:
    """Letters a unit's cap cut (never deleted by the operator): Redis's entries-added −
    length − ``{p}:dlq:purged``."""

    unit: str
    stream: str
    count: int


async def cut_dead_letters(redis: Redis, keys: Keys, hook: str | None = None) -> list[Cut]:
    """Per unit, the letters its cap cut (only units where it cut some)."""
    purged: Any = await redis.hgetall(keys.dlq_purged)  # type: ignore[misc]
    deleted = {_text(k): int(v) for k, v in purged.items()}
    out = []
    for unit in await dead_letter_units(redis, keys, hook):
        try:
            info: Any = await redis.xinfo_stream(unit.stream)
        except ResponseError:  # no such stream: nothing was ever written, nothing cut
            continue
        added = int(info.get("entries-added") or 0)
        cut = added - int(info["length"]) - deleted.get(unit.stream, 0)
        if cut > 0:
            out.append(Cut(unit.name, unit.stream, cut))
    return out
