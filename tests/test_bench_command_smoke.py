"""Smoke test of the command-hook benchmark: it runs end to end, and writes a well-formed report.

It starts a private redis-server, hookbus workers and one process per command hook call, and
must leave none behind. No timing assertions: machines are noisy.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import command_hooks
from workers.local.redis_server import MISSING, find_redis_server

pytestmark = pytest.mark.redis


def test_quick_run_writes_results(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if find_redis_server() is None:
        pytest.fail(MISSING + " (the benchmark starts a redis-server of its own)")
    # Write to a temporary file, so that a test run does not replace real figures.
    out = tmp_path / "results" / "command_hooks.json"
    monkeypatch.setattr(command_hooks, "RESULTS", out)

    assert command_hooks.main(["--quick"]) == 0

    report = json.loads(out.read_text(encoding="utf-8"))
    assert report["quick"] is True
    assert set(report["variants"]) == {"hookbus", "python", "shell"}
    by = {(r["hooks"], r["variant"]): r for r in report["results"]}
    assert set(by) == {(n, v) for n in (1, 3) for v in ("hookbus", "python", "shell")}
    for key, r in by.items():
        assert r["samples"] > 0, key
        assert 0 < r["p50_us"] <= r["p99_us"], key
        assert r["ratio_to_hookbus_p50"] > 0, key
        quantiles = r["quantiles_us"]
        assert len(quantiles) == 101 and quantiles == sorted(quantiles), key
    for n in (1, 3):
        assert by[n, "hookbus"]["ratio_to_hookbus_p50"] == 1.0


def test_command_hook_script_answers_allow() -> None:
    """The Python command hook itself: JSON event in, an allow decision out."""
    import asyncio

    argv = command_hooks.commands("python", 1)[0]
    decision = asyncio.run(command_hooks.run_command(argv, command_hooks.event_json()))
    assert decision == "allow"
