"""Retention of the events stream: trim history, never what a group still has to handle.

Policy (see docs/protocol.md): the stream keeps about ``events_maxlen`` entries of history.
A retention pass (run by every async worker every 10 s) trims entries older than that, but
never past the oldest entry some consumer group has not handled yet (its oldest pending entry,
or the first entry after its last delivered one). Publishers cap the stream at
``10 × events_maxlen`` as a backstop; a group that falls that far behind would lose entries,
so every pass logs a warning for — and reports — each group whose backlog passes half of it.
"""

from __future__ import annotations

import logging
from typing import Any

from redis.asyncio import Redis

from bus.keys import Keys

log = logging.getLogger("hookbus.retention")
HARD_CAP_FACTOR = 10


def _id(value: Any) -> tuple[int, int]:
    text = value.decode() if isinstance(value, bytes) else str(value)
    ms, _, seq = text.partition("-")
    return int(ms), int(seq or 0)


async def group_backlogs(redis: Redis, stream: str) -> dict[str, dict[str, Any]]:
    """Per group: lag (not yet delivered), pending, and the oldest id it still needs."""
    try:
        groups: Any = await redis.xinfo_groups(stream)
    except Exception:  # no stream yet
        return {}
    out: dict[str, dict[str, Any]] = {}
    for g in groups:
        name = g["name"].decode() if isinstance(g["name"], bytes) else g["name"]
        needs = _id(g["last-delivered-id"])
        needs = (needs[0], needs[1] + 1)
        if g["pending"]:
            summary: Any = await redis.xpending(stream, name)
            needs = min(needs, _id(summary["min"]))
        out[name] = {"lag": g.get("lag"), "pending": int(g["pending"]), "needs": needs}
    return out


async def trim_events(redis: Redis, keys: Keys, maxlen: int) -> dict[str, Any]:
    """One retention pass; returns what it did (for logs, ``hookbus lag`` and tests)."""
    length = await redis.xlen(keys.events)
    backlogs = await group_backlogs(redis, keys.events)
    at_risk = []
    for name, b in backlogs.items():
        backlog = (b["lag"] or 0) + b["pending"]
        if backlog > HARD_CAP_FACTOR * maxlen // 2:
            at_risk.append(name)
            log.warning(
                "group %s is %d events behind: past %d the stream cap drops events it has not "
                "handled yet; add replicas or fix the hook",
                name, backlog, HARD_CAP_FACTOR * maxlen,
            )  # fmt: skip
    if length <= maxlen:
        return {"trimmed": 0, "at_risk": at_risk}
    info: Any = await redis.xinfo_stream(keys.events)
    first, last = _id(info["first-entry"][0]), _id(info["last-entry"][0])
    # The stream id is a millisecond clock: estimate the id maxlen entries from the end.
    span = max(1, last[0] - first[0])
    boundary = (last[0] - int(span * maxlen / length), 0)
    floor = min([boundary, *(b["needs"] for b in backlogs.values())])
    trimmed = int(await redis.xtrim(keys.events, minid=f"{floor[0]}-{floor[1]}", approximate=True))
    return {"trimmed": trimmed, "at_risk": at_risk}
