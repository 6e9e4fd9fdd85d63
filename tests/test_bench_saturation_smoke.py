"""Smoke test of the saturation benchmark (bench/cluster_saturation.py): it saturates one node and
a 3-master cluster it starts itself with redis-benchmark, and writes a well-formed report. No
timing assertions: what it asserts is the report's shape, that every figure measured is
positive, that every master served part of the load, and that the verdict names the cores
available and needed.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from bench import cluster_saturation
from workers.local.redis_cluster import MISSING_CLI
from workers.local.redis_server import MISSING, find_redis_server

pytestmark = [pytest.mark.redis, pytest.mark.timeout(300)]


def test_quick_run_writes_results(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if find_redis_server() is None:
        pytest.fail(MISSING + " (the benchmark starts redis-servers of its own)")
    if shutil.which("redis-cli") is None:
        pytest.fail(MISSING_CLI)
    if shutil.which("redis-benchmark") is None:
        pytest.fail(cluster_saturation.MISSING_BENCHMARK)
    out = tmp_path / "results" / "cluster_saturation.json"
    monkeypatch.setattr(cluster_saturation, "RESULTS", out)

    assert cluster_saturation.main(["--quick"]) == 0

    report = json.loads(out.read_text(encoding="utf-8"))
    assert report["quick"] is True
    assert {k: v["masters"] for k, v in report["targets"].items()} == {"node": 1, "cluster": 3}
    for key, masters in (("node", 1), ("cluster", 3)):
        row = report["results"][key]
        assert row["per_sec"] > 0, key
        for field in ("saturation_per_sec_per_master", "busy_per_master", "cpu_share"):
            assert len(row[field]) == masters, (key, field)
            assert all(v > 0 for v in row[field]), (key, field)
        assert all(share > 0 for share in row["commands_share"]), key
        assert sum(row["cpu_share"]) == pytest.approx(1.0, abs=0.01), key
        (trial,) = row["trials"]
        assert trial["commands"] == cluster_saturation.QUICK.requests, key
        assert row["load_cpu_us_per_command"] > 0, key
    verdict = report["verdict"]
    assert verdict["cores_available"] >= 1
    assert verdict["cores_needed"] > verdict["masters"] == 3
    assert verdict["enough_cores"] == (verdict["cores_available"] >= verdict["cores_needed"])
    assert verdict["measured_ratio"] > 0 and verdict["ceiling_ratio"] > 0
    assert verdict["node_saturation_per_sec"] > 0 and verdict["node_busy"] > 0
    assert verdict["node_saturated"] == (verdict["node_busy"] >= cluster_saturation.SATURATED)
