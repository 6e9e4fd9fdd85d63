"""Smoke test of the HTTP gateway benchmark: it runs end to end, and writes a well-formed report.

It starts a private redis-server, a hook service, the coordinator service, the gateway, the
Starlette floor and one bridge process per bridge call, and must leave none behind. No timing
assertions: machines are noisy.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import http_gateway
from workers.local.redis_server import MISSING, find_redis_server

pytestmark = pytest.mark.redis


def test_quick_run_writes_results(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if find_redis_server() is None:
        pytest.fail(MISSING + " (the benchmark starts a redis-server of its own)")
    # Write to a temporary file, so that a test run does not replace real figures.
    out = tmp_path / "results" / "http_gateway.json"
    monkeypatch.setattr(http_gateway, "RESULTS", out)

    assert http_gateway.main(["--quick"]) == 0

    report = json.loads(out.read_text(encoding="utf-8"))
    assert report["quick"] is True
    assert set(report["series"]) == set(http_gateway.SERIES)
    by = {r["series"]: r for r in report["results"]}
    assert set(by) == set(http_gateway.SERIES)
    for series, r in by.items():
        assert r["samples"] == http_gateway.QUICK.batch[series], series
        assert 0 < r["p50_us"] <= r["p99_us"], series
        assert r["ratio_to_redis_p50"] > 0 and r["ratio_to_floor_p50"] > 0, series
        quantiles = r["quantiles_us"]
        assert len(quantiles) == 101 and quantiles == sorted(quantiles), series
    assert by["redis"]["ratio_to_redis_p50"] == 1.0
    assert by["floor"]["ratio_to_floor_p50"] == 1.0
