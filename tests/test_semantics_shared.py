"""The specification's semantic tests, run through both modes from one suite.

Each test runs twice: ``embedded`` (hooks in this process, ``HookRegistry``) and
``distributed`` (every hook in its own ``hookbus worker`` process, a real Redis, ``HookClient``).
The assertions are the same, so the two modes give identical results.
"""

from __future__ import annotations

import time
from typing import Any

from bus import (
    Block,
    HookEvent,
    InjectContext,
    Metadata,
    MutateInput,
    MutateOutput,
    Override,
    PermissionDecision,
    PermissionRequestContext,
    PermissionRequired,
    PostToolUseContext,
    PostToolUseFailureContext,
    PreToolUseContext,
    SessionStartContext,
    SessionStopContext,
    StepCompleteContext,
    SubagentStartContext,
    Warn,
)
from tests.remote_hooks import HookConfig

PRE, POST = HookEvent.PRE_TOOL_USE.value, HookEvent.POST_TOOL_USE.value
PERM = HookEvent.PERMISSION_REQUEST.value


def hook(name: str, priority: int, **kw: Any) -> HookConfig:
    return HookConfig(name=name, priority=priority, **kw)


def pre(tool: str = "file_read", **args: Any) -> PreToolUseContext:
    return PreToolUseContext(session_id="s1", tool_name=tool, tool_args=args, step=1)


def rendered(result: Any) -> list[str]:
    return [t.render() for t in result.tagged_contexts]


async def test_hook_registry_runs_all_hooks(harness: Any) -> None:
    configs = [
        hook(
            f"h{i}",
            i,
            answers={PRE: MutateInput(updated_args={"by": i}, additional_context=f"c{i}")},
        )
        for i in range(3)
    ]
    runner = await harness.start(*configs)
    result = await runner.run_pre_tool_use(pre())
    assert result.additional_contexts == ("c0", "c1", "c2")
    assert result.final_args == {"by": 2}


async def test_blocking_hook_stops_chain(harness: Any) -> None:
    runner = await harness.start(
        hook("a", 0, answers={PRE: Block(reason="no")}),
        hook("b", 1, answers={PRE: Block(reason="never")}),
        hook("c", 2),
    )
    result = await runner.run_pre_tool_use(pre())
    assert result.action == Block(reason="no")
    assert [(b.hook_name, b.reason) for b in result.blocking_errors] == [
        ("a", "no"),
        ("b", "never"),
    ]


async def test_block_outranks_permission_required_and_mutate(harness: Any) -> None:
    runner = await harness.start(
        hook("m", 0, answers={PRE: MutateInput(updated_args={"x": 1})}),
        hook("p", 1, answers={PRE: PermissionRequired(permission="shell", tool_name="t")}),
    )
    result = await runner.run_pre_tool_use(pre())
    assert result.action == PermissionRequired(permission="shell", tool_name="t")
    assert result.final_args == {"x": 1}


async def test_mutate_input_accumulates_context(harness: Any) -> None:
    runner = await harness.start(
        hook("a", 0, answers={PRE: MutateInput(updated_args={"p": "/a"}, additional_context="A")}),
        hook("b", 1, answers={PRE: MutateInput(updated_args={"p": "/b"}, additional_context="B")}),
    )
    result = await runner.run_pre_tool_use(pre(p="/orig"))
    assert result.final_args == {"p": "/b"}
    assert rendered(result) == ["[Hook: a | PreToolUse] A", "[Hook: b | PreToolUse] B"]


async def test_post_tool_use_mutate_output_warnings_metadata(harness: Any) -> None:
    runner = await harness.start(
        hook(
            "o1", 0, answers={POST: MutateOutput(updated_content="first", additional_context="n")}
        ),
        hook("o2", 1, answers={POST: MutateOutput(updated_content="second")}),
        hook("w", 2, answers={POST: Warn(message="careful")}),
        hook("m", 3, answers={POST: Metadata(key="k", value={"a": [1, 2]})}),
        hook("p", 4, answers={POST: PermissionRequired(permission="net", tool_name="fetch")}),
    )
    ctx = PostToolUseContext(session_id="s1", tool_name="t", output_content="raw")
    result = await runner.run_post_tool_use(ctx)
    assert result.final_content == "second"
    assert result.warnings == ("careful",)
    assert result.metadata == {"k": {"a": [1, 2]}}
    assert result.post_permission_requests == (("net", "fetch"),)
    assert rendered(result) == [
        "[Hook: o1 | PostToolUse] n",
        "[Hook: w | PostToolUse] Warning: careful",
    ]


