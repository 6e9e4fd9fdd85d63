"""Smoke test of the plotting step: PNGs and the summary table from results files.

The results are small synthetic reports with the fields the benchmarks write (the benchmarks'
own smoke tests check that they do), so that this test needs no Redis and takes seconds.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bench import plots, report

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
ALL_PLOTS = {
    "sync_dispatch_cdf.png",
    "async_throughput.png",
    "concurrency.png",
    "command_hooks.png",
    "inprocess.png",
}


def _quantiles(p50: float) -> list[float]:
    return [round(p50 * (0.7 + 0.6 * i / 100) ** 3, 1) for i in range(101)]


def reports(quick: bool) -> dict[str, dict[str, Any]]:
    """One report per benchmark, shaped as the benchmarks write them."""
    common = {"quick": quick, "measured_at": "2026-01-01T00:00:00+00:00", "python": "3.11.7"}
    sync_rows = [
        {
            "hooks": n,
            "hookbus_p50_us": 300.0 * n,
            "hookbus_p99_us": 900.0 * n,
            "floor_p50_us": 250.0 * n,
            "floor_p99_us": 700.0 * n,
            "ratio_p50": 1.2,
            "ratio_p50_per_batch": {"min": 1.1, "median": 1.2, "max": 1.3},
            "quantiles_us": {"hookbus": _quantiles(300 * n), "floor": _quantiles(250 * n)},
        }
        for n in (1, 3, 8)
    ]
    # The service topology adds an untrusted tenant's series beside the trusted one.
    service_rows = [
        {
            **row,
            "tenant_p50_us": 330.0 * row["hooks"],
            "tenant_p99_us": 990.0 * row["hooks"],
            "tenant_vs_trusted_p50": 1.1,
            "tenant_vs_trusted_p50_per_batch": {"min": 1.0, "median": 1.1, "max": 1.2},
            "tenant_ratio_p50": 1.32,
            "quantiles_us": {**row["quantiles_us"], "tenant": _quantiles(330 * row["hooks"])},
        }
        for row in sync_rows
    ]
    targets = {
        name: {"hooks": [1, 3], "max_ratio_p50": limit, "ratios": {"1": 1.2, "3": 1.2}, "met": True}
        for name, limit in (("agent", 1.3), ("service", 1.2))
    }
    # Per series: p99 and dispatches/s over the floor's (the same at every level).
    factors = {"shared": (1.1, 0.97), "each": (1.3, 0.9), "floor": (1.0, 1.0)}
    concurrency_rows = [
        {
            "loop": loop,
            "agents": c,
            "series": s,
            "samples": 100,
            "p50_us": 300.0 * c,
            "p99_us": 900.0 * c * factors[s][0],
            "mean_us": 400.0 * c,
            "dispatches_per_sec": 2500.0 * factors[s][1] if loop == "closed" else None,
            "quantiles_us": _quantiles(300 * c),
        }
        for loop in ("closed", "paced")
        for c in (1, 2, 4, 8, 16, 32)
        for s in ("shared", "each", "floor")
    ]
    vs_floor = {
        "closed": {s: {"p99": factors[s][0], "per_sec": factors[s][1]} for s in ("shared", "each")},
        "paced": {s: {"p99": factors[s][0]} for s in ("shared", "each")},
    }
    return {
        "inprocess": {
            **common,
            "results": [
                {
                    "hooks": n,
                    "hookbus_p50_us": 2.0 + n,
                    "hookbus_p99_us": 4.0 + n,
                    "pluggy_p50_us": 1.0 + n / 4,
                    "pluggy_p99_us": 2.0 + n / 4,
                    "ratio": 1.5 if n < 16 else 2.5,
                }
                for n in (0, 1, 3, 16)
            ],
            "target": {"hooks": [1, 3, 16], "max_ratio": 2.0, "met": False},
        },
        "sync_dispatch": {
            **common,
            "redis_server": "7.0.15",
            "cpus": 2,
            "topologies": {
                name: {"description": name, "results": rows, "target": targets[name]}
                for name, rows in (("agent", sync_rows), ("service", service_rows))
            },
            "reference": {
                "what": "FastStream",
                "hooks": 1,
                "p50_us": 1500.0,
                "p99_us": 3000.0,
                "floor_p50_us": 250.0,
                "ratio_p50": 6.0,
                "quantiles_us": _quantiles(1500),
            },
        },
        "command_hooks": {
            **common,
            "results": [
                {
                    "hooks": n,
                    "variant": v,
                    "samples": 10,
                    "p50_us": p50 * n,
                    "p99_us": 2 * p50 * n,
                    "ratio_to_hookbus_p50": p50 / 300,
                    "quantiles_us": _quantiles(p50 * n),
                }
                for n in (1, 3)
                for v, p50 in (("hookbus", 300.0), ("python", 18_000.0), ("shell", 1_800.0))
            ],
        },
        "async_throughput": {
            **common,
            "events_per_trial": 5000,
            "rounds": 3,
            "results": [
                {
                    "scenario": key,
                    "label": key,
                    "events_per_sec": 100_000.0 * ratio,
                    "best_events_per_sec": 110_000.0 * ratio,
                    "ratio_to_floor": ratio,
                    "consumer_cpu_us_per_event": 4.0 / ratio,
                    "cpu_ratio_to_floor": ratio,
                    "trials": [{"events_per_sec": k * 100_000 * ratio} for k in (0.9, 1, 1.1)],
                }
                for key, ratio in (("floor", 1.0), ("hookbus", 0.8), ("hookbus_batches", 0.9))
            ],
            "target": {"scenario": "hookbus", "min_ratio": 0.9, "ratio": 0.8, "met": False},
        },
        "concurrency": {
            **common,
            "levels": [1, 2, 4, 8, 16, 32],
            "loops": {
                "closed": {"think_ms": 0, "think": "none"},
                "paced": {"think_ms": 20, "think": "10-30 ms"},
            },
            "results": concurrency_rows,
            "growth": {
                loop: {s: {"p50": 32.0, "p99": 32.0} for s in ("shared", "each", "floor")}
                for loop in ("closed", "paced")
            },
            "vs_floor": vs_floor,
            "target": {
                "loop": "closed",
                "agents": 32,
                "series": ["shared", "each"],
                "baseline": "floor",
                "max_ratio_p99_to_floor": 1.2,
                "min_ratio_per_sec_to_floor": 0.95,
                "ratios": vs_floor["closed"],
                "met_by": {
                    "shared": {"p99": True, "per_sec": True},
                    "each": {"p99": False, "per_sec": False},
                },
                "met": False,
            },
        },
        "http_gateway": {
            **common,
            "results": [
                {
                    "series": name,
                    "samples": 20,
                    "p50_us": p50,
                    "p99_us": 3 * p50,
                    "ratio_to_redis_p50": round(p50 / 1900, 2),
                    "ratio_to_floor_p50": round(p50 / 200, 2),
                    "quantiles_us": _quantiles(p50),
                }
                for name, p50 in [
                    ("http", 1400.0),
                    ("claude-code", 1250.0),
                    ("redis", 1900.0),
                    ("floor", 200.0),
                    ("bridge", 39000.0),
                ]
            ],
        },
        "tracing_cost": {
            "off": {"p50_us": 400.0, "p99_us": 900.0, "samples": 300},
            "on": {"p50_us": 440.0, "p99_us": 1200.0, "samples": 300},
            "floor-off": {"p50_us": 380.0, "p99_us": 800.0, "samples": 300},
            "floor-on": {"p50_us": 475.0, "p99_us": 2400.0, "samples": 300},
            "ratio_p50": 1.1,
            "ratio_p99": 1.33,
            "floor_ratio_p50": 1.25,
            "floor_ratio_p99": 3.0,
            "ratio_p50_per_batch": {"min": 0.9, "median": 1.1, "max": 1.3},
            "spans": {"expected": {"a": 900}, "received": {"a": 900}},
            "cpu_us_per_dispatch": {
                "agent-off:main": 400.0,
                "agent-on:main": 450.0,
                "agent-on:python": 20.0,
                "receiver": 10.0,
            },
            "target": {"max_ratio_p50": 1.15, "max_ratio_p99": 1.5, "met": True},
        },
    }


PAGE = f"# Performance\n\nprose\n\n{report.BEGIN}\nold figures\n{report.END}\n\nmore prose\n"


@pytest.fixture
def dirs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """Results, docs/img and the performance page in a temporary directory: a test run
    replaces no real figures."""
    results, img = tmp_path / "results", tmp_path / "docs" / "img"
    results.mkdir()
    page = tmp_path / "docs" / "performance.md"
    page.parent.mkdir()
    page.write_text(PAGE, encoding="utf-8")
    monkeypatch.setattr(plots, "RESULTS", results)
    monkeypatch.setattr(plots, "DOCS_IMG", img)
    monkeypatch.setattr(plots, "PAGE", page)
    return results, img


def write(results: Path, found: dict[str, dict[str, Any]]) -> None:
    for name, found_report in found.items():
        (results / f"{name}.json").write_text(json.dumps(found_report), encoding="utf-8")


def assert_png(path: Path) -> None:
    data = path.read_bytes()
    assert len(data) > 1000, path
    assert data.startswith(PNG_MAGIC), path


def test_quick_results_give_plots_and_a_summary(dirs: tuple[Path, Path]) -> None:
    results, img = dirs
    write(results, reports(quick=True))

    assert plots.main(["--quick"]) == 0

    for name in ALL_PLOTS:
        assert_png(results / name)
    assert not img.exists(), "quick figures must not replace the docs' plots"
    assert (img.parent / "performance.md").read_text(encoding="utf-8") == PAGE
    summary = json.loads((results / "summary.json").read_text(encoding="utf-8"))
    assert summary["quick"] is True
    assert set(summary["sources"]) == set(plots.SOURCES)
    benchmarks = {row["benchmark"] for row in summary["rows"]}
    assert {"in-process", "sync, agent", "sync, service", "command hooks", "async"} <= benchmarks
    assert {"concurrency, closed", "concurrency, paced", "tracing"} <= benchmarks
    tracing = {row["case"]: row for row in summary["rows"] if row["benchmark"] == "tracing"}
    stock = "floor (redis-py, stock OpenTelemetry SDK), tracing on"
    assert sorted(tracing) == ["1 hook over Redis, tracing on (OTLP), p50",
                               "1 hook over Redis, tracing on (OTLP), p99",
                               f"{stock}, p50", f"{stock}, p99"]  # fmt: skip
    assert [row["met"] for row in tracing.values()] == [True, True, None, None]
    floor = tracing[f"{stock}, p99"]
    assert (floor["value"], floor["baseline"], floor["ratio"]) == (2400.0, 800.0, 3.0)
    inprocess = {row["case"]: row["met"] for row in summary["rows"]
                 if row["benchmark"] == "in-process"}  # fmt: skip
    assert inprocess == {"1 no-op hook, p50": True, "3 no-op hooks, p50": True,
                         "16 no-op hooks, p50": False}  # fmt: skip
    assert "HTTP entry point" in benchmarks
    targets = {(row["benchmark"], row["case"]): (row["target"], row["met"])
               for row in summary["rows"] if row["met"] is not None}  # fmt: skip
    assert {key: value for key, value in targets.items() if key[0].startswith("concurrency")} == {
        ("concurrency, closed", "shared: p99 at 32 agents"): ("≤ 1.2x", True),
        ("concurrency, closed", "shared: dispatches/s at 32 agents"): ("≥ 0.95x", True),
        ("concurrency, closed", "each: p99 at 32 agents"): ("≤ 1.2x", False),
        ("concurrency, closed", "each: dispatches/s at 32 agents"): ("≥ 0.95x", False),
    }
    assert targets["sync, agent", "1 hook, p50"] == ("≤ 1.3x", True)
    assert targets["sync, service", "3 hooks, p50"] == ("≤ 1.2x", True)
    assert targets["async", "hookbus, events/s"] == ("≥ 0.9x", False)
    for row in summary["rows"]:
        assert row["value"] is not None and row["ratio"] is not None, row
        assert row["met"] in (True, False, None), row
    checked = [row for row in summary["rows"] if row["met"] is not None]
    assert summary["targets"]["checked"] == len(checked) > 0
    assert len(summary["targets"]["missed"]) == summary["targets"]["checked"] - sum(
        1 for row in checked if row["met"]
    )
    assert not (results / "history.jsonl").exists()


def test_full_results_are_copied_for_the_docs_and_recorded_once(dirs: tuple[Path, Path]) -> None:
    results, img = dirs
    write(results, reports(quick=False))

    assert plots.main([]) == 0
    assert plots.main([]) == 0  # the same results again: one line of history, not two

    assert {p.name for p in img.glob("*.png")} == ALL_PLOTS
    for name in ALL_PLOTS:
        assert_png(img / name)
    lines = (results / "history.jsonl").read_text(encoding="utf-8").splitlines()
    assert len(lines) == 1
    recorded = json.loads(lines[0])["ratios"]
    assert recorded["sync.agent.1"] == 1.2
    for series, (p99, per_sec) in (("shared", (1.1, 0.97)), ("each", (1.3, 0.9))):
        assert recorded[f"concurrency.closed.{series}.p99_vs_floor"] == p99
        assert recorded[f"concurrency.closed.{series}.per_sec_vs_floor"] == per_sec
    page = (img.parent / "performance.md").read_text(encoding="utf-8")
    assert page.startswith("# Performance\n\nprose\n") and page.endswith("more prose\n")
    assert "old figures" not in page
    figures = page.split(report.BEGIN)[1].split(report.END)[0]
    for heading in ("In-process dispatch", "Synchronous dispatch over Redis", "Command hooks",
                    "Async hook throughput", "Concurrent agents", "Tracing"):  # fmt: skip
        assert f"### {heading}" in figures
    assert (
        "| sync, agent | 1 hook, p50 | 300 µs | 250 µs floor | 1.20× | ≤ 1.3× | holds |" in figures
    )
    assert "| 1 | 300.0 | 900.0 | 250.0 | 700.0 | 1.20× | 1.10–1.30× |" in figures
    # The untrusted tenant's figures, beside the trusted ones (service topology only).
    assert figures.count("An untrusted agent of a tenant") == 1
    assert "| 3 | 990.0 | 2,970.0 | 900.0 | 1.10× | 1.00–1.20× | 1.32× |" in figures
    assert (
        "| sync, service | 1 hook, untrusted tenant, p50 | 330 µs | 300 µs trusted | 1.10× |"
        in figures
    )


def test_missing_results_are_skipped(dirs: tuple[Path, Path]) -> None:
    results, _ = dirs
    write(results, {"async_throughput": reports(quick=True)["async_throughput"]})

    assert plots.main([]) == 0

    assert [p.name for p in results.glob("*.png")] == ["async_throughput.png"]
    summary = json.loads((results / "summary.json").read_text(encoding="utf-8"))
    assert {row["benchmark"] for row in summary["rows"]} == {"async"}


def test_no_results_is_an_error(dirs: tuple[Path, Path]) -> None:
    assert plots.main([]) == 1
