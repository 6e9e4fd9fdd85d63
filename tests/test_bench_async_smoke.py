"""Smoke test of the async throughput benchmark: it runs, and writes a well-formed report.

It starts its own redis-server and worker processes. No timing assertions: machines are noisy.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import async_throughput


def test_quick_run_writes_results(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Write to a temporary file, so that a test run does not replace real figures.
    out = tmp_path / "results" / "async_throughput.json"
    monkeypatch.setattr(async_throughput, "RESULTS", out)

    assert async_throughput.main(["--quick"]) == 0

    report = json.loads(out.read_text(encoding="utf-8"))
    assert report["quick"] is True
    by_scenario = {r["scenario"]: r for r in report["results"]}
    assert set(by_scenario) == {"floor", "hookbus", "hookbus_batches"}
    for row in by_scenario.values():
        assert row["events_per_sec"] > 0, row["scenario"]
        assert row["ratio_to_floor"] > 0, row["scenario"]
        assert [t["events"] for t in row["trials"]] == [report["events_per_trial"]]
    assert by_scenario["floor"]["ratio_to_floor"] == 1.0
    assert isinstance(report["target"]["met"], bool)
