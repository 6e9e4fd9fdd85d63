"""Hypothesis properties of dispatch + aggregation (embedded mode).

* The aggregated result does not depend on the order in which hooks finish.
* "Last MutateInput wins" and "first Override wins" follow hook order (priority, registration).
* A hook that times out or raises never fails a dispatch unless its policy is ``fail``.
"""

from __future__ import annotations

import asyncio
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bus import (
    CONTINUE,
    Block,
    HookEvent,
    HookRegistry,
    HookSettings,
    InjectContext,
    MutateInput,
    Override,
    PermissionDecision,
    PermissionRequestContext,
    PermissionRequired,
    PostToolUseContext,
    PreToolUseContext,
    PreToolUseResult,
)
from tests.hooks_for_tests import Recorder

PROPS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

pre_actions = st.one_of(
    st.just(CONTINUE),
    st.builds(Block, reason=st.sampled_from(["a", "b", "c"])),
    st.builds(
        MutateInput,
        updated_args=st.dictionaries(st.sampled_from("xyz"), st.integers(0, 9), max_size=2),
        additional_context=st.one_of(st.none(), st.sampled_from(["ctx1", "ctx2"])),
    ),
    st.builds(PermissionRequired, permission=st.just("p"), tool_name=st.just("t")),
)
perm_actions = st.one_of(
    st.just(CONTINUE),
    st.builds(Override, decision=st.sampled_from(list(PermissionDecision)), reason=st.just("r")),
    st.builds(InjectContext, context=st.sampled_from(["i1", "i2"])),
)

CTX = PreToolUseContext(session_id="s", tool_name="tool", tool_args={"orig": 1})


def comparable(r: PreToolUseResult) -> tuple[Any, ...]:
    tags = [(t.hook_name, t.content) for t in r.tagged_contexts]
    return (r.action, r.final_args, r.blocking_errors, r.additional_contexts, tags, r.skipped)


class Gated(Recorder):
    """Answers only when its gate opens, so the test controls the completion order."""

    def __init__(self, name: str, action: Any, gate: asyncio.Event, **attrs: Any) -> None:
        super().__init__(name, action, **attrs)
        self.gate = gate

    async def pre_tool_use(self, ctx: PreToolUseContext) -> Any:
        await self.gate.wait()
        return self.action


@PROPS
@given(actions=st.lists(pre_actions, min_size=1, max_size=6), data=st.data())
def test_result_does_not_depend_on_completion_order(actions: list[Any], data: Any) -> None:
    release = data.draw(st.permutations(range(len(actions))))

    async def scenario() -> tuple[PreToolUseResult, PreToolUseResult]:
        gates = [asyncio.Event() for _ in actions]
        gated = HookRegistry(HookSettings())
        instant = HookRegistry(HookSettings())
        for i, action in enumerate(actions):
            gated.add(Gated(f"h{i}", action, gates[i]))
            instant.add(Recorder(f"h{i}", action))
        dispatch = asyncio.ensure_future(gated.run_pre_tool_use(CTX))
        for i in release:
            await asyncio.sleep(0)
            gates[i].set()
        return await dispatch, await instant.run_pre_tool_use(CTX)

    shuffled, ordered = asyncio.run(scenario())
    assert comparable(shuffled) == comparable(ordered)


@PROPS
@given(hooks=st.lists(st.tuples(pre_actions, st.integers(-3, 3)), min_size=1, max_size=6))
def test_last_mutate_input_wins_in_hook_order(hooks: list[tuple[Any, int]]) -> None:
    async def scenario() -> PreToolUseResult:
        reg = HookRegistry(HookSettings())
        for i, (action, priority) in enumerate(hooks):
            reg.add(Recorder(f"h{i}", action, priority=priority))
        return await reg.run_pre_tool_use(CTX)

    result = asyncio.run(scenario())
    order = sorted(range(len(hooks)), key=lambda i: (hooks[i][1], i))
    mutations = [hooks[i][0] for i in order if isinstance(hooks[i][0], MutateInput)]
    expected = mutations[-1].updated_args if mutations else CTX.tool_args
    assert result.final_args == expected
    blocks = [f"h{i}" for i in order if isinstance(hooks[i][0], Block)]
    assert [b.hook_name for b in result.blocking_errors] == blocks
    assert result.is_blocked == bool(blocks)


@PROPS
@given(
    hooks=st.lists(st.tuples(perm_actions, st.integers(-3, 3)), min_size=1, max_size=6),
    data=st.data(),
)
def test_first_override_wins_in_hook_order(hooks: list[tuple[Any, int]], data: Any) -> None:
    release = data.draw(st.permutations(range(len(hooks))))

    class GatedPerm(Gated):
        async def on_permission_request(self, ctx: PermissionRequestContext) -> Any:
            await self.gate.wait()
            return self.action

    async def scenario() -> Any:
        gates = [asyncio.Event() for _ in hooks]
        reg = HookRegistry(HookSettings())
        for i, (action, priority) in enumerate(hooks):
            reg.add(GatedPerm(f"h{i}", action, gates[i], priority=priority))
        ctx = PermissionRequestContext(session_id="s", tool_name="t")
        dispatch = asyncio.ensure_future(reg.run_on_permission_request(ctx))
        for i in release:
            await asyncio.sleep(0)
            gates[i].set()
        return await dispatch

    result = asyncio.run(scenario())
    order = sorted(range(len(hooks)), key=lambda i: (hooks[i][1], i))
    overrides = [i for i in order if isinstance(hooks[i][0], Override)]
    if overrides:
        assert result.action == hooks[overrides[0]][0]
        assert result.overridden_by == f"h{overrides[0]}"
    else:
        assert result.action == CONTINUE
    injected = [hooks[i][0].context for i in order if isinstance(hooks[i][0], InjectContext)]
    assert list(result.additional_contexts) == injected


