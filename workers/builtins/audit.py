"""The audit log as an async hook service: one row per event, written exactly once.

``hookbus worker workers.builtins.audit:AsyncAuditLogHook`` with ``HOOKBUS_AUDIT_DB`` set to a
SQLite file (default ``hookbus-audit.db``) or a ``postgresql://`` URL. Rows go to table
``agent_audit_events`` keyed by the event id, so a redelivered event (at-least-once delivery)
never adds a second row. Batches are written in one transaction and acknowledged after it.
With ``redact`` (``--set redact=true``, or a list of patterns: workers/builtins/redaction.py),
secrets in the previews and details are replaced with ``[redacted]`` before they are stored.

What PostgreSQL's ``text`` cannot hold is stored escaped, the same in both backends: a NUL
(any binary tool output holds one) as the six characters ``\\u0000``, a lone surrogate (a
Python string can hold one, UTF-8 cannot) likewise (``\\ud800``), so that the row is written all
the same. A literal ``\\u0000`` in the text reads the same afterwards: the audit log is a record
for people (previews are cut at 200 characters anyway), not a byte-exact copy.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import re
import sqlite3
from collections.abc import Sequence
from typing import Any

from bus import AsyncAgentHook
from bus.hooks import DeliveredEvent
from bus.protocol import AuditRecord
from bus.settings import env_value
from workers.builtins.redaction import Redaction

NO_REDACTION = Redaction(False)

PREVIEW_CHARS = 200
#: Where the audit log goes when neither the constructor nor HOOKBUS_AUDIT_DB says.
DEFAULT_AUDIT_DB = "hookbus-audit.db"
COLUMNS = ("event_id", "event", "session_id", "tool_name", "status", "output_preview", "ts")
SQLITE_SCHEMA = """
CREATE TABLE IF NOT EXISTS agent_audit_events (
    event_id TEXT PRIMARY KEY, event TEXT NOT NULL, session_id TEXT, tool_name TEXT,
    status TEXT NOT NULL, output_preview TEXT, ts TEXT NOT NULL
)"""
POSTGRES_SCHEMA = SQLITE_SCHEMA.replace("TEXT PRIMARY KEY", "TEXT PRIMARY KEY")
#: Characters a PostgreSQL text column refuses: NUL ("invalid byte sequence for encoding UTF8:
#: 0x00", for the whole batch) and lone surrogates (asyncpg cannot encode them; nor can sqlite3).
#: SQLite would store a NUL, but its functions stop at it (``length('a' || char(0) || 'b')`` is
#: 1): escaped there too, so that both backends hold the same text.
_UNSTORABLE = re.compile(r"[\x00\ud800-\udfff]")


def storable(text: str) -> str:
    """``text`` with each character a text column cannot hold written as its JSON escape
    (a NUL as ``\\u0000``); any other text unchanged."""
    return _UNSTORABLE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def _when(ms: int) -> str:
    """An epoch-ms timestamp in ISO 8601 (UTC); one out of the calendar's range (a publisher
    sets it) as the bare number, so that the event is still stored."""
    try:
        return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).isoformat()
    except (OverflowError, ValueError, OSError):
        return str(ms)


def audit_row(d: DeliveredEvent, redact: Redaction = NO_REDACTION) -> tuple[str, ...]:
    """The audit row of one event."""
    ctx = d.context
    session: str = getattr(ctx, "session_id", None) or getattr(ctx, "parent_session_id", None) or ""
    tool = getattr(ctx, "tool_name", None) or ""
    if d.event.value == "PostToolUse":
        status, preview = ("FAIL" if ctx.is_error else "OK"), ctx.output_content
    elif d.event.value == "PostToolUseFailure":
        status, preview = "FAIL", ctx.error_message
    elif d.event.value == "OnSessionStop":
        status, preview = "SESSION_STOP", ctx.terminal.value
    else:
        status, preview = d.event.value, ""
    preview = redact(preview)[:PREVIEW_CHARS]
    row = (d.id, d.event.value, session, tool, status, preview, _when(d.ts))
    return tuple(storable(value) for value in row)


def audit_record_row(r: AuditRecord, redact: Redaction = NO_REDACTION) -> tuple[str, ...]:
    """The audit row of one audit-trail record: an answer not applied, a break-glass, a tenant
    added or removed, a stream repaired."""
    if r.kind == "breakglass":
        until = _when(r.until_ms)
        status, detail = f"BREAKGLASS_{r.mode.upper()}", f"{r.by}: {r.detail} (until {until})"
    elif r.kind in ("tenant", "repair"):  # an operator's change: TENANT_ADD, REPAIR_STREAM…
        status, detail = f"{r.kind.upper()}_{r.mode.upper()}", f"{r.by}: {r.detail}"
    else:
        status, detail = r.mode.upper(), f"{r.hook}: {r.detail}"
        if r.breakglass:
            detail += f" [break-glass: {r.breakglass}]"
    event = r.event.value if r.event is not None else ""
    detail = redact(detail)[:PREVIEW_CHARS]
    row = (r.id, event, r.session_id, r.tool_name, status, detail, _when(r.ts))
    return tuple(storable(value) for value in row)


class AsyncAuditLogHook(AsyncAgentHook):
    """Writes one audit row per event, and per audit-trail record (answers that ``warn``,
    ``dryrun`` or a break-glass held back; break-glass switches), idempotent on their ids."""

    name = "AsyncAuditLogHook"
    handles_batches = True
    follows_audit_trail = True

    def __init__(self, target: str | None = None, redact: bool | list[str] = False) -> None:
        self.target = target or env_value("HOOKBUS_AUDIT_DB") or DEFAULT_AUDIT_DB
        self.redact = Redaction(redact)
        self.postgres = self.target.startswith(("postgresql://", "postgres://"))
        self._pool: Any = None
        self._lock = asyncio.Lock()

    async def on_batch(self, batch: Sequence[DeliveredEvent]) -> None:
        await self._write([audit_row(d, self.redact) for d in batch])

    async def on_audit(self, records: Sequence[AuditRecord]) -> None:
        await self._write([audit_record_row(r, self.redact) for r in records])

    async def _write(self, rows: list[tuple[str, ...]]) -> None:
        if self.postgres:
            await self._write_postgres(rows)
        else:
            await asyncio.to_thread(self._write_sqlite, rows)

    def _write_sqlite(self, rows: list[tuple[str, ...]]) -> None:
        conn = sqlite3.connect(self.target, timeout=30)
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            with conn:
                conn.execute(SQLITE_SCHEMA)
                conn.executemany(
                    f"INSERT OR IGNORE INTO agent_audit_events ({', '.join(COLUMNS)}) "
                    f"VALUES ({', '.join('?' for _ in COLUMNS)})",
                    rows,
                )
        finally:
            conn.close()

    async def _write_postgres(self, rows: list[tuple[str, ...]]) -> None:
        import asyncpg

        async with self._lock:
            if self._pool is None:
                self._pool = await asyncpg.create_pool(self.target, min_size=1, max_size=2)
                async with self._pool.acquire() as conn:
                    await conn.execute(POSTGRES_SCHEMA)
        placeholders = ", ".join(f"${i}" for i in range(1, len(COLUMNS) + 1))
        async with self._pool.acquire() as conn, conn.transaction():
            await conn.executemany(
                f"INSERT INTO agent_audit_events ({', '.join(COLUMNS)}) VALUES ({placeholders}) "
                "ON CONFLICT (event_id) DO NOTHING",
                rows,
            )

    async def close(self) -> None:
        if self._pool is not None:
            await self._pool.close()
            self._pool = None

    async def count(self) -> int:
        """Rows in the audit table (for operators and tests)."""
        if self.postgres:
            import asyncpg

            conn = await asyncpg.connect(self.target)
            try:
                return int(await conn.fetchval("SELECT count(*) FROM agent_audit_events"))
            finally:
                await conn.close()
        return await asyncio.to_thread(self._count_sqlite)

    def _count_sqlite(self) -> int:
        conn = sqlite3.connect(self.target, timeout=30)
        try:
            return int(conn.execute("SELECT count(*) FROM agent_audit_events").fetchone()[0])
        finally:
            conn.close()