async def test_post_tool_use_failure_mutates_the_error(harness: Any) -> None:
    failure = HookEvent.POST_TOOL_USE_FAILURE.value
    runner = await harness.start(
        hook("fix", 0, answers={failure: MutateOutput(updated_content="try x")})
    )
    ctx = PostToolUseFailureContext(session_id="s1", tool_name="t", error_message="boom")
    assert (await runner.run_on_post_tool_use_failure(ctx)).final_content == "try x"


async def test_match_filter_skips_irrelevant(harness: Any) -> None:
    runner = await harness.start(
        hook("files", 0, names=["file_*"], answers={PRE: Block(reason="files")}),
        hook("env", 1, names=["file_*"], content=["path:.env"], answers={PRE: Block(reason="env")}),
    )
    assert not (await runner.run_pre_tool_use(pre("search", path=".env"))).is_blocked
    result = await runner.run_pre_tool_use(pre("file_read", path="main.py"))
    assert [b.hook_name for b in result.blocking_errors] == ["files"]
    result = await runner.run_pre_tool_use(pre("file_read", path="/app/.env"))
    assert [b.hook_name for b in result.blocking_errors] == ["files", "env"]


async def test_notification_events_reach_subscribed_hooks(harness: Any) -> None:
    runner = await harness.start(
        hook("starts", 0, events=[HookEvent.ON_SESSION_START]),
        hook("all", 1),
    )
    started = await runner.run_on_session_start(SessionStartContext(session_id="s1"))
    assert started.called == ("starts", "all")
    step = await runner.run_on_step_complete(
        StepCompleteContext(session_id="s1", step=1, max_steps=3)
    )
    assert step.called == ("all",)
    sub = await runner.run_on_subagent_start(
        SubagentStartContext(parent_session_id="s1", subagent_name="r")
    )
    assert sub.called == ("all",)
    stop = await runner.run_on_session_stop(SessionStopContext(session_id="s1"))
    assert stop.called == ("all",) and stop.skipped == ()


async def test_permission_request_override(harness: Any) -> None:
    runner = await harness.start(
        hook("first", 0, answers={PERM: Override(decision=PermissionDecision.ASK, reason="r1")}),
        hook("ctx", 1, answers={PERM: InjectContext(context="policy")}),
        hook("second", 2, answers={PERM: Override(decision=PermissionDecision.ALLOW, reason="r2")}),
    )
    ctx = PermissionRequestContext(session_id="s1", tool_name="run_shell")
    result = await runner.run_on_permission_request(ctx)
    assert result.action == Override(decision=PermissionDecision.ASK, reason="r1")
    assert result.overridden_by == "first"
    assert result.additional_contexts == ("policy",)


async def test_permission_request_continue(harness: Any) -> None:
    runner = await harness.start(hook("a", 0), hook("b", 1))
    ctx = PermissionRequestContext(session_id="s1", tool_name="file_read")
    result = await runner.run_on_permission_request(ctx)
    assert type(result.action).__name__ == "Continue" and result.overridden_by is None


async def test_timed_out_hook_is_skipped_and_named(harness: Any) -> None:
    runner = await harness.start(
        hook("slow", 0, delay=5.0, timeout=0.3, answers={PRE: Block(reason="late")}),
        hook("fast", 1, answers={PRE: MutateInput(updated_args={"ok": True})}),
    )
    t0 = time.monotonic()
    result = await runner.run_pre_tool_use(pre())
    assert time.monotonic() - t0 < 0.3 + 2.0  # its timeout plus a generous margin
    assert not result.is_blocked and result.final_args == {"ok": True}
    assert [(s.hook_name, s.kind, s.detail) for s in result.skipped] == [
        ("slow", "timeout", "no answer within 0.3s")
    ]


async def test_raising_hook_is_skipped_and_named(harness: Any) -> None:
    runner = await harness.start(
        hook("bad", 0, raises=True), hook("good", 1, answers={PRE: Block(reason="policy")})
    )
    result = await runner.run_pre_tool_use(pre())
    assert [b.hook_name for b in result.blocking_errors] == ["good"]
    assert [(s.hook_name, s.kind, s.detail) for s in result.skipped] == [
        ("bad", "error", "RuntimeError: bad exploded")
    ]


async def test_fail_policy_timeout_blocks_and_error_denies(harness: Any) -> None:
    runner = await harness.start(
        hook(
            "strict",
            0,
            delay=5,
            timeout=0.3,
            failure_policy="fail",
            events=[HookEvent.PRE_TOOL_USE],
        ),
        hook("crash", 1, raises=True, failure_policy="fail", events=[HookEvent.PERMISSION_REQUEST]),
        hook("allow", 2, answers={PERM: Override(decision=PermissionDecision.ALLOW)}),
    )
    result = await runner.run_pre_tool_use(pre())
    assert result.is_blocked and "hook strict timed out" in result.action.reason
    ctx = PermissionRequestContext(session_id="s1", tool_name="run_shell")
    perm = await runner.run_on_permission_request(ctx)
    assert perm.action.decision == PermissionDecision.DENY and perm.overridden_by == "crash"


