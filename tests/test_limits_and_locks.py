"""Size limits, and the permission lock held through the distributed path."""

from __future__ import annotations

import logging
import random
from typing import Any

import msgspec
import pytest

from agent_adapter.client import HookClient
from agent_adapter.executor import ToolExecutor
from agent_adapter.llm import call
from agent_adapter.permissions import PermissionChecker, PermissionRule, ToolKind, Verdict
from agent_adapter.tools import Tool, Toolbox
from bus import (
    CONTINUE,
    Block,
    HookRegistry,
    HookSettings,
    InjectContext,
    MutateInput,
    Override,
    PermissionDecision,
    PermissionRequired,
    PreToolUseContext,
)
from bus.ratelog import RateLimitedLog
from bus.settings import BusSettings
from tests.harness import Processes, wait_for, wait_live
from tests.remote_hooks import HookConfig


def toolbox(output: str, ran: list[Any], rule: Any = None) -> Toolbox:
    async def act(args: dict[str, Any]) -> str:
        ran.append(args)
        return output

    return Toolbox([Tool("act", "", ToolKind.READ, {"x": int}, act, rule)])


async def test_oversized_tool_output_is_cut_with_a_marker_before_hooks_see_it() -> None:
    seen: list[int] = []

    from tests.remote_hooks import Scripted

    class Measure(Scripted):
        async def post_tool_use(self, ctx: Any) -> Any:
            seen.append(len(ctx.output_content))
            return CONTINUE

    registry = HookRegistry(HookSettings(max_output_chars=1000))
    registry.add(Measure(HookConfig(name="Measure")))
    result = await ToolExecutor(registry, toolbox("x" * 5000, [])).execute_parallel(
        "s", [call("act", x=1)], step=1
    )
    content = result.messages[0].content
    assert content.startswith("x" * 1000) and "4000 more characters cut" in content
    assert seen and seen[0] < 1100


async def test_an_oversized_context_is_refused_not_sent_whatever_the_policy(
    bus_settings: BusSettings, procs: Processes
) -> None:
    """No hook could be shown a 2 MB context: blocked with the limit named (even though the
    only hook's policy is "ignore"), nothing sent to the hook, the refusal dead-lettered."""
    procs.scripted(bus_settings, HookConfig(name="Lenient", failure_policy="ignore"))
    async with HookClient(bus_settings, HookSettings(hook_timeout_secs=5)) as client:
        await wait_live(client, "Lenient")
        huge = PreToolUseContext(session_id="s", tool_name="t", tool_args={"blob": "y" * 2_000_000})
        result = await client.run_pre_tool_use(huge)
        assert result.is_blocked
        assert "over the 1032192-byte limit (MAX_CONTEXT_BYTES)" in result.action.reason
        assert result.final_args == {} and client.stats["refused"] == 1
        await client.drain(timeout=5)
        letters = await client.redis.xrange(client.keys.dlq)  # the coordinators' unit
        assert [(f[b"event"], f[b"source"]) for _, f in letters] == [
            (b"PreToolUse", client.keys.event_partitions[0].encode())
        ]
        assert b"MAX_CONTEXT_BYTES" in letters[0][1][b"reason"]
        assert await client.redis.xlen(client.keys.requests("Lenient")) == 0
        assert await client.redis.xlen(client.keys.event_partitions[0]) == 0


PRE_ANSWERS = [
    CONTINUE,
    Block(reason="b"),
    MutateInput(updated_args={"x": 2}),
    PermissionRequired(permission="p", tool_name="act"),
]
PERM_ANSWERS = [
    CONTINUE,
    InjectContext(context="c"),
    *(Override(decision=d, reason="r") for d in PermissionDecision),
]


async def test_no_hook_reply_lifts_a_p0_to_p2_deny_over_the_wire(
    bus_settings: BusSettings, procs: Processes
) -> None:
    """48 generated cases: three hook services answer every mix of actions and Overrides
    (including Override(Allow) from all three) to a call a rule denies at P0, P1 or P2."""
    for i in range(3):
        procs.worker(
            bus_settings, "tests.remote_hooks:FromRedis", f"h{i}", HOOKBUS_TEST_NAME=f"h{i}"
        )
    key = f"{bus_settings.prefix}:test:answers"
    deny = PermissionRule.parse("act", "Deny", reason="locked")
    rng = random.Random(7)
    cases = [
        (level, [(rng.choice(PRE_ANSWERS), rng.choice(PERM_ANSWERS)) for _ in range(3)])
        for level in ("checker", "tool", "session")
        for _ in range(15)
    ] + [(level, [(CONTINUE, Override(decision=PermissionDecision.ALLOW))] * 3)
         for level in ("checker", "tool", "session")]  # fmt: skip

    async def yes(*_: Any) -> bool:
        return True

    async with HookClient(bus_settings, HookSettings(hook_timeout_secs=5)) as client:
        await wait_live(client, "h0", "h1", "h2")
        for level, answers in cases:
            async with client.redis.pipeline(transaction=False) as pipe:
                for i, (pre, perm) in enumerate(answers):
                    pipe.hset(key, f"h{i}:PreToolUse", msgspec.json.encode(pre))
                    pipe.hset(key, f"h{i}:PermissionRequest", msgspec.json.encode(perm))
                await pipe.execute()

            def rule(args: Any, level: str = level) -> Any:
                return Verdict(PermissionDecision.DENY, "tool rule") if level == "tool" else None

            ran: list[Any] = []
            executor = ToolExecutor(
                client,
                toolbox("done", ran, rule),
                checker=PermissionChecker([deny]) if level == "checker" else None,
                session_checker=PermissionChecker([deny]) if level == "session" else None,
                approver=yes,
            )
            result = await executor.execute_parallel("s", [call("act", x=1)], step=1)
            assert ran == [], (level, answers)
            assert result.denials[0].level == {"checker": 0, "tool": 1, "session": 2}[level]


async def test_a_repeated_failure_is_logged_once_per_interval_with_its_count(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The first of a kind at once, with its traceback; the rest as one line with the count
    when the interval ends; another kind on its own line; never a second traceback."""
    logger = logging.getLogger("test.ratelog")
    failures = RateLimitedLog(logger, interval=0.2)
    with caplog.at_level(logging.WARNING, "test.ratelog"):
        for i in range(400):
            try:
                raise RecursionError(f"poison {i}")
            except RecursionError as exc:
                failures.error("entry %d dead-lettered: %s", i, exc, exc_info=True)
        failures.warning("another kind %d", 1)
        await wait_for(lambda: len(caplog.records) == 3, timeout=5, what="the count line")
        first, other, count = caplog.records
        assert first.getMessage() == "entry 0 dead-lettered: poison 0" and first.exc_info
        assert other.getMessage() == "another kind 1"
        assert count.getMessage().startswith(
            "entry 399 dead-lettered: poison 399 (399 times in the last"
        )
        assert not count.exc_info
