"""One agent turn is one trace: agent, coordinator and two worker processes, exported over
OTLP/HTTP to a real receiver that decodes the protobuf payloads."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from bus import Block, HookEvent
from bus.settings import BusSettings
from tests.harness import ROOT, Processes, wait_for, worker_env
from tests.otlp_receiver import OTLPReceiver
from tests.remote_hooks import HookConfig

PRE = HookEvent.PRE_TOOL_USE.value


def otel_env(receiver: OTLPReceiver, service: str) -> dict[str, str]:
    return {
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
        "OTEL_SERVICE_NAME": service,
        "OTEL_BSP_SCHEDULE_DELAY": "100",
        "OTEL_METRIC_EXPORT_INTERVAL": "500",
    }


async def test_one_turn_is_one_trace_with_hook_spans_from_the_workers(
    bus_settings: BusSettings, procs: Processes, tmp_path: Path
) -> None:
    with OTLPReceiver() as receiver:
        guard = HookConfig(name="Guard", events=[HookEvent.PRE_TOOL_USE], content=["path:.env"],
                           answers={PRE: Block(reason="no secrets")})  # fmt: skip
        slow = HookConfig(name="Slow", events=[HookEvent.PRE_TOOL_USE], delay=5, timeout=0.3)
        workers = [
            procs.scripted(bus_settings, c, **otel_env(receiver, f"hookbus-worker-{c.name}"))
            for c in (guard, slow)
        ]
        agent = subprocess.run(
            [sys.executable, "-m", "tests.trace_agent", str(tmp_path / "sandbox")],
            cwd=ROOT, env={**worker_env(bus_settings), **otel_env(receiver, "hookbus-agent")},
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert agent.returncode == 0, agent.stderr
        for w in workers:  # a clean stop flushes the workers' spans
            w.send_signal(signal.SIGTERM)
            w.wait(30)
        await wait_for(lambda: any(s["name"] == "hook Guard" and s["service"] != "hookbus-agent"
                                   for s in receiver.spans), what="the worker's span")  # fmt: skip
        spans = list(receiver.spans)

    by_id = {s["span_id"]: s for s in spans}
    [turn] = [s for s in spans if s["name"] == "turn"]
    trace_id = turn["trace_id"]
    assert turn["parent_id"] == "" and turn["attributes"]["session.id"] == "traced-session"

    def chain(span: dict[str, Any]) -> list[str]:
        names = [span["name"]]
        while span["parent_id"]:
            span = by_id[span["parent_id"]]
            names.append(span["name"])
        return names

    # the worker's execution span hangs under the agent's dispatch span, in the same trace
    [guard_span] = [s for s in spans if s["name"] == "hook Guard" and s["service"] ==
                    "hookbus-worker-Guard"]  # fmt: skip
    assert guard_span["trace_id"] == trace_id
    assert chain(guard_span) == ["hook Guard", "dispatch PreToolUse", "tool file_read",
                                 "step 1", "turn"]  # fmt: skip
    attrs = guard_span["attributes"]
    assert attrs["hook.name"] == "Guard" and attrs["hook.event"] == "PreToolUse"
    assert attrs["tool.name"] == "file_read" and attrs["session.id"] == "traced-session"
    assert attrs["hook.action"] == "Block" and attrs["hook.failure_policy"] == "ignore"
    assert attrs["hook.replica"] and attrs["hook.timed_out"] is False
    assert "Block" in guard_span["events"]
    # every span of the turn is in that one trace
    agent_spans = [s for s in spans if s["service"] == "hookbus-agent"]
    assert {s["trace_id"] for s in agent_spans} == {trace_id}

    # the timeout: an error span with hook.timed_out = true, under the dispatch
    timed_out = [s for s in spans if s["name"] == "hook Slow" and s["attributes"].get(
        "hook.timed_out") is True]  # fmt: skip
    assert timed_out and all(s["status"] == 2 for s in timed_out)
    assert any(chain(s)[1] == "dispatch PreToolUse" for s in timed_out)

    # the fail-open skip is counted in the agent's metrics
    skips = [m for m in receiver.metrics if m["name"] == "hookbus.hook.skips"]
    assert any(m["attributes"] == {"hook.name": "Slow", "outcome": "fail_open"} and m["value"] >= 1
               for m in skips), skips  # fmt: skip
    assert any(m["name"] == "hookbus.dispatch.duration" for m in receiver.metrics)


def test_no_exporter_configured_installs_nothing() -> None:
    from bus import telemetry

    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    assert telemetry.configure("agent", env) is False
    assert telemetry.enabled() is False
