"""Repairing a stream whose last id was pushed out of reach (``hookbus repair``)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import ResponseError, WatchError

from bus.errors import HookBusError, InvalidInputError
from bus.protocol import DATA_FIELD
from bus.transport.clock import redis_ms
from bus.transport.keys import Keys
from bus.transport.redis_io import dead_letter_entry, xadd_dead_letter
from workers.ops.common import CHUNK, _text
from workers.ops.tenants import _record

#: An entry id this far beyond Redis's clock is poisoned (a stream id is Redis's clock in ms
#: when it took the entry, unless the writer chose it).
REPAIR_SLACK_MS = 60_000


_MAX_ID = (2**64 - 1, 2**64 - 1)


def _id(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


def _id_text(entry_id: tuple[int, int]) -> str:
    return f"{entry_id[0]}-{entry_id[1]}"


def repairable(keys: Keys, stream: str) -> bool:
    """Whether ``stream`` is one of the bus's streams (the only ones ``repair`` touches)."""
    p = re.escape(keys.prefix)
    fixed = {*keys.event_partitions, *keys.decision_partitions, keys.dlq, keys.audit}
    patterns = (
        rf"{p}:t:\{{[A-Za-z0-9_\-]{{1,64}}\}}:(decisions|dlq)",
        rf"{p}:hook:\{{[A-Za-z0-9_.\-]{{1,128}}(#\d+\.\d+)?\}}:(requests|replay)",
        rf"{p}:hook:\{{[A-Za-z0-9_.\-]{{1,128}}\}}:dlq",
    )
    return stream in fixed or any(re.fullmatch(x, stream) for x in patterns)


@dataclass(frozen=True)
class Repair:
    """What ``repair_stream`` found and did to one stream."""

    stream: str
    last_id: str  # the stream's last generated id before
    limit_id: str  # ids beyond this were poisoned (Redis's clock + the slack)
    new_last_id: str = ""  # after ("" if the stream was not poisoned)
    removed: tuple[str, ...] = ()  # ids of the entries taken out (each dead-lettered first)
    groups_reset: tuple[tuple[str, str], ...] = ()  # (group, its last-delivered id before)

    @property
    def poisoned(self) -> bool:
        return bool(self.new_last_id)


