"""Hook configuration cannot be changed through hooks; the break-glass bypass is audited.

* A hook that tries to register, remove or soften hooks while it runs (embedded, or in the
  agent's own process beside hook services) gets a ConfigError; nothing changes. Hook services
  cannot either: their Redis user cannot write modes or the break-glass switch
  (tests/test_deploy.py), and a reply carries nothing but an action.
* Break-glass (embedded: ``registry.break_glass``; distributed: ``hookbus breakglass on``)
  applies every enforcing hook as a warning for a limited time, records the switch and every
  answer it held back in the audit log, never lifts a P0–P2 Deny, and ends by itself.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from agent_adapter.client import HookClient
from agent_adapter.executor import ToolExecutor
from agent_adapter.llm import call
from agent_adapter.permissions import PermissionChecker, PermissionRule, ToolKind
from agent_adapter.tools import Tool, Toolbox
from bus import (
    Block,
    ConfigError,
    HookEvent,
    HookRegistry,
    HookSettings,
    MutateInput,
    PreToolUseContext,
)
from bus.breakglass import is_on
from bus.protocol import HookReply, decode, now_ms
from bus.settings import BusSettings
from tests.harness import ROOT, Processes, audit_events, wait_for, wait_live, worker_env
from tests.hooks_for_tests import Recorder
from tests.remote_hooks import HookConfig
from workers.builtins.embedded import MetricsData, with_builtins
from workers.testing import context

PRE = HookEvent.PRE_TOOL_USE


class Meddler(Recorder):
    """Tries to change the hook configuration from inside its own PreToolUse."""

    def __init__(self, change: Any) -> None:
        super().__init__("Meddler", events=(PRE,), failure_policy="fail")
        self.change = change
        self.errors: list[str] = []

    async def pre_tool_use(self, ctx: PreToolUseContext) -> Any:
        await asyncio.sleep(0)  # also from the hook's own task, not just its first step
        try:
            result = self.change()
            if asyncio.iscoroutine(result):
                await result
        except ConfigError as exc:
            self.errors.append(str(exc))
            raise
        return None


@pytest.mark.parametrize(
    "change",
    ["set_mode", "add", "add_session_hook", "remove_session_hook", "break_glass"],
)
async def test_a_hook_cannot_change_the_hook_configuration_embedded(change: str) -> None:
    registry = HookRegistry(HookSettings(hook_timeout_secs=5))
    guard = Recorder("Guard", Block(reason="no"), events=(PRE,))
    registry.add(guard)
    registry.add_session_hook("s1", Recorder("Watcher", events=(PRE,)))
    changes = {
        "set_mode": lambda: registry.set_mode("Guard", "dryrun"),
        "add": lambda: registry.add(Recorder("Sneaky", events=(PRE,))),
        "add_session_hook": lambda: registry.add_session_hook("s1", Recorder("Sneaky")),
        "remove_session_hook": lambda: registry.remove_session_hook("s1", "Watcher"),
        "break_glass": lambda: registry.break_glass("I said so", 60),
    }
    meddler = Meddler(changes[change])
    registry.add(meddler)
    result = await registry.run_pre_tool_use(context(PRE, session_id="s1"))
    assert "cannot be changed through hooks" in meddler.errors[0]
    blockers = {b.hook_name for b in result.blocking_errors}
    assert blockers == {"Guard", "Meddler"}  # Guard still enforced; Meddler failed closed
    assert [(s.name, s.mode) for s in registry.specs()] == [
        ("Guard", "enforce"),
        ("Meddler", "enforce"),
    ]
    assert registry.session_hook_names("s1") == ["Watcher"]
    assert registry.breakglass is None
    registry.set_mode("Guard", "warn")  # the agent itself still can
    assert registry.specs()[0].mode == "warn"


async def test_a_hook_in_the_agent_process_cannot_change_hook_services_either(
    bus_settings: BusSettings,
) -> None:
    async with HookClient(bus_settings, HookSettings(hook_timeout_secs=5)) as client:
        meddler = Meddler(lambda: client.add_session_hook("s1", "Sneaky"))
        client.add(meddler)
        result = await client.run_pre_tool_use(context(PRE, session_id="s1"))
        assert [b.hook_name for b in result.blocking_errors] == ["Meddler"]
        assert "cannot be changed through hooks" in meddler.errors[0]
        assert await client.redis.smembers(client.keys.session_hooks("s1")) == set()


def test_a_reply_carries_nothing_but_an_answer() -> None:
    reply = decode(
        b'{"v":3,"id":"r","ts":1,"request_id":"q","hook":"Guard","replica":"x",'
        b'"action":{"type":"Continue"},"mode":"dryrun","failure_policy":"ignore",'
        b'"timeout":999,"priority":-100,"events":[]}',
        HookReply,
    )
    assert set(HookReply.__struct_fields__) >= {"action"}
    assert not {"mode", "failure_policy", "timeout", "priority", "events"} & set(
        HookReply.__struct_fields__
    )
    assert reply.action is not None


# -- break-glass, embedded -------------------------------------------------------------------


def toolbox(ran: list[Any]) -> Toolbox:
    async def act(args: dict[str, Any]) -> str:
        ran.append(args)
        return "done"

    return Toolbox([Tool("act", "", ToolKind.READ, {"x": int}, act)])


async def test_break_glass_embedded_warns_instead_of_blocking_records_it_and_ends(
    tmp_path: Path,
) -> None:
    registry = with_builtins(tmp_path / "audit.db", set(), MetricsData())
    try:
        registry.add(Recorder("Guard", Block(reason="no shell today"), events=(PRE,)))
        ctx = context(PRE, session_id="s1", tool_name="act", tool_args={"x": 1})
        assert (await registry.run_pre_tool_use(ctx)).blocking_errors
        with pytest.raises(ConfigError, match="needs a reason"):
            registry.break_glass("  ", 60)
        with pytest.raises(ConfigError, match="up to 86400"):
            registry.break_glass("incident", 2 * 86_400)

        registry.break_glass("incident 42: Guard blocks everything", 60, by="alice")
        result = await registry.run_pre_tool_use(ctx)
        assert result.blocking_errors == ()
        assert [t.render() for t in result.tagged_contexts] == [
            "[Hook: Guard | PreToolUse] Warning: this hook would have blocked: no shell today"
        ]
        assert [(s.hook_name, s.mode) for s in result.shadowed] == [("Guard", "warn")]

        ran: list[Any] = []
        deny = PermissionRule.parse("act", "Deny", reason="locked")
        executor = ToolExecutor(registry, toolbox(ran), checker=PermissionChecker([deny]))
        done = await executor.execute_parallel("s1", [call("act", x=1)], step=1)
        assert ran == [] and done.denials[0].level == 0  # a P0 Deny still holds

        registry.cancellation.cancelled.add("s2")  # a person cancels a session meanwhile
        stopped = await registry.run_pre_tool_use(context(PRE, session_id="s2", tool_name="act"))
        assert [b.hook_name for b in stopped.blocking_errors] == ["CancellationHook"]

        registry.end_break_glass()
        assert (await registry.run_pre_tool_use(ctx)).blocking_errors
        short = registry.break_glass("short one", 0.05)
        await wait_for(lambda: not is_on(short, now_ms()), 5, "the short bypass to end")
        assert (await registry.run_pre_tool_use(ctx)).blocking_errors  # it ended by itself

        rows = registry.audit_log.rows()
        statuses = [r["status"] for r in rows]
        assert statuses.count("BREAKGLASS_ON") == 2 and statuses.count("BREAKGLASS_OFF") == 1
        warned = [r for r in rows if r["status"] == "WARN"]
        assert warned and "[break-glass: incident 42" in warned[0]["output_preview"]
    finally:
        registry.close()


# -- break-glass and the audit trail, distributed ----------------------------------------------


def hookbus(settings: BusSettings, *args: str) -> str:
    env = worker_env(settings, COLUMNS="250", NO_COLOR="1")
    out = subprocess.run(
        [sys.executable, "-m", "workers.cli", *args], env=env, cwd=ROOT,
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    return out.stdout


def audit_rows(db: Path) -> list[tuple[str, str, str]]:
    rows = audit_events(db, "status", "tool_name", "output_preview")
    return [r for r in rows if r[0] != "PreToolUse"]


async def test_break_glass_and_shadowed_answers_reach_the_audit_log_over_the_bus(
    bus_settings: BusSettings, procs: Processes, tmp_path: Path
) -> None:
    db = tmp_path / "audit.db"
    guard = HookConfig(
        name="Guard", events=[PRE], answers={PRE.value: Block(reason="no")}, failure_policy="fail"
    )
    procs.scripted(bus_settings, guard)
    procs.worker(
        bus_settings, "workers.builtins.audit:AsyncAuditLogHook", "audit", HOOKBUS_AUDIT_DB=str(db)
    )
    ctx = context(PRE, session_id="s1", tool_name="act", tool_args={"x": 1})
    async with HookClient(bus_settings, HookSettings(hook_timeout_secs=5)) as client:
        await wait_live(client, "Guard")
        await wait_for(lambda: "AsyncAuditLogHook" in client.directory.async_hooks, what="audit")
        assert (await client.run_pre_tool_use(ctx)).blocking_errors

        out = hookbus(bus_settings, "breakglass", "on", "--reason", "incident 42", "--for", "2m",
                      "--by", "alice")  # fmt: skip
        assert "break-glass is ON until" in out and "P0-P2" in out
        assert "incident 42" in hookbus(bus_settings, "breakglass", "status")

        async def bypassed() -> Any:
            result = await client.run_pre_tool_use(ctx)
            return result if not result.blocking_errors else None

        result = await wait_for(bypassed, 10, "the coordinator to see the break-glass")
        assert [(s.hook_name, s.mode) for s in result.shadowed] == [("Guard", "warn")]

        # A broken switch never switches enforcement off: while the bypass is on, the switch is
        # overwritten with something else; it is ignored (logged) and enforcement comes back.
        await client.redis.set(client.keys.breakglass, b"not json", px=60_000)

        async def enforced() -> bool:
            return bool((await client.run_pre_tool_use(ctx)).blocking_errors)

        await wait_for(enforced, 10, "enforcement to come back")
        assert "holds something else" in hookbus(bus_settings, "breakglass", "status")
        assert "enforced" in hookbus(bus_settings, "breakglass", "off", "--by", "alice")
        assert await client.redis.exists(client.keys.breakglass) == 0

        # dryrun: not applied, recorded.
        hookbus(bus_settings, "hooks", "mode", "Guard", "dryrun")
        await wait_for(lambda: client.directory.by_name["Guard"].spec.mode == "dryrun")
        assert (await client.run_pre_tool_use(ctx)).blocking_errors == ()

    def recorded() -> bool:
        statuses = [r[0] for r in audit_rows(db)]
        return {"BREAKGLASS_ON", "BREAKGLASS_OFF", "WARN", "DRYRUN"} <= set(statuses)

    await wait_for(recorded, 20, "the audit log to record the switches and held-back answers")
    rows = audit_rows(db)
    on = next(r for r in rows if r[0] == "BREAKGLASS_ON")
    assert on[2].startswith("alice: incident 42 (until ")
    warn = next(r for r in rows if r[0] == "WARN")
    assert (
        warn[1] == "act" and warn[2] == "Guard: would have blocked: no [break-glass: incident 42]"
    )
    dry = next(r for r in rows if r[0] == "DRYRUN")
    assert dry[2] == "Guard: would have blocked: no"

    trail = hookbus(bus_settings, "audit", "list").splitlines()
    assert any("break-glass on" in line and "alice" in line and "incident 42" in line
               for line in trail), trail  # fmt: skip
    assert any("break-glass off" in line for line in trail), trail
    assert any(" warn " in line and "Guard" in line and "[break-glass: incident 42]" in line
               for line in trail), trail  # fmt: skip
    assert any(" dryrun " in line and "would have blocked: no" in line for line in trail), trail


def test_breakglass_refuses_no_reason_and_overlong_bypasses(bus_settings: BusSettings) -> None:
    for args, why in [
        (["--reason", " "], "needs a reason"),
        (["--reason", "x", "--for", "25h"], "up to 86400"),
        (["--reason", "x", "--for", "soon"], "not a duration"),
    ]:
        out = subprocess.run(
            [sys.executable, "-m", "workers.cli", "breakglass", "on", *args],
            env=worker_env(bus_settings), cwd=ROOT, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert out.returncode != 0 and why in out.stderr and "Traceback" not in out.stderr


def test_mutate_input_is_still_applied_under_break_glass() -> None:
    registry = HookRegistry(HookSettings(hook_timeout_secs=5))
    registry.add(Recorder("Fixer", MutateInput(updated_args={"x": 2}), events=(PRE,)))
    registry.break_glass("incident", 60)
    result = asyncio.run(registry.run_pre_tool_use(context(PRE, tool_args={"x": 1})))
    assert result.final_args == {"x": 2}  # only blocks and denials are softened