modes = st.sampled_from(["ok", "raise", "timeout"])


@PROPS
@given(hooks=st.lists(st.tuples(modes, st.sampled_from(["ignore", "fail"])), max_size=5))
def test_failures_never_fail_a_dispatch_unless_policy_is_fail(
    hooks: list[tuple[str, str]],
) -> None:
    forever = asyncio.Event()

    class Flaky(Recorder):
        async def pre_tool_use(self, ctx: PreToolUseContext) -> Any:
            if self.mode == "raise":
                raise ValueError("flaky")
            if self.mode == "timeout":
                await forever.wait()
            return CONTINUE

    async def scenario() -> PreToolUseResult:
        reg = HookRegistry(HookSettings(hook_timeout_secs=0.01))
        for i, (mode, policy) in enumerate(hooks):
            reg.add(Flaky(f"h{i}", mode=mode, failure_policy=policy))
        return await reg.run_pre_tool_use(CTX)

    result = asyncio.run(scenario())
    failed = [(f"h{i}", p) for i, (m, p) in enumerate(hooks) if m != "ok"]
    assert [s.hook_name for s in result.skipped] == [name for name, _ in failed]
    enforcing = [name for name, p in failed if p == "fail"]
    assert result.is_blocked == bool(enforcing)
    assert [b.hook_name for b in result.blocking_errors] == enforcing


DEPTHS = st.one_of(
    st.integers(1, 200), st.sampled_from([62, 63, 64, 65, 126, 127, 980, 1_000, 10_000, 100_000])
)


class Allows(Recorder):
    """Allows every permission request; continues otherwise."""

    async def _answer(self, event: HookEvent, ctx: Any) -> Any:
        self.calls.append((event, ctx))
        return self.action if event == HookEvent.PERMISSION_REQUEST else CONTINUE


def nested(depth: int) -> Any:
    """``[[…[]…]]``, ``depth`` arrays deep (built without recursion)."""
    value: list[Any] = []
    for _ in range(depth - 1):
        value = [value]
    return value


@PROPS
@given(
    depth=DEPTHS,
    policies=st.lists(st.sampled_from(["ignore", "fail"]), max_size=3),
    modes=st.lists(st.sampled_from(["enforce", "warn", "dryrun"]), min_size=3, max_size=3),
)
def test_input_no_hook_could_inspect_is_never_approved(
    depth: int, policies: list[str], modes: list[str]
) -> None:
    """Tool arguments nested 1 to 100,000 levels: within MAX_CONTEXT_DEPTH (64, so 62 inside
    ``tool_args``) the hooks decide — here they all allow; past it PreToolUse is Blocked and
    PermissionRequest Denied whatever the hooks' policies and modes, and no hook is called.
    Tool output nested as deep is text, and always reaches the hooks."""
    allow = Override(decision=PermissionDecision.ALLOW, reason="ok")

    async def scenario() -> tuple[Any, Any, Any, list[Recorder]]:
        reg = HookRegistry(HookSettings())
        hooks: list[Recorder] = [
            Allows(f"h{i}", allow, failure_policy=p, enforcement=modes[i])
            for i, p in enumerate(policies)
        ]
        for h in hooks:
            reg.add(h)
        args = {"v": nested(depth)}
        pre = await reg.run_pre_tool_use(
            PreToolUseContext(session_id="s", tool_name="t", tool_args=args)
        )
        perm = await reg.run_on_permission_request(
            PermissionRequestContext(session_id="s", tool_name="t", tool_args=args)
        )
        text = "[" * depth + "]" * depth
        post = await reg.run_post_tool_use(
            PostToolUseContext(session_id="s", tool_name="t", output_content=text[:100_000])
        )
        return pre, perm, post, hooks

    pre, perm, post, hooks = asyncio.run(scenario())
    over = depth + 2 > 64  # the context is level 1, tool_args level 2
    assert pre.is_blocked == over
    assert (getattr(perm.action, "decision", None) == PermissionDecision.DENY) == over
    if over:
        assert "(MAX_CONTEXT_DEPTH)" in pre.action.reason and perm.overridden_by == "HookBus"
        assert all([e for e, _ in h.calls] == [HookEvent.POST_TOOL_USE] for h in hooks)
    else:  # the hooks decided: all allow (or, not enforcing, were not applied)
        assert perm.action in (allow, CONTINUE)
        assert all(len(h.calls) == 3 for h in hooks)
    assert post.final_content.startswith("[" * min(depth, 1000))