async def repair_stream(
    redis: Redis,
    keys: Keys,
    stream: str,
    by: str,
    *,
    slack_ms: int = REPAIR_SLACK_MS,
    now_ms_: int | None = None,
) -> Repair:
    """Repair a stream poisoned with ids beyond Redis's clock (a writer that chose its ids: a
    maximal id makes every later ``XADD *`` fail; a future one puts every later entry there).

    Every entry with an id beyond Redis's clock + ``slack_ms`` is copied to ``{p}:dlq`` (reason
    "repair: …", its id and fields), then, in one MULTI/EXEC under WATCH (retried if the stream
    changes meanwhile): deleted (XDEL) and acknowledged in every group; the stream's last id set
    back (XSETID) to the newest id at or below the limit (entry, group position or deleted id);
    and every group whose position was beyond it moved back there (XGROUP SETID). Consumer
    groups and every other entry stay; later ``XADD *`` get ids on Redis's clock again. The
    repair is recorded in the audit trail. Nothing is done to a stream that is not poisoned.
    """
    if not repairable(keys, stream):
        raise InvalidInputError(
            f"{stream!r} is not one of the bus's streams (events, decisions, a tenant's "
            "decisions, a hook's requests or replay, the dead letters, the audit trail)"
        )
    now = await redis_ms(redis) if now_ms_ is None else now_ms_
    limit = (now + slack_ms, 2**64 - 1)
    lettered: set[str] = set()
    later: list[tuple[str, dict[str, str]]] = []  # the dead-letter stream's own, after the fix
    for _ in range(20):
        async with redis.pipeline(transaction=True) as pipe:
            await pipe.watch(stream)
            try:
                info: Any = await pipe.xinfo_stream(stream)
            except ResponseError as exc:
                raise InvalidInputError(f"no stream {stream}: {exc}") from exc
            last = _text(info["last-generated-id"])
            if _id(last) <= limit:
                await pipe.unwatch()
                return Repair(stream, last, _id_text(limit))
            future: list[tuple[str, dict[str, str]]] = []
            cursor = f"({_id_text(limit)}"
            while True:
                rows: Any = await pipe.xrange(stream, min=cursor, max="+", count=CHUNK)
                future += [(_text(i), {_text(k): _text(v) for k, v in f.items()}) for i, f in rows]
                if len(rows) < CHUNK or _id(future[-1][0]) == _MAX_ID:  # no id after the max
                    break
                cursor = "(" + future[-1][0]
            groups: Any = await pipe.xinfo_groups(stream)
            top: Any = await pipe.xrevrange(stream, max=_id_text(limit), min="-", count=1)
            known = [(0, 0)] + ([_id(_text(top[0][0]))] if top else [])
            deleted = _id(_text(info.get("max-deleted-entry-id") or "0-0"))
            known += [deleted] if deleted <= limit else []
            positions = {_text(g["name"]): _text(g["last-delivered-id"]) for g in groups}
            known += [_id(d) for d in positions.values() if _id(d) <= limit]
            new_last = max(known)
            beyond = [(g, d) for g, d in positions.items() if _id(d) > new_last]
            fresh = [(i, f) for i, f in future if i not in lettered]
            if keys.dlq_of(stream) == stream:  # a dead-letter stream: its own letters, after
                later += fresh
            else:
                await _dead_letter_all(redis, keys, stream, fresh, now)
            lettered.update(i for i, _ in fresh)
            ids = [i for i, _ in future]
            pipe.multi()
            for start in range(0, len(ids), CHUNK):
                pipe.xdel(stream, *ids[start : start + CHUNK])
                for group in positions:
                    pipe.xack(stream, group, *ids[start : start + CHUNK])
            max_deleted = deleted if deleted <= new_last else new_last
            pipe.execute_command(
                "XSETID", stream, _id_text(new_last), "MAXDELETEDID", _id_text(max_deleted)
            )
            for group, _ in beyond:
                pipe.execute_command("XGROUP", "SETID", stream, group, _id_text(new_last))
            try:
                await pipe.execute()
            except WatchError:
                continue
        break
    else:
        raise HookBusError(f"{stream} kept changing: repair it again")
    await _dead_letter_all(redis, keys, stream, later, now)
    repair = Repair(stream, last, _id_text(limit), _id_text(new_last), tuple(ids), tuple(beyond))
    moved = ", ".join(f"group {g} from {d}" for g, d in beyond) or "no group"
    detail = (
        f"{stream}: last id {last} was beyond Redis's clock ({now} ms); {len(ids)} entries "
        f"dead-lettered and deleted, last id set back to {repair.new_last_id}, {moved} moved "
        "back there"
    )
    await _record(redis, keys, "repair", "stream", detail, by)
    return repair


async def _dead_letter_all(
    redis: Redis, keys: Keys, stream: str, entries: list[tuple[str, dict[str, str]]], now: int
) -> None:
    """Copy ``entries`` to the dead letters, in order (not through the WATCHing pipeline: the
    dead letters are another key, on another slot in a cluster)."""
    for start in range(0, len(entries), CHUNK):
        async with redis.pipeline(transaction=False) as pipe:
            for entry_id, fields in entries[start : start + CHUNK]:
                letter = _repair_letter(stream, entry_id, fields, now)
                xadd_dead_letter(pipe, keys.dlq_of(stream), letter)
            await pipe.execute()


def _repair_letter(stream: str, entry_id: str, fields: dict[str, str], now: int) -> dict[Any, Any]:
    data = fields.get(DATA_FIELD) if list(fields) == [DATA_FIELD] else json.dumps(fields)
    why = f"repair: its id {entry_id} was beyond Redis's clock ({now} ms)"
    return dead_letter_entry(stream, why, data or "", entry_id=entry_id)
