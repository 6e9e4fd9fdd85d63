"""The break-glass bypass: switching it on and off, audited (``hookbus breakglass …``)."""

from __future__ import annotations

from redis.asyncio import Redis

from bus.breakglass import BreakGlass, switch
from bus.errors import ProtocolError
from bus.protocol import DATA_FIELD, AuditRecord, ControlMessage, decode, encode, new_id, now_ms
from bus.transport.clock import redis_ms
from bus.transport.coordinator import AUDIT_MAXLEN
from bus.transport.keys import Keys


async def _record_breakglass(
    redis: Redis, keys: Keys, glass: BreakGlass, mode: str, by: str
) -> None:
    """The audit record of a switch."""
    record = AuditRecord(
        id=new_id(),
        ts=now_ms(),
        kind="breakglass",
        mode=mode,
        detail=glass.reason,
        by=by,
        until_ms=glass.until_ms,
    )
    await redis.xadd(
        keys.audit, {DATA_FIELD: encode(record)}, maxlen=AUDIT_MAXLEN, approximate=True
    )


async def _announce_breakglass(redis: Redis, keys: Keys) -> None:
    """Make every coordinator re-read the switch now (they also do every refresh)."""
    await redis.publish(keys.control, encode(ControlMessage(type="breakglass")))


async def breakglass_on(
    redis: Redis, keys: Keys, reason: str, seconds: float, by: str
) -> BreakGlass:
    """Switch the bypass on for ``seconds`` (``{p}:breakglass`` with a TTL), recorded."""
    glass = switch(reason, seconds, by, await redis_ms(redis))  # coordinators use Redis's
    await _record_breakglass(redis, keys, glass, "on", by)  # recorded before it takes effect
    await redis.set(keys.breakglass, encode(glass), px=glass.until_ms - glass.since_ms)
    await _announce_breakglass(redis, keys)
    return glass


async def breakglass_off(redis: Redis, keys: Keys, by: str) -> BreakGlass | None:
    """Switch the bypass off (recorded); the bypass that was on, or None."""
    data = await redis.get(keys.breakglass)
    await redis.delete(keys.breakglass)
    await _announce_breakglass(redis, keys)
    if data is None:
        return None
    try:
        glass = decode(data, BreakGlass)
    except ProtocolError as exc:  # ignored by coordinators; cleared and recorded all the same
        now = now_ms()
        why = f"cleared a switch that held something else ({exc})"
        glass = BreakGlass(reason=why, by=by, since_ms=now, until_ms=now)
    await _record_breakglass(redis, keys, glass, "off", by)
    return glass


async def breakglass_status(redis: Redis, keys: Keys) -> BreakGlass | None:
    """The bypass that is on, or None; ProtocolError if the switch holds something else."""
    data = await redis.get(keys.breakglass)
    return None if data is None else decode(data, BreakGlass)