async def test_wrong_answer_type_is_a_failure(harness: Any) -> None:
    runner = await harness.start(
        hook("confused", 0, answers={PRE: Override(decision=PermissionDecision.ALLOW)})
    )
    result = await runner.run_pre_tool_use(pre())
    assert [(s.hook_name, s.kind) for s in result.skipped] == [("confused", "error")]
    assert "Override" in result.skipped[0].detail


def nested(depth: int) -> dict[str, Any]:
    """``{"a": {"a": … {}}}``, ``depth`` levels (built without recursion)."""
    value: dict[str, Any] = {}
    for _ in range(depth - 1):
        value = {"a": value}
    return value


async def test_input_no_hook_could_inspect_is_refused_whatever_the_policies(
    harness: Any, tmp_path: Any
) -> None:
    """Too deep, too large or not encodable: PreToolUse Blocked, PermissionRequest Denied,
    output withheld, notifications reach no hook — though every hook would allow it and
    every failure policy is "ignore". Brackets inside strings are text, not nesting."""
    calls = tmp_path / "calls.txt"
    runner = await harness.start(
        hook(
            "lenient",
            0,
            record=str(calls),
            answers={
                PERM: Override(decision=PermissionDecision.ALLOW, reason="fine"),
                POST: Warn(message="seen"),
            },
        )
    )
    deep = nested(100_000)
    result = await runner.run_pre_tool_use(pre(deep=deep))
    assert result.is_blocked and [b.hook_name for b in result.blocking_errors] == ["HookBus"]
    assert "the limit is 64 (MAX_CONTEXT_DEPTH)" in result.action.reason
    result = await runner.run_pre_tool_use(pre(deep=nested(70)))
    assert (
        "nests more than 64 levels deep; the limit is 64 (MAX_CONTEXT_DEPTH)"
        in result.action.reason
    )
    result = await runner.run_pre_tool_use(pre(blob="y" * 1_100_000))
    assert result.is_blocked and "(MAX_CONTEXT_BYTES)" in result.action.reason
    ctx = PermissionRequestContext(session_id="s1", tool_name="run_shell", tool_args=deep)
    perm = await runner.run_on_permission_request(ctx)
    assert perm.action.decision == PermissionDecision.DENY and perm.overridden_by == "HookBus"
    assert "MAX_CONTEXT_DEPTH" in perm.action.reason
    post = PostToolUseContext(session_id="s1", tool_name="t", tool_args=deep, output_content="x")
    result = await runner.run_post_tool_use(post)
    assert result.final_content.startswith("[output withheld by HookBus")
    sub = SubagentStartContext(parent_session_id="s1", subagent_name="r", prompt="\udc80")
    started = await runner.run_on_subagent_start(sub)
    assert started.called == () and started.skipped == ()
    assert runner.refusals == 6
    assert not calls.exists()  # no hook was shown any of it
    # Nesting inside strings is text: the hook sees it and answers.
    text = "[{" * 40_000
    post = PostToolUseContext(
        session_id="s1", tool_name="t", tool_args=nested(60), output_content=text
    )
    result = await runner.run_post_tool_use(post)
    assert result.final_content == text and result.warnings == ("seen",)
    assert calls.read_text().split()[0] == POST


async def test_an_answer_too_deep_to_send_fails_its_hook(harness: Any) -> None:
    """Embedded or not, an answer whose reply would nest past MAX_DEPTH fails its hook (under
    its policy) with the same reason; one that fits is applied."""
    runner = await harness.start(
        hook("deep", 0, answers={POST: Metadata(key="m", value=nested(200))}),
        hook("fits", 1, answers={POST: Metadata(key="n", value=nested(126))}),
        hook(
            "strict", 2, failure_policy="fail", answers={PRE: MutateInput(updated_args=nested(300))}
        ),
    )
    result = await runner.run_post_tool_use(PostToolUseContext(session_id="s1", tool_name="t"))
    assert [(s.hook_name, s.kind) for s in result.skipped] == [("deep", "error")]
    assert result.skipped[0].detail == (
        "the hook's answer could not be sent: HookReply nests more than 128 levels deep; "
        "the limit is 128 (MAX_DEPTH)"
    )
    assert result.metadata == {"n": nested(126)}
    blocked = await runner.run_pre_tool_use(pre())
    assert blocked.is_blocked and "hook strict failed: the hook's answer" in blocked.action.reason
