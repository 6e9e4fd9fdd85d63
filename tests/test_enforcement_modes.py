"""Enforcement modes (enforce, warn, dryrun) in embedded and distributed modes alike.

A ``dryrun`` Block lets the tool run and is recorded; ``warn`` injects a warning for the agent;
``enforce`` blocks. The mode changes while the hook runs, without redeploying it.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from agent_adapter.executor import ToolExecutor
from agent_adapter.llm import call
from agent_adapter.permissions import ToolKind
from agent_adapter.tools import Tool, Toolbox
from bus import (
    Block,
    ConfigError,
    HookEvent,
    HookRegistry,
    MutateInput,
    Override,
    PermissionDecision,
    PermissionRequestContext,
    PreToolUseContext,
)
from bus.transport.keys import Keys
from tests.harness import ROOT, wait_for, worker_env
from tests.remote_hooks import HookConfig

PRE, PERM = HookEvent.PRE_TOOL_USE.value, HookEvent.PERMISSION_REQUEST.value


def guard(mode: str) -> HookConfig:
    return HookConfig(name="Guard", enforcement=mode, answers={PRE: Block(reason="no shell today")})


async def run_tool(runner: Any) -> tuple[list[dict[str, Any]], Any]:
    ran: list[dict[str, Any]] = []

    async def act(args: dict[str, Any]) -> str:
        ran.append(args)
        return "done"

    toolbox = Toolbox([Tool("run_shell", "", ToolKind.READ, {"x": int}, act)])
    result = await ToolExecutor(runner, toolbox).execute_parallel(
        "s1", [call("run_shell", x=1)], step=1
    )
    return ran, result


async def test_enforce_blocks(harness: Any) -> None:
    ran, result = await run_tool(await harness.start(guard("enforce")))
    assert ran == [] and result.blocking_errors[0].reason == "no shell today"
    assert result.shadowed == []


async def test_dryrun_lets_the_tool_run_and_records_what_it_would_have_done(harness: Any) -> None:
    ran, result = await run_tool(await harness.start(guard("dryrun")))
    assert ran == [{"x": 1}]  # not applied
    assert result.blocking_errors == [] and result.hook_contexts == []
    [answer] = result.shadowed
    assert (answer.hook_name, answer.mode, answer.action) == ("Guard", "dryrun", "Block")
    assert answer.detail == "would have blocked: no shell today"


async def test_warn_injects_a_warning_instead_of_blocking(harness: Any) -> None:
    ran, result = await run_tool(await harness.start(guard("warn")))
    assert ran == [{"x": 1}]
    [ctx] = result.hook_contexts
    assert ctx.render() == (
        "[Hook: Guard | PreToolUse] Warning: this hook would have blocked: no shell today"
    )
    assert [a.mode for a in result.shadowed] == ["warn"]


async def test_modes_cover_mutations_overrides_and_failures(harness: Any) -> None:
    runner = await harness.start(
        HookConfig(name="Rewrite", priority=0, enforcement="dryrun",
                   answers={PRE: MutateInput(updated_args={"x": 2})}),
        HookConfig(name="Denier", priority=1, enforcement="warn",
                   answers={PERM: Override(decision=PermissionDecision.DENY, reason="r")}),
        HookConfig(name="Flaky", priority=2, enforcement="dryrun", raises=True,
                   failure_policy="fail", events=[HookEvent.PRE_TOOL_USE]),
    )  # fmt: skip
    pre = await runner.run_pre_tool_use(
        PreToolUseContext(session_id="s1", tool_name="t", tool_args={"x": 1})
    )
    assert pre.final_args == {"x": 1} and not pre.is_blocked  # neither applied
    assert [(a.hook_name, a.action) for a in pre.shadowed] == [
        ("Rewrite", "MutateInput"),
        ("Flaky", "failure"),
    ]
    assert [s.hook_name for s in pre.skipped] == ["Flaky"] and not pre.skipped[0].enforced
    perm = await runner.run_on_permission_request(
        PermissionRequestContext(session_id="s1", tool_name="t")
    )
    assert type(perm.action).__name__ == "Continue"  # the Deny became a warning
    assert perm.shadowed[0].detail == "would have overridden the permission decision to Deny: r"


async def test_mode_changes_without_redeploying_the_hook(harness: Any) -> None:
    runner = await harness.start(guard("enforce"))
    ran, _ = await run_tool(runner)
    assert ran == []
    if harness.mode == "embedded":
        runner.set_mode("Guard", "dryrun")
    else:
        out = subprocess.run(
            [sys.executable, "-m", "workers.cli", "hooks", "mode", "Guard", "dryrun"],
            cwd=ROOT, env=worker_env(harness.settings), capture_output=True, text=True,
            timeout=60,
        )  # fmt: skip
        assert out.returncode == 0 and "now in dryrun mode" in out.stdout, out.stderr
        assert await runner.redis.hget(Keys(harness.settings.prefix).modes, "Guard") == b"dryrun"
        await wait_for(lambda: runner.directory.by_name["Guard"].spec.mode == "dryrun")
    ran, result = await run_tool(runner)
    assert ran == [{"x": 1}] and result.shadowed[0].mode == "dryrun"


def test_bad_mode_is_a_clear_error() -> None:
    from tests.remote_hooks import Scripted

    with pytest.raises(ConfigError, match="enforcement must be one of"):
        HookRegistry().add(Scripted(HookConfig(name="x", enforcement="maybe")))


async def test_embedded_audit_log_records_dryrun_and_warn_answers(tmp_path: Path) -> None:
    from tests.remote_hooks import Scripted
    from workers.builtins.embedded import MetricsData, with_builtins

    registry = with_builtins(tmp_path / "audit.db", set(), MetricsData())
    try:
        registry.add(Scripted(guard("dryrun")))
        ran, _ = await run_tool(registry)
        await registry.audit_log.flush()
        rows = [r for r in registry.audit_log.rows() if r["status"] == "DRYRUN"]
        assert ran == [{"x": 1}]
        assert rows and rows[0]["output_preview"] == "Guard: would have blocked: no shell today"
    finally:
        registry.close()


async def test_distributed_audit_log_records_dryrun_and_warn_answers(
    bus_settings: Any, procs: Any, tmp_path: Path
) -> None:
    """Coordinators write held-back answers to the audit trail; the audit log hook service
    stores them beside the events (one row each, whatever the redeliveries)."""
    from agent_adapter.client import HookClient
    from bus import HookSettings
    from tests.harness import audit_events, wait_live

    db = tmp_path / "audit.db"
    procs.scripted(bus_settings, guard("dryrun"))
    warner = HookConfig(name="Warner", enforcement="warn", answers={PRE: Block(reason="careful")})
    procs.scripted(bus_settings, warner)
    procs.worker(
        bus_settings, "workers.builtins.audit:AsyncAuditLogHook", "audit", HOOKBUS_AUDIT_DB=str(db)
    )

    def rows() -> list[tuple[Any, ...]]:
        found = audit_events(db, "status", "session_id", "output_preview")
        return [r for r in found if r[0] in ("DRYRUN", "WARN")]

    async with HookClient(bus_settings, HookSettings(hook_timeout_secs=5)) as client:
        await wait_live(client, "Guard", "Warner")
        await wait_for(lambda: "AsyncAuditLogHook" in client.directory.async_hooks, what="audit")
        ran, result = await run_tool(client)
    assert ran == [{"x": 1}]
    assert sorted(a.mode for a in result.shadowed) == ["dryrun", "warn"]
    await wait_for(lambda: len(rows()) == 2, 20, "both held-back answers in the audit log")
    assert sorted(rows()) == [
        ("DRYRUN", "s1", "Guard: would have blocked: no shell today"),
        ("WARN", "s1", "Warner: would have blocked: careful"),
    ]
