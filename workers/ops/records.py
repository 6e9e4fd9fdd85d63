"""What the bus records for operators: the audit trail (``hookbus audit``) and the async
MetricsHook's figures (``hookbus metrics``)."""

from __future__ import annotations

from typing import Any

from redis.asyncio import Redis
from redis.exceptions import ResponseError

from bus.errors import HookBusError
from bus.protocol import AuditRecord, decode
from bus.transport.keys import Keys
from workers.ops.common import _DATA, _text


async def list_audit(redis: Redis, keys: Keys, limit: int) -> tuple[list[AuditRecord], int]:
    """The newest ``limit`` audit-trail records, oldest first, and how many entries did not
    decode (shown as a count: the audit log hook dead-letters them)."""
    raw: Any = await redis.xrevrange(keys.audit, count=limit)
    records: list[AuditRecord] = []
    broken = 0
    for _, fields in reversed(raw):
        try:
            records.append(decode((fields or {}).get(_DATA, b""), AuditRecord))
        except HookBusError:
            broken += 1
    return records, broken


async def collect_metrics(redis: Redis, keys: Keys) -> dict[str, dict[str, str]]:
    """Hook name → the figures in its ``{p}:hook:{NAME}:metrics`` hash, for every registered
    hook (no SCAN: on a cluster that would see one node only)."""
    names = sorted(_text(m) for m in await redis.smembers(keys.hooks))
    out: dict[str, dict[str, str]] = {}
    for name in names:
        try:
            figures: Any = await redis.hgetall(keys.metrics(name))
        except ResponseError:  # not a hash (WRONGTYPE): no figures of a metrics hook
            continue
        if figures:
            out[name] = {_text(k): _text(v) for k, v in figures.items()}
    return out
