"""The specification's built-in hooks: CancellationHook, MetricsHook and AuditLogHook.

``with_builtins`` is the specification's ``HookRegistry::with_builtins(db, cancelled, metrics)``:
a registry with the three hooks already added.

* ``CancellationHook`` (PreToolUse, OnSessionStop) blocks every tool call of a session whose id
  is in a set shared with the runtime (the app's ``cancelled_runs``), and forgets the session
  when it stops.
* ``MetricsHook`` (OnSessionStart, PostToolUse, OnStepComplete, OnSessionStop) accumulates into
  a ``MetricsData`` shared with the runtime, so ``get_metrics()`` and the hook see one object.
* ``AuditLogHook`` (PostToolUse, OnSessionStop) writes one SQLite row per tool call and per
  session stop. Writes are fire-and-forget: they run on a single worker thread that owns the
  connection, and the hook answers without waiting for them (``flush`` waits when asked).

Every hook runs on the event loop; ``MetricsData`` and the cancelled set are therefore only
touched from the loop and need no lock.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import sqlite3
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from bus import (
    CONTINUE,
    AgentHook,
    Block,
    HookEvent,
    HookRegistry,
    HookSettings,
    PostToolUseContext,
    PreToolUseContext,
    SessionStartContext,
    SessionStopContext,
    StepCompleteContext,
)
from bus.actions import PostToolUseAction, PreToolUseAction, ShadowedAnswer
from bus.breakglass import BreakGlass
from bus.errors import LimitError
from bus.events import HookContext, session_of, tool_of
from bus.settings import env_value
from workers.builtins.audit import DEFAULT_AUDIT_DB
from workers.builtins.redaction import Redaction

__all__ = [
    "AUDIT_PREVIEW_CHARS",
    "SUMMARY_EVERY_STEPS",
    "AuditLogHook",
    "BuiltinRegistry",
    "CancellationHook",
    "MetricsData",
    "MetricsHook",
    "with_builtins",
]

metrics_log = logging.getLogger("hookbus.metrics")
audit_log = logging.getLogger("hookbus.audit")

#: How many characters of a tool's output an audit row keeps.
AUDIT_PREVIEW_CHARS = 200
#: MetricsHook logs a summary every this many steps.
SUMMARY_EVERY_STEPS = 3

_T = TypeVar("_T")


# -- CancellationHook ------------------------------------------------------------------------------


class CancellationHook(AgentHook):
    """Blocks the tool calls of cancelled sessions (the specification's global interrupt).

    Args:
        cancelled: the set of cancelled session ids, shared with the runtime (mutated in place:
            the runtime adds ids, this hook removes them at OnSessionStop).
    """

    name = "CancellationHook"
    subscribed_events = (HookEvent.PRE_TOOL_USE, HookEvent.ON_SESSION_STOP)

    def __init__(self, cancelled: set[str]) -> None:
        self.cancelled = cancelled

    def cancel(self, session_id: str) -> None:
        """Mark ``session_id`` as cancelled: its next tool calls are blocked.

        Args:
            session_id: the session to cancel.
        """
        self.cancelled.add(session_id)

    async def pre_tool_use(self, ctx: PreToolUseContext) -> PreToolUseAction:
        """Block the call if its session was cancelled.

        Args:
            ctx: the tool call about to run.

        Returns:
            ``Block`` for a cancelled session, else ``CONTINUE``.
        """
        if ctx.session_id in self.cancelled:
            return Block(reason=f"session {ctx.session_id} was cancelled by the user")
        return CONTINUE

    async def on_session_stop(self, ctx: SessionStopContext) -> None:
        """Forget the session's cancellation.

        Args:
            ctx: the stopping session.
        """
        self.cancelled.discard(ctx.session_id)


# -- MetricsHook -----------------------------------------------------------------------------------


@dataclass
class MetricsData:
    """Counters shared by ``MetricsHook`` and the runtime's ``get_metrics()``.

    Attributes:
        session_id: the session being measured (set at OnSessionStart).
        tool_calls: PostToolUse events seen.
        tool_errors: those with ``is_error``.
        total_latency_ms: sum of their ``elapsed_ms``.
        steps: the last completed step.
        terminal: why the session ended (a ``TurnTerminal`` value), or None while it runs.
        summaries: the periodic one-line summaries, oldest first.
    """

    session_id: str = ""
    tool_calls: int = 0
    tool_errors: int = 0
    total_latency_ms: float = 0.0
    steps: int = 0
    terminal: str | None = None
    summaries: list[str] = field(default_factory=list)

    @property
    def avg_latency_ms(self) -> float:
        """Mean tool latency in milliseconds (0.0 before the first call)."""
        return self.total_latency_ms / self.tool_calls if self.tool_calls else 0.0

    def snapshot(self) -> dict[str, Any]:
        """A copy of the counters, plus ``avg_latency_ms``, safe to hand out.

        Returns:
            A new dictionary; later updates do not change it.
        """
        return {
            "session_id": self.session_id,
            "tool_calls": self.tool_calls,
            "tool_errors": self.tool_errors,
            "total_latency_ms": self.total_latency_ms,
            "avg_latency_ms": self.avg_latency_ms,
            "steps": self.steps,
            "terminal": self.terminal,
            "summaries": list(self.summaries),
        }


class MetricsHook(AgentHook):
    """Accumulates tool-call counts and latency into a shared ``MetricsData``.

    Args:
        metrics: the runtime's own ``MetricsData`` (the specification's ``from_arc``), updated in
            place.
    """

    name = "MetricsHook"
    subscribed_events = (
        HookEvent.ON_SESSION_START,
        HookEvent.POST_TOOL_USE,
        HookEvent.ON_STEP_COMPLETE,
        HookEvent.ON_SESSION_STOP,
    )

    def __init__(self, metrics: MetricsData) -> None:
        self.metrics = metrics

    async def on_session_start(self, ctx: SessionStartContext) -> None:
        """Record the session id.

        Args:
            ctx: the starting session.
        """
        self.metrics.session_id = ctx.session_id

    async def post_tool_use(self, ctx: PostToolUseContext) -> PostToolUseAction:
        """Count the call, its error and its latency.

        Args:
            ctx: the finished tool call.

        Returns:
            ``CONTINUE``: metrics never change the output.
        """
        m = self.metrics
        m.tool_calls += 1
        if ctx.is_error:
            m.tool_errors += 1
        m.total_latency_ms += ctx.elapsed_ms
        return CONTINUE

    async def on_step_complete(self, ctx: StepCompleteContext) -> None:
        """Record the step; every ``SUMMARY_EVERY_STEPS`` steps, keep and log a summary.

        Args:
            ctx: the completed step.
        """
        m = self.metrics
        m.steps = ctx.step
        if ctx.step > 0 and ctx.step % SUMMARY_EVERY_STEPS == 0:
            summary = (
                f"session {ctx.session_id} step {ctx.step}/{ctx.max_steps}: "
                f"{m.tool_calls} tool calls, {m.tool_errors} errors, "
                f"avg latency {m.avg_latency_ms:.1f} ms"
            )
            m.summaries.append(summary)
            metrics_log.info("%s", summary)

    async def on_session_stop(self, ctx: SessionStopContext) -> None:
        """Record and log why the session ended.

        Args:
            ctx: the stopping session.
        """
        self.metrics.terminal = ctx.terminal.value
        metrics_log.info(
            "session %s stopped: %s after %d steps",
            ctx.session_id,
            ctx.terminal.value,
            ctx.total_steps,
        )


# -- AuditLogHook ----------------------------------------------------------------------------------

_CREATE_TABLE = """
CREATE TABLE IF NOT EXISTS agent_audit_log (
    id INTEGER PRIMARY KEY,
    session_id TEXT,
    event TEXT,
    tool_name TEXT,
    status TEXT,
    output_preview TEXT,
    step INTEGER,
    created_at TEXT
)
"""
_INSERT = (
    "INSERT INTO agent_audit_log"
    " (session_id, event, tool_name, status, output_preview, step, created_at)"
    " VALUES (?, ?, ?, ?, ?, ?, ?)"
)
_COLUMNS = "id, session_id, event, tool_name, status, output_preview, step, created_at"

_AuditRow = tuple[str, str, str | None, str, str, int, str]


class AuditLogHook(AgentHook):
    """Writes an audit row per tool call and per session stop into SQLite, without waiting.

    Rows go to table ``agent_audit_log`` (created if absent). ``status`` is ``OK`` or ``FAIL``
    for PostToolUse and ``SESSION_STOP`` for OnSessionStop; ``output_preview`` is the first
    ``AUDIT_PREVIEW_CHARS`` characters of the output, or the terminal reason for a stop row.

    All database work runs on one worker thread that owns the connection. The hook methods only
    submit the write and return; call ``flush`` to wait for pending writes and ``close`` when
    done. A failed write is logged (``hookbus.audit``) and never reaches the agent.

    Args:
        db_path: the SQLite database file; when omitted (a hook service started with
            ``hookbus worker workers.builtins.embedded:AuditLogHook``), ``$HOOKBUS_AUDIT_DB`` or
            ``hookbus-audit.db``.
        redact: replace secrets in previews and details with ``[redacted]`` before they are
            stored: True for the common shapes, or a list of regular expressions
            (workers/builtins/redaction.py). The hook sees tool output as the tool produced it.
    """

    name = "AuditLogHook"
    subscribed_events = (HookEvent.POST_TOOL_USE, HookEvent.ON_SESSION_STOP)

    def __init__(self, db_path: str | Path | None = None, redact: bool | list[str] = False) -> None:
        self.db_path = Path(db_path or env_value("HOOKBUS_AUDIT_DB") or DEFAULT_AUDIT_DB)
        self.redact = Redaction(redact)
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hookbus-audit")
        self._pending: set[Future[None]] = set()
        self._lock = threading.Lock()
        self._closed = False
        try:
            self._conn = self._executor.submit(self._connect).result()
        except BaseException:
            self._executor.shutdown(wait=True)
            raise

    # -- worker-thread side ----------------------------------------------------------------------

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.db_path, check_same_thread=False)
        try:
            with conn:
                conn.execute(_CREATE_TABLE)
        except BaseException:
            conn.close()
            raise
        return conn

    def _write(self, row: _AuditRow) -> None:
        """Insert one row (runs on the worker thread)."""
        with self._conn:
            self._conn.execute(_INSERT, row)

    def _select(self, session_id: str | None) -> list[dict[str, Any]]:
        query = f"SELECT {_COLUMNS} FROM agent_audit_log"
        params: tuple[str, ...] = ()
        if session_id is not None:
            query += " WHERE session_id = ?"
            params = (session_id,)
        cursor = self._conn.execute(query + " ORDER BY id", params)
        try:
            names = [d[0] for d in cursor.description]
            return [dict(zip(names, values, strict=True)) for values in cursor.fetchall()]
        finally:
            cursor.close()

    # -- loop side -------------------------------------------------------------------------------

    def _call(self, fn: Callable[..., _T], *args: Any) -> _T:
        """Run ``fn`` on the worker thread and wait for it (queued after pending writes)."""
        if self._closed:
            raise RuntimeError("AuditLogHook is closed")
        return self._executor.submit(fn, *args).result()

    def _submit(self, row: _AuditRow) -> None:
        if self._closed:
            audit_log.warning("audit row dropped, hook closed: %s", row)
            return
        future = self._executor.submit(self._write, row)
        with self._lock:
            self._pending.add(future)
        future.add_done_callback(self._done)

    def _done(self, future: Future[None]) -> None:
        with self._lock:
            self._pending.discard(future)
        if not future.cancelled() and (exc := future.exception()) is not None:
            audit_log.error("audit write to %s failed: %r", self.db_path, exc)

    def _snapshot(self) -> list[Future[None]]:
        with self._lock:
            return list(self._pending)

    @property
    def pending(self) -> int:
        """How many writes have been submitted and have not finished yet."""
        with self._lock:
            return len(self._pending)

    async def post_tool_use(self, ctx: PostToolUseContext) -> PostToolUseAction:
        """Queue an ``OK``/``FAIL`` row for the call and answer at once.

        Args:
            ctx: the finished tool call.

        Returns:
            ``CONTINUE``, without waiting for the write.
        """
        self._submit(
            (
                ctx.session_id,
                HookEvent.POST_TOOL_USE.value,
                ctx.tool_name,
                "FAIL" if ctx.is_error else "OK",
                self.redact(ctx.output_content)[:AUDIT_PREVIEW_CHARS],
                ctx.step,
                _utc_now(),
            )
        )
        return CONTINUE

    async def on_session_stop(self, ctx: SessionStopContext) -> None:
        """Queue a ``SESSION_STOP`` row carrying the terminal reason.

        Args:
            ctx: the stopping session.
        """
        self._submit(
            (
                ctx.session_id,
                HookEvent.ON_SESSION_STOP.value,
                None,
                "SESSION_STOP",
                ctx.terminal.value,
                ctx.total_steps,
                _utc_now(),
            )
        )

    def record_shadowed(
        self,
        session_id: str,
        event: str,
        tool_name: str | None,
        answer: ShadowedAnswer,
        breakglass: str = "",
    ) -> None:
        """Queue a ``WARN``/``DRYRUN`` row: what a hook not yet enforcing would have done
        (under a break-glass bypass, with its reason)."""
        detail = f"{answer.hook_name}: {answer.detail}"
        if breakglass:
            detail += f" [break-glass: {breakglass}]"
        row = (
            session_id, event, tool_name, answer.mode.upper(),
            self.redact(detail)[:AUDIT_PREVIEW_CHARS], 0,
        )  # fmt: skip
        self._submit((*row, _utc_now()))

    def record_refused(
        self, session_id: str, event: str, tool_name: str | None, reason: str
    ) -> None:
        """Queue a ``REFUSED`` row: a dispatch whose context no hook could be shown."""
        row = (session_id, event, tool_name, "REFUSED", reason[:AUDIT_PREVIEW_CHARS], 0)
        self._submit((*row, _utc_now()))

    def record_breakglass(self, glass: BreakGlass, on: bool) -> None:
        """Queue a ``BREAKGLASS_ON``/``BREAKGLASS_OFF`` row: who, why, until when."""
        until = dt.datetime.fromtimestamp(glass.until_ms / 1000, dt.UTC).isoformat()
        detail = f"{glass.by}: {glass.reason} (until {until})"
        status = "BREAKGLASS_ON" if on else "BREAKGLASS_OFF"
        self._submit(
            ("", "", None, status, self.redact(detail)[:AUDIT_PREVIEW_CHARS], 0, _utc_now())
        )

    async def flush(self) -> None:
        """Wait until every write submitted so far (and any submitted meanwhile) is done.

        Failed writes have already been logged; they do not raise here.
        """
        while pending := self._snapshot():
            await asyncio.gather(*(asyncio.wrap_future(f) for f in pending), return_exceptions=True)

    def rows(self, session_id: str | None = None) -> list[dict[str, Any]]:
        """Read the audit rows back, blocking until the writes queued before are done.

        Args:
            session_id: only this session's rows; every row when None.

        Returns:
            One dictionary per row (keys are the column names), ordered by id.

        Raises:
            RuntimeError: the hook is closed.
        """
        return self._call(self._select, session_id)

    def close(self) -> None:
        """Wait for pending writes, then close the connection and stop the worker thread.

        Blocks the caller. Calling it again does nothing.
        """
        if self._closed:
            return
        self._closed = True
        try:
            self._executor.submit(self._conn.close).result()
        finally:
            self._executor.shutdown(wait=True)


def _utc_now() -> str:
    return dt.datetime.now(dt.UTC).isoformat()


# -- with_builtins ---------------------------------------------------------------------------------


class BuiltinRegistry(HookRegistry):
    """A ``HookRegistry`` holding the three built-ins, with handles on them.

    Attributes:
        cancellation: the CancellationHook.
        metrics_hook: the MetricsHook.
        audit_log: the AuditLogHook (close it, or the registry, when done).
    """

    def __init__(
        self,
        cancellation: CancellationHook,
        metrics_hook: MetricsHook,
        audit_log: AuditLogHook,
        settings: HookSettings | None = None,
    ) -> None:
        super().__init__(settings)
        self.cancellation = cancellation
        self.metrics_hook = metrics_hook
        self.audit_log = audit_log
        for hook in (cancellation, metrics_hook, audit_log):
            self.add(hook)

    def held_back(
        self, event: HookEvent, ctx: HookContext, answers: Sequence[tuple[ShadowedAnswer, str]]
    ) -> None:
        """Answers held back by ``warn``/``dryrun`` hooks (or a break-glass bypass) go to the
        audit log as well."""
        tool, _ = tool_of(ctx)
        for answer, reason in answers:
            self.audit_log.record_shadowed(session_of(ctx), event.value, tool, answer, reason)

    def refused(self, event: HookEvent, ctx: HookContext, error: LimitError) -> None:
        """A refused dispatch (no hook could be shown its context) gets an audit row too."""
        super().refused(event, ctx, error)
        tool, _ = tool_of(ctx)
        self.audit_log.record_refused(
            str(session_of(ctx))[:300], event.value, str(tool)[:300] if tool else None, str(error)
        )

    def break_glass(self, reason: str, seconds: float, by: str = "agent") -> BreakGlass:
        glass = super().break_glass(reason, seconds, by)
        self.audit_log.record_breakglass(glass, on=True)
        return glass

    def end_break_glass(self) -> None:
        if self.breakglass is not None:
            self.audit_log.record_breakglass(self.breakglass, on=False)
        super().end_break_glass()

    def close(self) -> None:
        """Close the audit log (waits for its pending writes)."""
        self.audit_log.close()


def with_builtins(
    db_path: str | Path,
    cancelled: set[str],
    metrics: MetricsData,
    settings: HookSettings | None = None,
    *,
    redact: bool | list[str] = False,
) -> BuiltinRegistry:
    """The specification's ``HookRegistry::with_builtins(db, cancelled, metrics)``.

    Args:
        db_path: SQLite file for the AuditLogHook.
        cancelled: the runtime's set of cancelled session ids (shared, not copied).
        metrics: the runtime's ``MetricsData`` (shared, not copied).
        settings: dispatch settings; read from the environment when omitted.
        redact: the AuditLogHook's ``redact``.

    Returns:
        A registry (a ``HookRegistry``) with CancellationHook, MetricsHook and AuditLogHook
        added. Call its ``close()`` when done to close the audit database.
    """
    audit = AuditLogHook(db_path, redact)
    try:
        return BuiltinRegistry(CancellationHook(cancelled), MetricsHook(metrics), audit, settings)
    except BaseException:
        audit.close()
        raise
