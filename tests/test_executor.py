"""The executor's permission pipeline with real hooks: approver sources, overrides, denies."""

from __future__ import annotations

import asyncio
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent_adapter.executor import ToolExecutor
from agent_adapter.llm import call
from agent_adapter.permissions import PermissionChecker, PermissionRule, ToolKind
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
    PermissionDenialSource,
    PermissionRequired,
)
from tests.hooks_for_tests import Recorder


def toolbox(ran: list[dict[str, Any]], rule: Any = None) -> Toolbox:
    async def act(args: dict[str, Any]) -> str:
        ran.append(args)
        return "done"

    return Toolbox([Tool("act", "does it", ToolKind.EXEC, {"x": int}, act, rule)])


def registry(*hooks: Recorder) -> HookRegistry:
    reg = HookRegistry(HookSettings())
    for h in hooks:
        reg.add(h)
    return reg


async def run(executor: ToolExecutor) -> Any:
    result = await executor.execute_parallel("s1", [call("act", x=1)], step=1)
    await executor.hooks.drain()
    return result


async def test_ask_goes_to_the_approver_and_its_answer_sets_the_source() -> None:
    checker = PermissionChecker([PermissionRule.parse("act", "Ask", reason="confirm")])
    for answer, source, runs in [
        (True, None, 1),
        (False, PermissionDenialSource.USER, 0),
        (None, PermissionDenialSource.TIMEOUT, 0),
    ]:
        ran: list[dict[str, Any]] = []

        async def approver(tool: str, args: Any, reason: str, answer: Any = answer) -> Any:
            return answer

        ex = ToolExecutor(registry(), toolbox(ran), checker=checker, approver=approver)
        result = await run(ex)
        assert len(ran) == runs
        assert [d.source for d in result.denials] == ([source] if source else [])


async def test_no_approver_means_ask_times_out_as_deny_and_permission_denied_fires() -> None:
    denied = Recorder("Denied")
    ran: list[dict[str, Any]] = []
    ex = ToolExecutor(
        registry(denied, Recorder("Req", PermissionRequired(permission="p", tool_name="act"))),
        toolbox(ran),
    )
    result = await run(ex)
    assert ran == [] and result.denials[0].source == PermissionDenialSource.TIMEOUT
    assert result.denials[0].level == 4  # hook PermissionRequired escalated Allow to Ask
    assert any(e.value == "PermissionDenied" for e, _ in denied.calls)


async def test_override_allow_lifts_a_hook_block_but_never_a_rule_deny() -> None:
    allow = Recorder("Allow", Override(decision=PermissionDecision.ALLOW, reason="trusted"))
    ran: list[dict[str, Any]] = []
    ex = ToolExecutor(registry(Recorder("B", Block(reason="hook says no")), allow), toolbox(ran))
    await run(ex)
    assert ran == [{"x": 1}]  # P3 may be lifted by a PermissionRequest Override
    ran.clear()
    deny = PermissionChecker([PermissionRule.parse("act", "Deny", reason="never")])
    ex = ToolExecutor(registry(allow), toolbox(ran), checker=deny)
    result = await run(ex)
    assert ran == [] and result.denials[0].level == 0


async def test_final_args_from_pre_tool_use_reach_the_tool_and_contexts_come_back() -> None:
    ran: list[dict[str, Any]] = []
    mutate = Recorder("M", MutateInput(updated_args={"x": 7}, additional_context="x fixed"))
    inject = Recorder("I", InjectContext(context="be careful"))
    result = await run(ToolExecutor(registry(mutate, inject), toolbox(ran)))
    assert ran == [{"x": 7}]
    assert [c.render() for c in result.hook_contexts] == [
        "[Hook: M | PreToolUse] x fixed",
        "[Hook: I | PermissionRequest] be careful",
    ]


pre_actions = st.sampled_from(
    [
        CONTINUE,
        Block(reason="b"),
        MutateInput(updated_args={"x": 2}),
        PermissionRequired(permission="p", tool_name="act"),
    ]
)
perm_actions = st.one_of(
    st.just(CONTINUE),
    st.builds(Override, decision=st.sampled_from(list(PermissionDecision)), reason=st.just("r")),
    st.just(InjectContext(context="c")),
)
levels = st.sampled_from(["checker", "tool", "session"])


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    level=levels,
    hooks=st.lists(st.tuples(pre_actions, perm_actions, st.integers(-2, 2)), max_size=5),
)
def test_no_hook_lifts_a_p0_to_p2_deny(level: str, hooks: list[Any]) -> None:
    """Whatever the hooks answer, a Deny from the checker, a tool rule or the session stands."""
    deny = PermissionRule.parse("act", "Deny", reason="locked")
    checker = PermissionChecker([deny]) if level == "checker" else None
    session = PermissionChecker([deny]) if level == "session" else None

    def tool_rule(args: Any) -> Any:
        from agent_adapter.permissions import Verdict

        return Verdict(PermissionDecision.DENY, "tool rule") if level == "tool" else None

    class Both(Recorder):
        async def on_permission_request(self, ctx: Any) -> Any:
            return self.perm

    reg = registry(
        *(Both(f"h{i}", pre, perm=perm, priority=p) for i, (pre, perm, p) in enumerate(hooks))
    )
    ran: list[dict[str, Any]] = []

    async def yes(*_: Any) -> bool:
        return True

    ex = ToolExecutor(
        reg, toolbox(ran, tool_rule), checker=checker, session_checker=session, approver=yes
    )
    result = asyncio.run(run(ex))
    assert ran == []
    assert result.denials[0].level == {"checker": 0, "tool": 1, "session": 2}[level]
    assert result.messages[0].content.startswith("Permission denied")
