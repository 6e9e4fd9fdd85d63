"""Smoke test of the concurrency benchmark: it runs end to end, and writes a well-formed report.

It starts a private redis-server, a hookbus worker and a floor worker, and must leave none
behind. No timing assertions: machines are noisy.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import concurrency
from workers.local.redis_server import MISSING, find_redis_server

pytestmark = pytest.mark.redis


def test_quick_run_writes_results(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if find_redis_server() is None:
        pytest.fail(MISSING + " (the benchmark starts a redis-server of its own)")
    # Write to a temporary file, so that a test run does not replace real figures.
    out = tmp_path / "results" / "concurrency.json"
    monkeypatch.setattr(concurrency, "RESULTS", out)

    assert concurrency.main(["--quick"]) == 0

    report = json.loads(out.read_text(encoding="utf-8"))
    assert report["quick"] is True
    assert report["levels"] == [1, 2, 4, 8, 16, 32]
    assert set(report["loops"]) == {"closed", "paced"}
    by = {(r["loop"], r["agents"], r["series"]): r for r in report["results"]}
    assert set(by) == {
        (loop, agents, series)
        for loop in ("closed", "paced")
        for agents in report["levels"]
        for series in ("shared", "each", "floor")
    }
    for key, r in by.items():
        assert r["samples"] >= r["agents"], key
        assert 0 < r["p50_us"] <= r["p99_us"], key
        assert len(r["quantiles_us"]) == 101, key
        assert len(r["p99_us_per_round"]) == report["loops"][r["loop"]]["rounds"], key
        if r["loop"] == "closed":
            assert r["dispatches_per_sec"] > 0, key
    for loop in ("closed", "paced"):
        for series in ("shared", "each", "floor"):
            assert report["growth"][loop][series]["p99"] > 0, (loop, series)
    for loop in ("closed", "paced"):
        for series in ("shared", "each"):
            assert report["vs_floor"][loop][series]["p99"] > 0, (loop, series)
        assert ("per_sec" in report["vs_floor"][loop]["shared"]) == (loop == "closed")
    target = report["target"]
    assert target["loop"] == "closed" and target["agents"] == 32
    assert target["max_ratio_p99_to_floor"] == 1.2
    assert target["min_ratio_per_sec_to_floor"] == 0.95
    assert target["ratios"] == {s: report["vs_floor"]["closed"][s] for s in ("shared", "each")}
    for series in ("shared", "each"):
        ratios, met = target["ratios"][series], target["met_by"][series]
        assert met == {"p99": ratios["p99"] <= 1.2, "per_sec": ratios["per_sec"] >= 0.95}, series
    assert target["met"] == all(all(m.values()) for m in target["met_by"].values())
