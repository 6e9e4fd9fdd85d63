"""The built-in hooks (workers/builtins/embedded.py) against the specification.

Specification test → test here:

* test_cancellation_hook_blocks_when_cancelled
  → test_cancellation_hook_blocks_when_cancelled
* test_cancellation_hook_allows_when_not_cancelled
  → test_cancellation_hook_allows_when_not_cancelled
* test_metrics_hook_accumulates_counts
  → test_metrics_hook_accumulates_counts (+ test_metrics_snapshot_before_any_call)

Beyond the table (the "内置 Hooks 详解" section and the architecture diagram):

* CancellationHook forgets the session at OnSessionStop
  → test_cancellation_forgotten_at_session_stop
* AuditLogHook rows OK/FAIL, 200-char preview, SESSION_STOP
  → test_audit_rows_ok_fail_and_stop (+ test_audit_rows_survive_reopen)
* AuditLogHook writes are fire-and-forget (never block dispatch)
  → test_audit_write_does_not_block
* subscribed events as in the architecture diagram
  → test_subscribed_events_match_spec
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bus import (
    CONTINUE,
    Block,
    HookEvent,
    HookSettings,
    PostToolUseContext,
    PreToolUseContext,
    SessionStartContext,
    SessionStopContext,
    StepCompleteContext,
    TurnTerminal,
    spec_of,
)
from bus.registry import HookRegistry
from workers.builtins.embedded import (
    AuditLogHook,
    BuiltinRegistry,
    CancellationHook,
    MetricsData,
    MetricsHook,
    with_builtins,
)

E = HookEvent


def pre(session: str = "s1", tool: str = "file_read") -> PreToolUseContext:
    return PreToolUseContext(session_id=session, tool_name=tool, tool_args={"path": "a"}, step=1)


def post(
    output: str = "out",
    *,
    session: str = "s1",
    tool: str = "file_read",
    is_error: bool = False,
    elapsed_ms: float = 0.0,
    step: int = 1,
) -> PostToolUseContext:
    return PostToolUseContext(
        session_id=session,
        tool_name=tool,
        output_content=output,
        is_error=is_error,
        elapsed_ms=elapsed_ms,
        step=step,
    )


def stop(
    session: str = "s1", terminal: TurnTerminal = TurnTerminal.COMPLETED, steps: int = 6
) -> SessionStopContext:
    return SessionStopContext(session_id=session, terminal=terminal, total_steps=steps)


@pytest.fixture
def cancelled() -> set[str]:
    return set()


@pytest.fixture
def metrics() -> MetricsData:
    return MetricsData()


@pytest.fixture
def registry(
    tmp_path: Path, cancelled: set[str], metrics: MetricsData
) -> Iterator[BuiltinRegistry]:
    reg = with_builtins(tmp_path / "audit.db", cancelled, metrics, HookSettings())
    try:
        yield reg
    finally:
        reg.close()


class GatedAuditLogHook(AuditLogHook):
    """An AuditLogHook whose first write waits on the worker thread until ``gate`` is set."""

    def __init__(self, db_path: Path) -> None:
        self.gate = threading.Event()
        self.first_write_started = threading.Event()
        super().__init__(db_path)

    def _write(self, row: Any) -> None:
        if not self.first_write_started.is_set():
            self.first_write_started.set()
            # A safety net so a broken test cannot hang the worker; not a synchronisation.
            assert self.gate.wait(timeout=30), "gate was never opened"
        super()._write(row)


# -- CancellationHook ------------------------------------------------------------------------------


async def test_cancellation_hook_blocks_when_cancelled(
    registry: BuiltinRegistry, cancelled: set[str]
) -> None:
    hook = CancellationHook(cancelled)
    cancelled.add("s1")  # the app cancels through the shared set
    assert await hook.pre_tool_use(pre("s1")) == Block(
        reason="session s1 was cancelled by the user"
    )

    result = await registry.run_pre_tool_use(pre("s1"))
    assert result.is_blocked
    assert result.action == Block(reason="session s1 was cancelled by the user")
    assert [b.hook_name for b in result.blocking_errors] == ["CancellationHook"]
    # Only the cancelled session is blocked.
    assert not (await registry.run_pre_tool_use(pre("s2"))).is_blocked


async def test_cancellation_hook_allows_when_not_cancelled(
    registry: BuiltinRegistry, cancelled: set[str]
) -> None:
    cancelled.add("other")
    assert await CancellationHook(cancelled).pre_tool_use(pre("s1")) is CONTINUE
    result = await registry.run_pre_tool_use(pre("s1"))
    assert not result.is_blocked
    assert result.blocking_errors == ()
    assert result.final_args == {"path": "a"}


async def test_cancellation_forgotten_at_session_stop(
    registry: BuiltinRegistry, cancelled: set[str]
) -> None:
    registry.cancellation.cancel("s1")
    assert cancelled == {"s1"}  # cancel() writes to the shared set
    cancelled.add("s2")
    assert (await registry.run_pre_tool_use(pre("s1"))).is_blocked

    await registry.run_on_session_stop(stop("s1", TurnTerminal.CANCELLED))

    assert cancelled == {"s2"}
    assert not (await registry.run_pre_tool_use(pre("s1"))).is_blocked
    # Stopping a session that was never cancelled is fine.
    await registry.run_on_session_stop(stop("s3"))
    assert cancelled == {"s2"}


# -- MetricsHook -----------------------------------------------------------------------------------


async def test_metrics_hook_accumulates_counts(
    registry: BuiltinRegistry, metrics: MetricsData, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="hookbus.metrics")
    await registry.run_on_session_start(SessionStartContext(session_id="s1"))
    assert metrics.session_id == "s1"

    for ctx in (
        post(elapsed_ms=10.0),
        post(is_error=True, elapsed_ms=30.0),
        post(tool="web_search", elapsed_ms=20.0),
        post(elapsed_ms=0.0),
    ):
        result = await registry.run_post_tool_use(ctx)
        assert result.final_content == ctx.output_content  # metrics never change output

    for step in range(1, 7):
        await registry.run_on_step_complete(
            StepCompleteContext(session_id="s1", step=step, max_steps=10)
        )
    await registry.run_on_session_stop(stop("s1", TurnTerminal.MAX_STEPS))

    snap = metrics.snapshot()
    assert snap["tool_calls"] == 4
    assert snap["tool_errors"] == 1
    assert snap["total_latency_ms"] == pytest.approx(60.0)
    assert snap["avg_latency_ms"] == pytest.approx(15.0)
    assert snap["steps"] == 6
    assert snap["terminal"] == "MaxSteps"
    assert snap["session_id"] == "s1"
    assert len(snap["summaries"]) == 2
    assert "step 3/10" in snap["summaries"][0]
    assert "step 6/10" in snap["summaries"][1]
    assert all("\n" not in s for s in snap["summaries"])
    # The hook updates the runtime's object itself; a snapshot is a detached copy.
    assert registry.metrics_hook.metrics is metrics
    snap["summaries"].append("x")
    assert len(metrics.summaries) == 2

    messages = [r.getMessage() for r in caplog.records if r.name == "hookbus.metrics"]
    assert messages[:2] == metrics.summaries
    assert any("MaxSteps" in m for m in messages[2:])


def test_metrics_snapshot_before_any_call() -> None:
    snap = MetricsData().snapshot()
    assert snap["avg_latency_ms"] == 0.0
    assert snap["terminal"] is None
    assert snap["summaries"] == []


# -- AuditLogHook ----------------------------------------------------------------------------------


async def test_audit_rows_ok_fail_and_stop(registry: BuiltinRegistry) -> None:
    long_output = "x" * 150 + "y" * 150
    await registry.run_post_tool_use(post("fine", step=1))
    await registry.run_post_tool_use(post(long_output, is_error=True, tool="run_bash", step=2))
    await registry.run_post_tool_use(post("elsewhere", session="s2"))
    await registry.run_on_session_stop(stop("s1", TurnTerminal.ERROR, steps=2))
    await registry.audit_log.flush()
    assert registry.audit_log.pending == 0

    rows = registry.audit_log.rows("s1")
    assert [(r["event"], r["tool_name"], r["status"], r["step"]) for r in rows] == [
        ("PostToolUse", "file_read", "OK", 1),
        ("PostToolUse", "run_bash", "FAIL", 2),
        ("OnSessionStop", None, "SESSION_STOP", 2),
    ]
    assert rows[0]["output_preview"] == "fine"
    assert rows[1]["output_preview"] == long_output[:200]
    assert len(rows[1]["output_preview"]) == 200
    assert rows[2]["output_preview"] == "Error"
    assert [r["id"] for r in rows] == sorted(r["id"] for r in rows)
    for r in rows:
        created = dt.datetime.fromisoformat(r["created_at"])
        assert created.utcoffset() == dt.timedelta(0)

    assert len(registry.audit_log.rows()) == 4
    assert [r["output_preview"] for r in registry.audit_log.rows("s2")] == ["elsewhere"]


async def test_a_refused_dispatch_gets_an_audit_row(registry: BuiltinRegistry) -> None:
    """Embedded, input no hook could inspect is recorded in the audit log (protocol.md 5.6)."""
    deep: dict[str, Any] = {}
    for _ in range(100):
        deep = {"a": deep}
    ctx = PreToolUseContext(session_id="s9", tool_name="run_bash", tool_args=deep)
    result = await registry.run_pre_tool_use(ctx)
    assert result.is_blocked and registry.refusals == 1
    await registry.audit_log.flush()
    (row,) = registry.audit_log.rows("s9")
    assert (row["event"], row["tool_name"], row["status"]) == ("PreToolUse", "run_bash", "REFUSED")
    assert "(MAX_CONTEXT_DEPTH)" in row["output_preview"]


async def test_audit_rows_survive_reopen(tmp_path: Path) -> None:
    db = tmp_path / "audit.db"
    hook = AuditLogHook(db)
    try:
        await hook.post_tool_use(post("one"))
    finally:
        hook.close()  # close waits for the pending write
    hook.close()  # idempotent

    again = AuditLogHook(db)  # the table already exists
    try:
        assert [r["output_preview"] for r in again.rows()] == ["one"]
    finally:
        again.close()


async def test_audit_write_does_not_block(tmp_path: Path) -> None:
    hook = GatedAuditLogHook(tmp_path / "audit.db")
    reg = HookRegistry(HookSettings())
    reg.add(hook)
    try:
        # The worker is stuck in the first write; dispatch must come back regardless.
        result = await asyncio.wait_for(reg.run_post_tool_use(post("held")), timeout=10)
        assert result.final_content == "held"
        await asyncio.wait_for(reg.run_on_session_stop(stop()), timeout=10)
        assert hook.pending == 2

        flushed = asyncio.ensure_future(hook.flush())
        await asyncio.to_thread(hook.first_write_started.wait, 10)
        assert not flushed.done()
        hook.gate.set()
        await asyncio.wait_for(flushed, timeout=10)

        assert hook.pending == 0
        assert [r["status"] for r in hook.rows()] == ["OK", "SESSION_STOP"]
    finally:
        hook.gate.set()
        hook.close()


# -- declarations ----------------------------------------------------------------------------------


async def test_subscribed_events_match_spec(
    tmp_path: Path, registry: BuiltinRegistry, metrics: MetricsData
) -> None:
    audit = AuditLogHook(tmp_path / "other.db")
    try:
        assert spec_of(CancellationHook(set())).events == {E.PRE_TOOL_USE, E.ON_SESSION_STOP}
        assert spec_of(MetricsHook(metrics)).events == {
            E.ON_SESSION_START,
            E.POST_TOOL_USE,
            E.ON_STEP_COMPLETE,
            E.ON_SESSION_STOP,
        }
        assert spec_of(audit).events == {E.POST_TOOL_USE, E.ON_SESSION_STOP}
    finally:
        audit.close()

    assert isinstance(registry, HookRegistry)
    assert [s.name for s in registry.specs()] == ["CancellationHook", "MetricsHook", "AuditLogHook"]
    assert [s.name for s in registry.specs(E.PRE_TOOL_USE)] == ["CancellationHook"]
    assert [s.name for s in registry.specs(E.POST_TOOL_USE)] == ["MetricsHook", "AuditLogHook"]
    assert [s.name for s in registry.specs(E.ON_STEP_COMPLETE)] == ["MetricsHook"]
    assert registry.specs(E.PERMISSION_REQUEST) == []
