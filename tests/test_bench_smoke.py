"""Smoke test of the in-process benchmark: it runs, and writes a well-formed report.

No timing assertions: machines are noisy.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import inprocess


def test_quick_run_writes_results(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Write to a temporary file, so that a test run does not replace real figures.
    out = tmp_path / "results" / "inprocess.json"
    monkeypatch.setattr(inprocess, "RESULTS", out)

    assert inprocess.main(["--quick"]) == 0

    report = json.loads(out.read_text(encoding="utf-8"))
    assert report["quick"] is True
    by_hooks = {r["hooks"]: r for r in report["results"]}
    assert sorted(by_hooks) == [0, 1, 3, 16]
    for r in by_hooks.values():
        for key in ("hookbus_p50_us", "hookbus_p99_us", "pluggy_p50_us", "pluggy_p99_us", "ratio"):
            assert r[key] > 0, (r["hooks"], key)
        assert r["hookbus_p99_us"] >= r["hookbus_p50_us"]
    secondary = report["secondary"]
    assert secondary["hooks"] == 3
    assert secondary["hookbus_p50_us"] > 0 and secondary["gather_p50_us"] > 0
    assert isinstance(report["target"]["met"], bool)
