"""Smoke test of the scale-out benchmark: it runs on one node and on a 3-master cluster it starts
itself, and writes a well-formed report. No timing assertions: machines are noisy. What it does
assert is behaviour: every scenario ran to completion (every decision answered Continue, every
event acknowledged by both groups on every partition), and on the cluster the load and the keys
spread over all three masters.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from bench import cluster
from workers.local.redis_cluster import MISSING_CLI
from workers.local.redis_server import MISSING, find_redis_server

pytestmark = [pytest.mark.redis, pytest.mark.timeout(900)]


def test_quick_run_writes_results(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if find_redis_server() is None:
        pytest.fail(MISSING + " (the benchmark starts redis-servers of its own)")
    if shutil.which("redis-cli") is None:
        pytest.fail(MISSING_CLI)
    # Write to a temporary file, so that a test run does not replace real figures.
    out = tmp_path / "results" / "cluster.json"
    monkeypatch.setattr(cluster, "RESULTS", out)

    assert cluster.main(["--quick"]) == 0

    report = json.loads(out.read_text(encoding="utf-8"))
    assert report["quick"] is True
    assert report["targets"]["node"]["masters"] == 1
    assert report["targets"]["cluster"] == {
        "label": "3-master cluster", "masters": 3, "replicas": 3, "partitions": 6,
        "request_shards": 3,
    }  # fmt: skip
    rows = {(r["target"], r["workload"], r["impl"]): r for r in report["results"]}
    assert set(rows) == set(cluster.SCENARIOS)
    for (target, workload, impl), row in rows.items():
        what = (target, workload, impl)
        (trial,) = row["trials"]
        assert trial["decisions" if workload == "decisions" else "events"] > 0, what
        assert row["per_sec"] > 0, what
        assert row["cpu_us"]["total"] > 0, what
        masters = report["targets"][target]["masters"]
        assert len(row["calls_share"]) == len(row["keys"]) == masters, what
        assert sum(row["calls_share"]) == pytest.approx(1.0, abs=0.01), what
        if target == "cluster":
            # every master serves part of the load, and the partitions' keys are on all three
            assert all(share > 0 for share in row["calls_share"]), what
            if workload == "events":
                assert all(k > 0 for k in row["keys"]), what
            if impl != "durable":
                assert row["ratio_to_node"] > 0, what
        if impl != "floor":
            assert row["ratio_to_floor"] > 0, what
        if impl == "durable":
            assert row["ratio_to_async"] > 0, what
        if workload == "events":
            assert row["idle_commands_per_sec_per_replica"] > 0, what
        assert row["capacity"]["client_cpu_us_per_op"] > 0, what
    targets = report["async_cluster_targets"]
    assert set(targets) == {"vs_floor", "cpu_vs_floor", "vs_node", "idle_commands_per_sec"}
    for name, t in targets.items():
        assert t["value"] > 0 and t["target"] > 0, name
        assert isinstance(t["holds"], bool), name
