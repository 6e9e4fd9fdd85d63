"""Smoke test of the MCP proxy's benchmark: it runs end to end (a private redis-server, a
Redactor worker, the SDK's client against the filesystem server direct and behind ``hookbus
mcp``), and writes a well-formed report. No timing assertions: machines are noisy."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import mcp_proxy
from workers.local.redis_server import MISSING, find_redis_server

pytestmark = pytest.mark.redis


def test_quick_run_writes_results(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if find_redis_server() is None:
        pytest.fail(MISSING + " (the benchmark starts a redis-server of its own)")
    if not mcp_proxy.SERVER.exists():
        pytest.fail(f"{mcp_proxy.SERVER} is missing: run `make node-deps`")
    out = tmp_path / "results" / "mcp_proxy.json"
    monkeypatch.setattr(mcp_proxy, "RESULTS", out)

    assert mcp_proxy.main(["--quick"]) == 0

    report = json.loads(out.read_text(encoding="utf-8"))
    assert report["quick"] is True
    rows = {r["series"]: r for r in report["results"]}
    assert tuple(rows) == mcp_proxy.SERIES
    for series, r in rows.items():
        assert r["samples"] == mcp_proxy.QUICK.samples, series
        assert 0 < r["p50_us"] <= r["p99_us"], series
    assert rows["direct"]["overhead_p50_us"] == 0 and rows["direct"]["ratio_p50"] == 1.0
