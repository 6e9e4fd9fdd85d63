"""The reference runtime end to end (embedded mode): all 12 events, what the agent saw, and the
audit log; plus bad input that must end cleanly."""

from __future__ import annotations

import io
from pathlib import Path

from agent_adapter.demo import embedded_registry, run_embedded
from agent_adapter.llm import ScriptedLLM, ToolCall, answer, call, tools
from agent_adapter.runtime import AgentRuntime, estimate_tokens
from agent_adapter.tools import sandbox_tools
from bus import HookEvent, HookRegistry, HookSettings, PermissionDenialSource, TurnTerminal
from tests.hooks_for_tests import Recorder
from workers.builtins.embedded import MetricsData


async def test_demo_session_fires_all_12_events_and_the_agent_sees_the_hooks(
    tmp_path: Path,
) -> None:
    out = io.StringIO()
    result, rows = await run_embedded(tmp_path, out)
    timeline = out.getvalue()
    for event in HookEvent:
        assert f"\n{event.value} " in timeline, f"{event.value} never fired"

    assert result.terminal == TurnTerminal.CANCELLED
    # mutated input: the write landed under notes/
    assert (tmp_path / "sandbox" / "notes" / "todo.txt").read_text() == "- a"
    tool_messages = [m.content for m in result.tool_messages]
    # blocked call, mutated output (redacted and truncated), failure advice, subagent answer
    assert any(
        m.startswith("Permission denied (Rule): policy rule no-env-files: .env files")
        for m in tool_messages
    )  # the starter policy's rule (examples/policy/starter.toml)
    config = next(m for m in tool_messages if "service configuration" in m)
    assert "API_KEY=[redacted]" in config and "sk-live" not in config
    assert "truncated" in config and len(config) < 300
    assert any("Try search_corpus" in m for m in tool_messages)
    assert "Hooks add concerns to the loop." in tool_messages
    # reminders: tagged, and no duplicates within a step
    assert len(result.reminders) == len(set(result.reminders)) == 4
    assert any(
        "[Hook: Policy | PermissionRequest] policy rule other-shell-needs-a-person" in r
        for r in result.reminders
    )
    # denials with their level and source
    assert [(d.tool_name, d.level, d.source) for d in result.denials] == [
        ("file_read", 3, PermissionDenialSource.RULE),
        ("run_shell", 1, PermissionDenialSource.RULE),
        ("file_write", 0, PermissionDenialSource.RULE),
        ("file_read", 3, PermissionDenialSource.RULE),
    ]
    # the audit log: one row per executed tool call and one SESSION_STOP row
    assert [r["status"] for r in rows] == ["OK", "OK", "OK", "FAIL", "OK", "OK", "SESSION_STOP"]
    assert rows[-1]["output_preview"] == "Cancelled"
    assert all(len(r["output_preview"] or "") <= 200 for r in rows)


def runtime(tmp_path: Path, llm: ScriptedLLM, **kwargs: object) -> tuple[AgentRuntime, Recorder]:
    registry = HookRegistry(HookSettings())
    recorder = Recorder("Observer")
    registry.add(recorder)
    box = sandbox_tools(tmp_path / "box")
    return AgentRuntime(registry, llm, box, **kwargs), recorder  # type: ignore[arg-type]


async def test_unknown_tool_gets_a_clear_message_and_the_turn_goes_on(tmp_path: Path) -> None:
    llm = ScriptedLLM([tools(call("teleport", where="mars")), answer("done")])
    rt, rec = runtime(tmp_path, llm)
    result = await rt.run_turn("go")
    assert result.terminal == TurnTerminal.COMPLETED
    msg = result.tool_messages[0].content
    assert "unknown tool 'teleport'" in msg and "file_read" in msg
    events = [e for e, _ in rec.calls]
    assert HookEvent.POST_TOOL_USE_FAILURE in events and events[-1] == HookEvent.ON_SESSION_STOP


