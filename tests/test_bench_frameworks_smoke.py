"""Smoke test of the framework adapters' benchmark: it runs end to end (a private redis-server,
two hook workers, both frameworks on their scripted models), and writes a well-formed report.

No timing assertions: machines are noisy.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import frameworks
from workers.local.redis_server import MISSING, find_redis_server

pytestmark = pytest.mark.redis


def test_quick_run_writes_results(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if find_redis_server() is None:
        pytest.fail(MISSING + " (the benchmark starts a redis-server of its own)")
    # Write to a temporary file, so that a test run does not replace real figures.
    out = tmp_path / "results" / "frameworks.json"
    monkeypatch.setattr(frameworks, "RESULTS", out)

    assert frameworks.main(["--quick"]) == 0

    report = json.loads(out.read_text(encoding="utf-8"))
    assert report["quick"] is True
    for framework in frameworks.FRAMEWORKS:
        rows = {r["series"]: r for r in report["results"] if r["framework"] == framework}
        assert tuple(rows) == frameworks.SERIES[framework]
        for series, r in rows.items():
            assert r["samples"] == frameworks.QUICK.samples, (framework, series)
            assert 0 < r["p50_us"] <= r["p99_us"], (framework, series)
            assert r["floor"] == frameworks.FLOOR[framework]
        assert rows["bare"]["overhead_p50_us"] == 0 and rows["bare"]["ratio_p50"] == 1.0
        assert rows[frameworks.FLOOR[framework]]["overhead_over_floor_p50_us"] == 0
