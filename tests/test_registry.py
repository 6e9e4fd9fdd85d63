"""HookRegistry (embedded mode) against the specification's test table.

Specification test → test here:

* test_hook_registry_runs_all_hooks            → test_hook_registry_runs_all_hooks
* test_blocking_hook_stops_chain               → test_blocking_hook_stops_chain
* test_mutate_input_accumulates_context        → test_mutate_input_accumulates_context
* test_post_tool_use_mutate_output             → test_post_tool_use_mutate_output
* test_session_start_hook_called               → test_session_start_hook_called
* test_new_lifecycle_events_called             → test_new_lifecycle_events_called
* test_match_filter_skips_irrelevant           → test_match_filter_skips_irrelevant
* test_full_hook_pipeline_integration          → test_full_hook_pipeline_integration
* test_async_hook_dispatch                     → test_async_hook_dispatch
* test_permission_request_override             → test_permission_request_override
* test_permission_request_continue             → test_permission_request_continue
* test_permission_denied_fire_and_forget       → test_permission_denied_fire_and_forget
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from bus import (
    CONTINUE,
    Block,
    ConfigError,
    ContextTypeError,
    HookEvent,
    HookRegistry,
    HookSettings,
    InjectContext,
    Metadata,
    MutateInput,
    MutateOutput,
    Override,
    PermissionDecision,
    PermissionDenialSource,
    PermissionDeniedContext,
    PermissionRequestContext,
    PermissionRequired,
    PostCompactContext,
    PostToolUseContext,
    PostToolUseFailureContext,
    PreCompactContext,
    PreToolUseContext,
    SessionStartContext,
    SessionStopContext,
    StepCompleteContext,
    SubagentStartContext,
    SubagentStopContext,
    ToolMatchFilter,
    UnknownEventError,
    Warn,
)
from bus.aggregation import Outcome
from bus.dispatch import local_call, start_local
from bus.hooks import spec_of
from tests.hooks_for_tests import AsyncRecorder, Recorder

PRE = HookEvent.PRE_TOOL_USE


def pre(tool: str = "file_read", **args: object) -> PreToolUseContext:
    return PreToolUseContext(session_id="s1", tool_name=tool, tool_args=dict(args), step=1)


def post(tool: str = "file_read", output: str = "out") -> PostToolUseContext:
    return PostToolUseContext(session_id="s1", tool_name=tool, output_content=output, step=1)


def registry(*hooks: Recorder, **settings: float) -> HookRegistry:
    reg = HookRegistry(HookSettings(**settings))  # type: ignore[arg-type]
    for h in hooks:
        reg.add(h)
    return reg


async def test_hook_registry_runs_all_hooks() -> None:
    hooks = [Recorder(f"h{i}") for i in range(3)]
    result = await registry(*hooks).run_pre_tool_use(pre())
    assert [len(h.calls) for h in hooks] == [1, 1, 1]
    assert result.action.__class__.__name__ == "Continue"
    assert result.final_args == {}


async def test_blocking_hook_stops_chain() -> None:
    a = Recorder("a", Block(reason="no"))
    b = Recorder("b", Block(reason="never"))
    c = Recorder("c")
    result = await registry(a, b, c).run_pre_tool_use(pre())
    assert isinstance(result.action, Block) and result.action.reason == "no"
    assert [(e.hook_name, e.reason) for e in result.blocking_errors] == [
        ("a", "no"),
        ("b", "never"),
    ]
    assert result.is_blocked


async def test_block_outranks_permission_required_outranks_mutate() -> None:
    m = Recorder("m", MutateInput(updated_args={"x": 1}))
    p = Recorder("p", PermissionRequired(permission="shell", tool_name="run_bash"))
    b = Recorder("b", Block(reason="stop"))
    assert isinstance((await registry(m, p).run_pre_tool_use(pre())).action, PermissionRequired)
    assert isinstance((await registry(m, p, b).run_pre_tool_use(pre())).action, Block)
    result = await registry(m).run_pre_tool_use(pre())
    assert result.action == MutateInput(updated_args={"x": 1})


async def test_mutate_input_accumulates_context() -> None:
    a = Recorder("a", MutateInput(updated_args={"path": "/a"}, additional_context="from a"))
    b = Recorder("b", MutateInput(updated_args={"path": "/b"}, additional_context="from b"))
    result = await registry(a, b).run_pre_tool_use(pre(path="/orig"))
    assert result.final_args == {"path": "/b"}  # last in hook order wins
    assert result.additional_contexts == ("from a", "from b")
    assert result.additional_context == "from a\nfrom b"
    assert [t.render() for t in result.tagged_contexts] == [
        "[Hook: a | PreToolUse] from a",
        "[Hook: b | PreToolUse] from b",
    ]


async def test_priority_orders_last_wins_regardless_of_registration() -> None:
    late = Recorder("late", MutateInput(updated_args={"v": "late"}), priority=10)
    early = Recorder("early", MutateInput(updated_args={"v": "early"}), priority=-5)
    result = await registry(late, early).run_pre_tool_use(pre())
    assert result.final_args == {"v": "late"}


async def test_post_tool_use_mutate_output() -> None:
    a = Recorder("a", MutateOutput(updated_content="first", additional_context="note"))
    b = Recorder("b", MutateOutput(updated_content="second"))
    result = await registry(a, b).run_post_tool_use(post(output="raw"))
    assert result.final_content == "second"
    assert result.additional_contexts == ("note",)
    assert result.tagged_contexts[0].render() == "[Hook: a | PostToolUse] note"


async def test_post_tool_use_keeps_warnings_metadata_and_permission_requests() -> None:
    hooks = [
        Recorder("w", Warn(message="big output", truncate_output=True)),
        Recorder("m1", Metadata(key="k", value=1)),
        Recorder("m2", Metadata(key="k", value=2)),
        Recorder("m3", Metadata(key="j", value={"a": [1]})),
        Recorder("p", PermissionRequired(permission="net", tool_name="fetch")),
    ]
    reg = registry(*hooks, truncate_chars=5)
    result = await reg.run_post_tool_use(post(output="0123456789"))
    assert result.warnings == ("big output",)
    assert result.metadata == {"k": 2, "j": {"a": [1]}}
    assert result.post_permission_requests == (("net", "fetch"),)
    assert result.final_content.startswith("01234") and "truncated" in result.final_content
    assert result.tagged_contexts[0].render() == "[Hook: w | PostToolUse] Warning: big output"


async def test_post_tool_use_failure_mutates_error_output() -> None:
    h = Recorder("fix", MutateOutput(updated_content="try another tool"))
    ctx = PostToolUseFailureContext(session_id="s1", tool_name="t", error_message="boom")
    result = await registry(h).run_on_post_tool_use_failure(ctx)
    assert result.final_content == "try another tool"
    plain = await registry(Recorder("x")).run_on_post_tool_use_failure(ctx)
    assert plain.final_content == "boom"


async def test_session_start_hook_called() -> None:
    h = Recorder("s", events=(HookEvent.ON_SESSION_START,))
    other = Recorder("o", events=(PRE,))
    reg = registry(h, other)
    result = await reg.run_on_session_start(SessionStartContext(session_id="s1", turn_index=2))
    assert result.called == ("s",)
    assert [e for e, _ in h.calls] == [HookEvent.ON_SESSION_START]
    assert other.calls == []


async def test_new_lifecycle_events_called() -> None:
    h = Recorder("all")
    reg = registry(h)
    await reg.run_on_subagent_start(SubagentStartContext(parent_session_id="s1", subagent_name="r"))
    await reg.run_on_subagent_stop(SubagentStopContext(parent_session_id="s1", subagent_name="r"))
    await reg.run_on_pre_compact(PreCompactContext(session_id="s1", message_count=40))
    await reg.run_on_post_compact(PostCompactContext(session_id="s1", new_message_count=5))
    await reg.run_on_step_complete(StepCompleteContext(session_id="s1", step=1, max_steps=9))
    assert [e for e, _ in h.calls] == [
        HookEvent.ON_SUBAGENT_START,
        HookEvent.ON_SUBAGENT_STOP,
        HookEvent.ON_PRE_COMPACT,
        HookEvent.ON_POST_COMPACT,
        HookEvent.ON_STEP_COMPLETE,
    ]


async def test_match_filter_skips_irrelevant() -> None:
    files = Recorder("files", Block(reason="x"), match_filter=ToolMatchFilter.prefix("file_"))
    env = Recorder(
        "env", Block(reason="env"), match_filter=ToolMatchFilter.parse(["file_*"], ["path:.env"])
    )
    reg = registry(files, env)
    result = await reg.run_pre_tool_use(pre("search_papers", path=".env"))
    assert files.calls == [] and env.calls == [] and not result.is_blocked
    result = await reg.run_pre_tool_use(pre("file_read", path="main.py"))
    assert len(files.calls) == 1 and env.calls == []
    result = await reg.run_pre_tool_use(pre("file_read", path="/app/.env"))
    assert [e.hook_name for e in result.blocking_errors] == ["files", "env"]


async def test_match_filter_does_not_apply_to_non_tool_events() -> None:
    h = Recorder("h", match_filter=ToolMatchFilter.exact("nothing"))
    await registry(h).run_on_step_complete(StepCompleteContext(session_id="s", step=1, max_steps=2))
    assert len(h.calls) == 1


async def test_full_hook_pipeline_integration() -> None:
    """match_filter + TaggedContext + Warning + Metadata through one pre and one post dispatch."""
    rewrite = Recorder(
        "Rewrite",
        MutateInput(updated_args={"path": "/safe/a.txt"}, additional_context="path rewritten"),
        events=(PRE,),
        match_filter=ToolMatchFilter.prefix("file_"),
    )
    warn = Recorder(
        "Warner",
        Warn(message="output mentions a secret"),
        events=(HookEvent.POST_TOOL_USE,),
        match_filter=ToolMatchFilter.parse(["file_*"], ["path:/safe"]),
    )
    meta = Recorder("Meta", Metadata(key="bytes", value=4), events=(HookEvent.POST_TOOL_USE,))
    ignored = Recorder("Search", Block(reason="no"), match_filter=ToolMatchFilter.exact("search"))
    reg = registry(rewrite, warn, meta, ignored)

    pre_result = await reg.run_pre_tool_use(pre("file_read", path="/etc/passwd"))
    assert pre_result.final_args == {"path": "/safe/a.txt"}
    assert not pre_result.is_blocked
    ctx = PostToolUseContext(
        session_id="s1",
        tool_name="file_read",
        tool_args=pre_result.final_args,
        output_content="data",
    )
    post_result = await reg.run_post_tool_use(ctx)
    assert post_result.warnings == ("output mentions a secret",)
    assert post_result.metadata == {"bytes": 4}
    rendered = [t.render() for t in pre_result.tagged_contexts + post_result.tagged_contexts]
    assert rendered == [
        "[Hook: Rewrite | PreToolUse] path rewritten",
        "[Hook: Warner | PostToolUse] Warning: output mentions a secret",
    ]
    assert ignored.calls == []


async def test_session_hooks_answer_only_for_their_session_and_skip_match_filter() -> None:
    reg = registry()
    h = Recorder("temp", Block(reason="session says no"), match_filter=ToolMatchFilter.exact("x"))
    reg.add_session_hook("s1", h)
    assert (await reg.run_pre_tool_use(pre("anything"))).is_blocked
    other = PreToolUseContext(session_id="s2", tool_name="anything")
    assert not (await reg.run_pre_tool_use(other)).is_blocked
    assert reg.remove_session_hook("s1", "temp") is True
    assert reg.remove_session_hook("s1", "temp") is False
    assert not (await reg.run_pre_tool_use(pre("anything"))).is_blocked


async def test_session_hooks_cleared_by_clear_and_by_session_stop() -> None:
    reg = registry()
    reg.add_session_hook("s1", Recorder("a"))
    reg.add_session_hook("s1", Recorder("b"))
    with pytest.raises(ConfigError):
        reg.add_session_hook("s1", Recorder("a"))
    reg.clear_session_hooks("s1")
    assert reg.session_hook_names("s1") == []
    reg.add_session_hook("s1", Recorder("c"))
    await reg.run_on_session_stop(SessionStopContext(session_id="s1"))
    assert reg.session_hook_names("s1") == []


async def test_session_stop_runs_hooks_in_order_one_at_a_time() -> None:
    log: list[str] = []

    class Step(Recorder):
        async def on_session_stop(self, ctx: SessionStopContext) -> None:
            log.append(f"{self.name}:start")
            await asyncio.sleep(0.01)
            log.append(f"{self.name}:end")

    reg = registry(Step("one"), Step("two"), Step("three"))
    await reg.run_on_session_stop(SessionStopContext(session_id="s1"))
    assert log == ["one:start", "one:end", "two:start", "two:end", "three:start", "three:end"]


async def test_hooks_of_one_event_run_in_parallel() -> None:
    running = 0
    peak = 0
    release = asyncio.Event()

    class Wait(Recorder):
        async def pre_tool_use(self, ctx: PreToolUseContext) -> None:
            nonlocal running, peak
            running += 1
            peak = max(peak, running)
            if peak == 3:
                release.set()
            await release.wait()
            running -= 1

    await registry(Wait("a"), Wait("b"), Wait("c"), hook_timeout_secs=5).run_pre_tool_use(pre())
    assert peak == 3


async def test_timed_out_hook_is_skipped_within_its_timeout_and_named() -> None:
    slow = Recorder("Slow", Block(reason="too late"), delay=5.0, timeout=0.2)
    fast = Recorder("Fast", MutateInput(updated_args={"ok": True}))
    t0 = time.monotonic()
    result = await registry(slow, fast).run_pre_tool_use(pre())
    elapsed = time.monotonic() - t0
    assert elapsed < 0.2 + 1.0  # the timeout plus a generous margin for a shared machine
    assert not result.is_blocked
    assert result.final_args == {"ok": True}
    [skip] = result.skipped
    assert (skip.hook_name, skip.kind, skip.enforced) == ("Slow", "timeout", False)
    assert "0.2" in skip.detail


async def test_default_timeout_comes_from_settings() -> None:
    slow = Recorder("Slow", delay=5.0)
    result = await registry(slow, hook_timeout_secs=0.1).run_pre_tool_use(pre())
    assert [s.kind for s in result.skipped] == ["timeout"]


def test_settings_read_hook_timeout_secs_from_env() -> None:
    assert HookSettings.from_env({"HOOK_TIMEOUT_SECS": "2.5"}).hook_timeout_secs == 2.5
    assert HookSettings.from_env({}).hook_timeout_secs == 30.0
    with pytest.raises(ConfigError, match="HOOK_TIMEOUT_SECS"):
        HookSettings.from_env({"HOOK_TIMEOUT_SECS": "soon"})
    with pytest.raises(ConfigError):
        HookSettings.from_env({"HOOK_TIMEOUT_SECS": "-1"})


async def test_raising_hook_is_skipped_and_named() -> None:
    bad = Recorder("Bad", raises=True)
    good = Recorder("Good", Block(reason="policy"))
    result = await registry(bad, good).run_pre_tool_use(pre())
    assert result.blocking_errors[0].hook_name == "Good"
    assert result.skipped[0].hook_name == "Bad" and "exploded" in result.skipped[0].detail


async def test_fail_policy_turns_timeout_into_block_naming_the_hook() -> None:
    strict = Recorder("Strict", delay=5.0, timeout=0.05, failure_policy="fail")
    result = await registry(strict).run_pre_tool_use(pre())
    assert isinstance(result.action, Block)
    assert "Strict" in result.action.reason and "timed out" in result.action.reason
    assert result.skipped[0].enforced


async def test_fail_policy_turns_error_into_deny_that_no_override_lifts() -> None:
    allow = Recorder("Allow", Override(decision=PermissionDecision.ALLOW, reason="fine"))
    strict = Recorder("Strict", raises=True, failure_policy="fail")
    ctx = PermissionRequestContext(session_id="s1", tool_name="run_bash")
    result = await registry(allow, strict).run_on_permission_request(ctx)
    assert isinstance(result.action, Override)
    assert result.action.decision == PermissionDecision.DENY
    assert result.overridden_by == "Strict" and "Strict" in result.action.reason


async def test_fail_policy_on_notification_event_is_only_recorded() -> None:
    strict = Recorder("Strict", raises=True, failure_policy="fail")
    result = await registry(strict).run_on_step_complete(
        StepCompleteContext(session_id="s", step=1, max_steps=2)
    )
    assert result.skipped[0].hook_name == "Strict" and not result.skipped[0].enforced


async def test_wrong_answer_type_is_a_failure() -> None:
    confused = Recorder("Confused", Override(decision=PermissionDecision.ALLOW))
    result = await registry(confused).run_pre_tool_use(pre())
    assert result.skipped[0].kind == "error" and "Override" in result.skipped[0].detail


async def test_permission_request_override() -> None:
    first = Recorder("First", Override(decision=PermissionDecision.ASK, reason="3 denials"))
    ctx_hook = Recorder("Ctx", InjectContext(context="policy: ask for shell"))
    second = Recorder("Second", Override(decision=PermissionDecision.ALLOW, reason="ignored"))
    ctx = PermissionRequestContext(
        session_id="s1", tool_name="run_bash", current_decision=PermissionDecision.ALLOW
    )
    result = await registry(first, ctx_hook, second).run_on_permission_request(ctx)
    assert result.action == Override(decision=PermissionDecision.ASK, reason="3 denials")
    assert result.overridden_by == "First"
    assert len(second.calls) == 1  # later hooks still run; their Override is ignored
    assert result.additional_contexts == ("policy: ask for shell",)


async def test_permission_request_continue() -> None:
    ctx = PermissionRequestContext(session_id="s1", tool_name="file_read")
    result = await registry(Recorder("a"), Recorder("b")).run_on_permission_request(ctx)
    assert result.action.__class__.__name__ == "Continue"
    assert result.overridden_by is None


async def test_permission_denied_fire_and_forget() -> None:
    gate = asyncio.Event()

    class Slow(Recorder):
        async def on_permission_denied(self, ctx: PermissionDeniedContext) -> None:
            self.calls.append((HookEvent.PERMISSION_DENIED, ctx))
            await gate.wait()

    h = Slow("Auditor")
    reg = registry(h)
    ctx = PermissionDeniedContext(
        session_id="s1", tool_name="rm", reason="rule", source=PermissionDenialSource.RULE
    )
    assert await reg.run_on_permission_denied(ctx) is None  # returns before the hook finishes
    assert not gate.is_set()
    gate.set()
    await reg.drain()
    assert h.calls[0][1].source == PermissionDenialSource.RULE


async def test_async_hook_dispatch() -> None:
    gate = asyncio.Event()

    class Gated(AsyncRecorder):
        async def on_post_tool_use_async(self, ctx: PostToolUseContext) -> None:
            await gate.wait()
            await self._record(ctx)

    a = Gated("RemoteLogger", events=(HookEvent.POST_TOOL_USE,))
    reg = registry(Recorder("sync", MutateOutput(updated_content="x")))
    reg.add_async(a)
    result = await reg.run_post_tool_use(post())
    assert result.final_content == "x"  # answered while the async hook is still waiting
    assert a.seen == []
    gate.set()
    await asyncio.wait_for(a.done.wait(), 5)
    assert a.seen[0].tool_name == "file_read"
    await reg.run_on_step_complete(StepCompleteContext(session_id="s", step=1, max_steps=2))
    await reg.drain()
    assert len(a.seen) == 1  # not subscribed to OnStepComplete


async def test_a_subclass_that_fires_events_itself_is_called_for_every_event() -> None:
    # The hot path skips fire_async for an event without async hooks (HookRunner.fires), but
    # not a subclass's own fire_async (forwarding events elsewhere, say).
    fired: list[HookEvent] = []

    class Forwarding(HookRegistry):
        def fire_async(self, event: HookEvent, ctx: Any) -> None:
            fired.append(event)

    reg = Forwarding(HookSettings())
    reg.add(Recorder("Guard", events=(PRE,)))
    await reg.run_pre_tool_use(pre(path="a"))
    await reg.run_post_tool_use(post())
    assert fired == [PRE, HookEvent.POST_TOOL_USE]
    plain = registry(Recorder("Guard", events=(PRE,)))
    assert not plain.fires[PRE]  # no async hook: the call is skipped


async def test_async_hook_timeout_is_counted_not_raised() -> None:
    a = AsyncRecorder("Stuck", events=(HookEvent.POST_TOOL_USE,), delay=5)
    reg = registry(async_timeout_secs=0.05)
    reg.add_async(a)
    await reg.run_post_tool_use(post())
    await reg.drain()
    assert reg.async_failures == 1 and a.seen == []


async def test_wrong_context_type_is_a_clear_error() -> None:
    with pytest.raises(ContextTypeError, match="PreToolUse takes a PreToolUseContext"):
        await registry().run_pre_tool_use(post())  # type: ignore[arg-type]


def test_registration_errors_are_clear() -> None:
    reg = registry(Recorder("a"))
    with pytest.raises(ConfigError, match="already registered"):
        reg.add(Recorder("a"))
    with pytest.raises(ConfigError, match="add_async"):
        reg.add(AsyncRecorder("x"))  # type: ignore[arg-type]
    with pytest.raises(UnknownEventError, match="PreToolUze"):
        reg.add(Recorder("b", events=("PreToolUze",)))  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="timeout"):
        reg.add(Recorder("c", timeout=-1))
    with pytest.raises(ConfigError, match="failure_policy"):
        reg.add(Recorder("d", failure_policy="explode"))


def test_event_names_are_the_specifications() -> None:
    assert [e.value for e in HookEvent] == [
        "OnSessionStart",
        "PreToolUse",
        "PostToolUse",
        "PostToolUseFailure",
        "OnStepComplete",
        "OnSessionStop",
        "OnSubagentStart",
        "OnSubagentStop",
        "OnPreCompact",
        "OnPostCompact",
        "PermissionRequest",
        "PermissionDenied",
    ]
    assert HookEvent.parse("PreToolUse") is PRE
    with pytest.raises(UnknownEventError):
        HookEvent.parse("preToolUse")


async def test_hooks_that_answer_at_once_and_hooks_that_wait_mix_in_hook_order() -> None:
    started, release = asyncio.Event(), asyncio.Event()

    class Waits(Recorder):
        async def pre_tool_use(self, ctx: PreToolUseContext) -> Block:
            started.set()
            await release.wait()
            return Block(reason="waited")

    class Crashes(Recorder):
        async def pre_tool_use(self, ctx: PreToolUseContext) -> None:
            raise RuntimeError("boom")

    class Mutates(Recorder):
        async def pre_tool_use(self, ctx: PreToolUseContext) -> MutateInput:
            return MutateInput(updated_args={"path": "b"})

    reg = registry(Recorder("first"), Waits("waits"), Crashes("crashes"), Mutates("mutates"),
                   hook_timeout_secs=5)  # fmt: skip
    dispatch = asyncio.ensure_future(reg.gather(PRE, pre(path="a")))
    await asyncio.wait_for(started.wait(), 5)
    release.set()
    outcomes = await dispatch
    assert [o.spec.name for o in outcomes] == ["first", "waits", "crashes", "mutates"]
    assert outcomes[1].action == Block(reason="waited")
    assert outcomes[2].failure == "error" and "boom" in outcomes[2].detail
    assert outcomes[3].action == MutateInput(updated_args={"path": "b"})


async def test_a_hook_added_while_a_dispatch_waits_is_not_part_of_it() -> None:
    started, release = asyncio.Event(), asyncio.Event()

    class Waits(Recorder):
        async def pre_tool_use(self, ctx: PreToolUseContext) -> Block:
            started.set()
            await release.wait()
            return Block(reason="late")

    reg = registry(Waits("waits"), hook_timeout_secs=5)
    dispatch = asyncio.ensure_future(reg.run_pre_tool_use(pre()))
    await asyncio.wait_for(started.wait(), 5)
    reg.add(Recorder("earlier", priority=-10))  # would come first in hook order
    release.set()
    result = await dispatch
    assert result.action == Block(reason="late")
    assert [b.hook_name for b in result.blocking_errors] == ["waits"]
    assert [s.name for s in reg.specs(PRE)] == ["earlier", "waits"]


async def test_every_way_a_hook_can_end_is_judged_in_its_slot_when_hooks_suspend_between() -> None:
    # One dispatch calls its hooks through one driver until a hook suspends; that hook goes on
    # in a task and a new driver calls the hooks after it (bus/dispatch.py, start_local). Each
    # way a hook can end, before and after another suspended, lands in its own slot.
    release, all_waiting = asyncio.Event(), asyncio.Event()
    waiting: list[str] = []
    ran_on: list[str] = []

    async def wait(name: str) -> None:
        waiting.append(name)
        if len(waiting) == 3:
            all_waiting.set()
        await release.wait()

    class Waits(Recorder):
        async def pre_tool_use(self, ctx: PreToolUseContext) -> Block:
            await wait(self.name)
            return Block(reason=f"{self.name} waited")

    class WaitsThenCrashes(Recorder):
        async def pre_tool_use(self, ctx: PreToolUseContext) -> None:
            await wait(self.name)
            raise RuntimeError("boom after waiting")

    class HoldsTheLoopThenYields(Recorder):
        async def pre_tool_use(self, ctx: PreToolUseContext) -> Block:
            time.sleep(0.3)  # a blocking call in an async def, past its 0.1 s timeout
            await asyncio.sleep(0)
            ran_on.append("rest of holds")  # too late: this never runs
            return Block(reason="never")

    class Mutates(Recorder):
        async def pre_tool_use(self, ctx: PreToolUseContext) -> MutateInput:
            return MutateInput(updated_args={"path": "b"})

    hooks = [
        Recorder("first"),
        Waits("waits"),
        WaitsThenCrashes("crashes"),
        HoldsTheLoopThenYields("holds", timeout=0.1),
        Mutates("mutates"),
        Waits("waits too"),
    ]
    reg = registry(*hooks, hook_timeout_secs=5)
    dispatch = asyncio.ensure_future(reg.run_pre_tool_use(pre(path="a")))
    await asyncio.wait_for(all_waiting.wait(), 5)  # all three wait at once: none ran first
    release.set()
    result = await asyncio.wait_for(dispatch, 5)
    assert [b.hook_name for b in result.blocking_errors] == ["waits", "waits too"]
    assert result.blocking_errors[0].reason == "waits waited"
    skipped = {s.hook_name: (s.kind, s.detail) for s in result.skipped}
    assert skipped["crashes"][0] == "error" and "boom after waiting" in skipped["crashes"][1]
    assert skipped["holds"][0] == "timeout" and "held the event loop" in skipped["holds"][1]
    assert set(skipped) == {"crashes", "holds"}
    assert ran_on == []
    outcomes = await reg.gather(PRE, pre(path="a"))  # released: every hook answers in order
    assert [o.spec.name for o in outcomes] == [h.name for h in hooks]
    assert outcomes[4].action == MutateInput(updated_args={"path": "b"})


class Ends(Recorder):
    """Ends one way (``how``), with a 0.2 s timeout."""

    def __init__(self, how: str) -> None:
        super().__init__(how, timeout=0.2)
        self.how = how

    async def pre_tool_use(self, ctx: PreToolUseContext) -> Any:
        how = self.how
        if how.startswith("waits"):
            await asyncio.sleep(0)
        if how.endswith("past its timeout"):
            await asyncio.sleep(5)
        if how.endswith("raises"):
            raise RuntimeError(f"{how}!")
        if how.endswith("cancelled"):
            raise asyncio.CancelledError
        if how == "holds the loop":
            time.sleep(0.3)
        if how.endswith("mutates"):
            return MutateInput(updated_args={"path": "b"})
        if how.endswith("wrong answer"):
            return Override(decision="allow")
        return Block(reason=how) if how.endswith("blocks") else CONTINUE


ENDINGS = [
    "continues", "blocks", "mutates", "raises", "cancelled", "holds the loop", "wrong answer",
    "waits, continues", "waits, blocks", "waits, raises", "waits past its timeout",
    "waits, cancelled",
]  # fmt: skip


@pytest.mark.parametrize("how", ENDINGS)
async def test_a_lone_hook_is_judged_as_the_same_hook_beside_others(how: str) -> None:
    # A dispatch with one hook sends to it directly, without the driver that calls several
    # (bus/dispatch.py, start_local): both ways must judge every ending alike.
    def judged(outcome: Outcome) -> tuple[Any, ...]:
        return (outcome.action, outcome.failure, outcome.detail.split(" after ")[0][:30])

    alone = await registry(Ends(how)).gather(PRE, pre(path="a"))
    beside = await registry(Recorder("before"), Ends(how), Recorder("after")).gather(
        PRE, pre(path="a")
    )
    assert [judged(o) for o in alone] == [judged(beside[1])]
    expected_failure = {"raises": "error", "cancelled": "error", "holds the loop": "timeout",
                        "wrong answer": "error", "past its timeout": "timeout"}  # fmt: skip
    failure = next((f for end, f in expected_failure.items() if how.endswith(end)), None)
    assert alone[0].failure == failure, alone[0]
    result = await registry(Ends(how)).run_pre_tool_use(pre(path="a"))
    assert result.is_blocked == how.endswith("blocks")


async def test_a_method_raising_stop_iteration_is_a_crash_alone_as_beside_others() -> None:
    # A plain def (refused at load; assigned to the hook later, say) that raises StopIteration
    # carrying an answer must not pass for that answer, alone (no driver) or with others.
    def smuggles(ctx: Any) -> Any:
        raise StopIteration(Block(reason="smuggled"))

    lone = local_call(spec_of(Recorder("Smuggler", events=(PRE,))), smuggles)
    other = local_call(spec_of(Recorder("Other", events=(PRE,))), Recorder("Other").pre_tool_use)
    for calls in ([lone], [other, lone]):
        outcomes = start_local(PRE, pre(path="a"), calls, 5.0, calls=calls, timed=False)
        assert isinstance(outcomes, list)
        smuggled = outcomes[-1]
        assert smuggled.action is None and smuggled.failure == "error", smuggled
        assert "StopIteration" in smuggled.detail


async def test_session_stop_runs_hooks_that_answer_at_once_after_one_that_waits_in_order() -> None:
    log: list[str] = []

    class Step(Recorder):
        async def on_session_stop(self, ctx: SessionStopContext) -> None:
            log.append(f"{self.name}:start")
            if self.name == "two":
                await asyncio.sleep(0)
            log.append(f"{self.name}:end")

    reg = registry(Step("one"), Step("two"), Step("three"), Step("four"))
    await reg.run_on_session_stop(SessionStopContext(session_id="s1"))
    assert log == [f"{n}:{at}" for n in ("one", "two", "three", "four") for at in ("start", "end")]


async def test_a_hook_waiting_after_one_that_held_the_loop_counts_from_the_dispatch_start() -> None:
    # Deadlines count from the dispatch's start (bus/dispatch.py, run_targets' ``started``), not
    # from when a hook that suspends was reached: a hook that held the loop before it used up
    # the time of those after it, and a dispatch lasts no longer than its longest timeout. In
    # parallel (PreToolUse) and one at a time (SessionStop) alike.
    class Holds(Recorder):
        async def _answer(self, event: HookEvent, ctx: object) -> None:
            time.sleep(0.3)  # within its 0.5 s timeout

    class Waits(Recorder):
        async def _answer(self, event: HookEvent, ctx: object) -> None:
            await asyncio.Event().wait()  # never answers: times out at its deadline

    stop = SessionStopContext(session_id="s1")
    for event, ctx in ((PRE, pre()), (HookEvent.ON_SESSION_STOP, stop)):
        reg = registry(Holds("holds", timeout=0.5), Waits("waits", timeout=0.5))
        held, waited = await reg.gather(event, ctx)
        assert held.failure is None and waited.failure == "timeout"
        # 0.5 s after the dispatch began, the hold's 0.3 s included; not 0.5 s after the wait began
        assert held.elapsed + waited.elapsed < 0.5 + 0.15, (event, held.elapsed, waited.elapsed)


async def test_a_hook_raising_cancelled_error_before_it_waits_is_an_outcome() -> None:
    # A hook that awaits a future cancelled elsewhere raises CancelledError at once: its own
    # error, not a cancellation of the dispatch (which nothing can cancel in the middle of a
    # step). Suspended first, it was already an outcome; now at once too, and the hook that
    # waits before it is still answered, in its slot.
    release = asyncio.Event()

    class Waits(Recorder):
        async def pre_tool_use(self, ctx: PreToolUseContext) -> Block:
            await release.wait()
            return Block(reason="waited")

    class Cancelled(Recorder):
        async def pre_tool_use(self, ctx: PreToolUseContext) -> None:
            gone = asyncio.get_running_loop().create_future()
            gone.cancel()
            await gone

    reg = registry(Waits("waits"), Cancelled("cancelled"), Recorder("last"), hook_timeout_secs=5)
    dispatch = asyncio.ensure_future(reg.gather(PRE, pre()))
    await asyncio.sleep(0)  # the dispatch starts its hooks (they do not depend on it)
    release.set()
    waited, cancelled, last = await asyncio.wait_for(dispatch, 5)
    assert waited.action == Block(reason="waited")
    assert (cancelled.failure, cancelled.detail.split(":")[0]) == ("error", "CancelledError")
    assert last.failure is None


async def test_a_dispatch_cancelled_while_its_hooks_wait_leaves_no_hook_running() -> None:
    # The first hook that suspends is finished by the dispatch's own task, the hooks after it
    # by a task of their own: cancelling the dispatch cancels both, none goes on alone.
    ended: list[str] = []
    waiting = asyncio.Event()

    class Waits(Recorder):
        async def pre_tool_use(self, ctx: PreToolUseContext) -> None:
            try:
                if self.name == "second":
                    waiting.set()
                await asyncio.Event().wait()
            finally:
                ended.append(self.name)

    reg = registry(Waits("first"), Waits("second"), hook_timeout_secs=5)
    dispatch = asyncio.ensure_future(reg.run_pre_tool_use(pre()))
    await asyncio.wait_for(waiting.wait(), 5)
    dispatch.cancel()
    with pytest.raises(asyncio.CancelledError):
        await dispatch
    deadline = time.monotonic() + 5
    while len(ended) < 2 and time.monotonic() < deadline:
        await asyncio.sleep(0)  # the cancelled hooks' tasks end on the loop's next turns
    assert sorted(ended) == ["first", "second"]