async def test_arguments_of_the_wrong_shape_get_a_clear_message(tmp_path: Path) -> None:
    llm = ScriptedLLM(
        [
            tools(ToolCall(id="1", name="file_read", args=["not", "a", "dict"])),
            tools(call("file_read", path=42)),
            tools(call("file_write", path="a")),
            answer("done"),
        ]
    )
    rt, _ = runtime(tmp_path, llm)
    result = await rt.run_turn("go")
    msgs = [m.content for m in result.tool_messages]
    assert "takes an object of arguments" in msgs[0]
    assert "'path' must be str" in msgs[1]
    assert "missing argument(s): content" in msgs[2]
    assert result.terminal == TurnTerminal.COMPLETED


async def test_a_plan_that_loops_past_max_steps_stops_cleanly(tmp_path: Path) -> None:
    (tmp_path / "box").mkdir()
    (tmp_path / "box" / "a.txt").write_text("a")
    llm = ScriptedLLM([tools(call("file_read", path="a.txt"))], repeat_last=True)
    rt, rec = runtime(tmp_path, llm, max_steps=3)
    result = await rt.run_turn("loop forever")
    assert result.terminal == TurnTerminal.MAX_STEPS and result.steps == 3
    assert "Stopped after 3 steps" in result.answer
    stops = [c for e, c in rec.calls if e == HookEvent.ON_SESSION_STOP]
    assert len(stops) == 1 and stops[0].terminal == TurnTerminal.MAX_STEPS


async def test_a_crashing_llm_ends_with_error_and_session_stop(tmp_path: Path) -> None:
    def explode(_: object) -> object:
        raise RuntimeError("model unavailable")

    rt, rec = runtime(tmp_path, ScriptedLLM([explode]))  # type: ignore[list-item]
    result = await rt.run_turn("go")
    assert result.terminal == TurnTerminal.ERROR and "model unavailable" in result.answer
    assert rec.calls[-1][0] == HookEvent.ON_SESSION_STOP


async def test_compaction_fires_pre_and_post_compact_and_shrinks_messages(tmp_path: Path) -> None:
    (tmp_path / "box").mkdir()
    (tmp_path / "box" / "big.txt").write_text("word " * 400)
    plan = [tools(call("file_read", path="big.txt")) for _ in range(3)] + [answer("ok")]
    rt, rec = runtime(tmp_path, ScriptedLLM(plan), token_limit=300, keep_recent=2)
    result = await rt.run_turn("read")
    pre = [c for e, c in rec.calls if e == HookEvent.ON_PRE_COMPACT]
    post = [c for e, c in rec.calls if e == HookEvent.ON_POST_COMPACT]
    assert pre and len(pre) == len(post)
    assert all(b.new_message_count <= a.message_count for a, b in zip(pre, post, strict=True))
    assert {p.compression_method for p in post} <= {"summary", "truncate"}
    # each compaction brought the conversation back under the limit
    steps = [c for e, c in rec.calls if e == HookEvent.ON_STEP_COMPLETE]
    assert estimate_tokens(result.messages[:-1]) <= 300
    assert any(s.estimated_tokens > 300 for s in steps)
    assert result.terminal == TurnTerminal.COMPLETED


async def test_get_metrics_is_the_metrics_hooks_data(tmp_path: Path) -> None:
    cancelled: set[str] = set()
    metrics = MetricsData()
    registry, _ = embedded_registry(tmp_path, cancelled, metrics)
    try:
        (tmp_path / "box").mkdir()
        (tmp_path / "box" / "a.txt").write_text("a")
        llm = ScriptedLLM([tools(call("file_read", path="a.txt")), answer("done")])
        rt = AgentRuntime(
            registry, llm, sandbox_tools(tmp_path / "box"), metrics=metrics, cancelled=cancelled
        )
        await rt.run_turn("read")
        snapshot = rt.get_metrics()
        assert snapshot["tool_calls"] == 1 and snapshot["terminal"] == "Completed"
        assert snapshot["session_id"] == rt.session_id
    finally:
        registry.close()
