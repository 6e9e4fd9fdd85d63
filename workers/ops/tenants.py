"""The tenants the coordinator service serves (``hookbus tenants …``)."""

from __future__ import annotations

from typing import Literal

from redis.asyncio import Redis

from bus.protocol import DATA_FIELD, AuditRecord, encode, new_id, now_ms
from bus.transport.coordinator import AUDIT_MAXLEN
from bus.transport.keys import Keys, check_tenant
from workers.ops.common import _text


async def list_tenants(redis: Redis, keys: Keys) -> list[str]:
    """The tenants the coordinator service answers (``{p}:tenants``), by name."""
    return sorted(_text(m) for m in await redis.smembers(keys.tenants))


async def _record(
    redis: Redis, keys: Keys, kind: Literal["tenant", "repair"], mode: str, detail: str, by: str
) -> None:
    """An operator's change, in the audit trail."""
    record = AuditRecord(id=new_id(), ts=now_ms(), kind=kind, mode=mode, detail=detail, by=by)
    await redis.xadd(
        keys.audit, {DATA_FIELD: encode(record)}, maxlen=AUDIT_MAXLEN, approximate=True
    )


async def add_tenant(redis: Redis, keys: Keys, tenant: str, by: str) -> bool:
    """Have the coordinator service answer ``tenant``'s decisions stream (within
    ``TENANTS_REFRESH_SECS``); recorded in the audit trail. False if it already was."""
    check_tenant(tenant)
    added = bool(await redis.sadd(keys.tenants, tenant))
    if added:
        await _record(redis, keys, "tenant", "add", tenant, by)
    return added


async def remove_tenant(redis: Redis, keys: Keys, tenant: str, by: str) -> bool:
    """Stop answering ``tenant`` (its requests then go unanswered; its Redis user still exists
    until the ACL file is generated without it); recorded. False if it was not served."""
    check_tenant(tenant)
    removed = bool(await redis.srem(keys.tenants, tenant))
    if removed:
        await _record(redis, keys, "tenant", "remove", tenant, by)
    return removed
