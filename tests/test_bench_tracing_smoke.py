"""Smoke test of the tracing benchmark: it runs HookBus and the floor (stock OpenTelemetry SDK),
tracing off and on, against a real OTLP receiver and writes a well-formed report. No timing
assertions: machines are noisy."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import tracing_cost


def test_quick_run_writes_results(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "results" / "tracing_cost.json"
    monkeypatch.setattr(tracing_cost, "RESULTS", out)
    # A caller's own OpenTelemetry settings reach no benchmark process: the "off" sides stay
    # untraced (the run stops otherwise) and the "on" sides export to the benchmark's receiver.
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "console")

    assert tracing_cost.main(["--quick"]) == 0

    report = json.loads(out.read_text(encoding="utf-8"))
    assert report["quick"] is True
    plan = tracing_cost.QUICK
    for side in ("off", "on", "on-sdk", "floor-off", "floor-on"):
        assert report[side]["samples"] == plan.samples
        assert 0 < report[side]["p50_us"] <= report[side]["p99_us"]
    for ratio in ("ratio_p50", "ratio_p99", "sdk_ratio_p50", "sdk_ratio_p99", "floor_ratio_p50",
                  "floor_ratio_p99"):  # fmt: skip
        assert report[ratio] > 0
    # every span the traced processes made reached the receiver, HookBus's (its own export and
    # the SDK's) and the floor's (stock SDK): 2 per dispatch in the agent (execute_tool,
    # dispatch), 1 in the hook's process
    dispatched = plan.warmup + plan.samples
    assert report["spans"]["expected"] == {
        "bench-on": 3 * dispatched,
        "bench-on-sdk": 3 * dispatched,
        "floor-agent": 2 * dispatched,
        "floor-worker": dispatched,
    }
    assert report["spans"]["received"] == report["spans"]["expected"]
    for process in ("agent-on:main", "agent-floor-on:main", "worker-floor-on:main"):
        assert report["cpu_us_per_dispatch"][process] > 0
    assert set(report["cpu_us_per_dispatch_by_side"]) == {side for side, _, _ in tracing_cost.SIDES}
    assert isinstance(report["target"]["met"], bool)
