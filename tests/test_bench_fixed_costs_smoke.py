"""Smoke test of the fixed-costs benchmark: it runs end to end over a private redis-server and a
3-master cluster, and reports CPU per operation of each process, HookBus beside its floor.

No timing assertions: machines are noisy. It starts worker processes and must leave none behind.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import fixed_costs
from workers.local.redis_server import MISSING, find_redis_server

pytestmark = pytest.mark.redis


def test_quick_run_writes_results(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if find_redis_server() is None:
        pytest.fail(MISSING + " (the benchmark starts a redis-server of its own)")
    out = tmp_path / "results" / "fixed_costs.json"
    monkeypatch.setattr(fixed_costs, "RESULTS", out)

    assert fixed_costs.main(["--quick"]) == 0

    report = json.loads(out.read_text(encoding="utf-8"))
    assert report["quick"] is True and report["cluster"] is True
    by_what = {r["what"]: r for r in report["rows"]}
    # Each row: the processes counted, and those with a target (the others are shown beside).
    expected = {
        "in-process, 1 no-op hook(s)": ({"process"}, {"process"}),
        "in-process, 3 no-op hook(s)": ({"process"}, {"process"}),
        "in-process, 16 no-op hook(s)": ({"process"}, {"process"}),
        "sync agent, 1 hook": ({"agent", "hook", "redis"}, {"agent", "hook"}),
        "coordinator service, 1 hook": ({"service", "hook", "agent", "redis"}, {"service"}),
        "cluster vs one node, sync agent, 1 hook": (
            {"agent", "hook", "redis"},
            {"agent", "hook", "redis"},
        ),
        "cluster vs one node, coordinator service, 1 hook": (
            {"service", "hook", "redis"},
            {"service", "hook", "redis"},
        ),
    }
    assert set(by_what) == set(expected)
    for what, (roles, targeted) in expected.items():
        measured = by_what[what]["roles"]
        assert set(measured) == roles, what
        assert {role for role, v in measured.items() if "met" in v} == targeted, what
        for role, v in measured.items():
            assert v["hookbus_us"] > 0 and v["floor_us"] > 0, (what, role, v)
            assert v["ratio"] > 0 and len(v["ratio_per_round"]) == 2, (what, role, v)
    assert isinstance(report["met"], bool)
