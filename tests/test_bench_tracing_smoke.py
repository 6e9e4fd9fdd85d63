"""Smoke test of the tracing benchmark: it runs both sides against a real OTLP receiver and
writes a well-formed report. No timing assertions: machines are noisy."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import tracing_cost


def test_quick_run_writes_results(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "results" / "tracing_cost.json"
    monkeypatch.setattr(tracing_cost, "RESULTS", out)

    assert tracing_cost.main(["--quick"]) == 0

    report = json.loads(out.read_text(encoding="utf-8"))
    assert report["quick"] is True
    plan = tracing_cost.QUICK
    for side in ("off", "on"):
        assert report[side]["samples"] == plan.samples
        assert 0 < report[side]["p50_us"] <= report[side]["p99_us"]
    assert report["ratio_p50"] > 0 and report["ratio_p99"] > 0
    # every span the two traced processes made reached the receiver: 2 per dispatch in the
    # agent (tool, dispatch), 1 in the worker (hook)
    dispatched = plan.warmup + plan.samples
    assert report["spans"]["expected"] == {
        "hookbus-bench-agent": 2 * dispatched,
        "hookbus-worker": dispatched,
    }
    assert report["spans"]["received"] == report["spans"]["expected"]
    assert report["cpu_us_per_dispatch"]["agent-on:main"] > 0
    assert isinstance(report["target"]["met"], bool)
