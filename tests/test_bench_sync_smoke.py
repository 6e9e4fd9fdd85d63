"""Smoke test of the sync-dispatch benchmark: it runs end to end over a private redis-server.

It starts worker processes (HookBus's, the raw floor's, a FastStream subscriber) and must leave
none behind. No timing assertions: machines are noisy.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import sync_dispatch
from workers.local.redis_server import MISSING, find_redis_server

pytestmark = pytest.mark.redis


def test_quick_run_writes_results(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if find_redis_server() is None:
        pytest.fail(MISSING + " (the benchmark starts a redis-server of its own)")
    # Write to a temporary file, so that a test run does not replace real figures.
    out = tmp_path / "results" / "sync_dispatch.json"
    monkeypatch.setattr(sync_dispatch, "RESULTS", out)

    assert sync_dispatch.main(["--quick"]) == 0

    report = json.loads(out.read_text(encoding="utf-8"))
    assert report["quick"] is True
    assert report["samples_per_point"] > 0
    for name in ("agent", "service"):
        topology = report["topologies"][name]
        by_hooks = {r["hooks"]: r for r in topology["results"]}
        assert sorted(by_hooks) == [1, 3, 8], name
        for r in by_hooks.values():
            for key in ("hookbus_p50_us", "hookbus_p99_us", "floor_p50_us", "floor_p99_us"):
                assert r[key] > 0, (name, r["hooks"], key)
            assert r["hookbus_p99_us"] >= r["hookbus_p50_us"]
            assert r["floor_p99_us"] >= r["floor_p50_us"]
            assert r["ratio_p50"] > 0
            # The untrusted tenant's decisions, beside the trusted ones: service topology only.
            tenant = r.get("tenant_p50_us")
            assert (tenant is not None) == (name == "service"), (name, r)
            if tenant is not None:
                assert 0 < tenant <= r["tenant_p99_us"], r
                assert r["tenant_vs_trusted_p50"] > 0 and r["tenant_ratio_p50"] > 0
                assert len(r["quantiles_us"]["tenant"]) == 101
        assert isinstance(topology["target"]["met"], bool)
        assert set(topology["target"]["ratios"]) == {"1", "3"}
    reference = report["reference"]
    assert reference["hooks"] == 1 and reference["p50_us"] > 0
