"""Plots and one summary table of the latest benchmark results.

Reads ``bench/results/*.json`` (whichever benchmarks have run), writes PNGs beside them with
matplotlib (Agg, no display needed):

``sync_dispatch_cdf.png``
    latency CDFs of synchronous dispatch, HookBus vs the raw redis-py floor, 1/3/8 hooks, both
    topologies (from the 101 quantiles per series that ``bench.sync_dispatch`` saves).
``async_throughput.png``
    events/s of each async scenario (median, and the range over rounds) against the floor and
    the target.
``concurrency.png``
    p50 and p99 against the number of concurrent agents, closed and paced loops.
``command_hooks.png``
    p50 and p99 of command hooks (one process per call) beside HookBus, 1 and 3 hooks.
``inprocess.png``
    in-process dispatch, HookBus vs pluggy.

After a full run (no input marked ``quick``) the PNGs are copied to ``docs/img/`` for
``docs/performance.md``. Then it prints one table of every headline figure and its target, and
writes it to ``bench/results/summary.json``; each full run's headline ratios are also appended to
``bench/results/history.jsonl`` (one line per run), and the table shows their range over the
recorded runs, since one run on a shared machine is one draw.

Usage: ``python -m bench.plots`` (``python -m bench`` runs it last; ``--quick`` is accepted
and changes nothing but the label).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.common import ROOT
from bench.report import PAGE, write_figures

RESULTS = Path(__file__).resolve().parent / "results"
DOCS_IMG = ROOT / "docs" / "img"
SOURCES = (
    "inprocess",
    "sync_dispatch",
    "command_hooks",
    "http_gateway",
    "async_throughput",
    "concurrency",
    "tracing_cost",
)
HISTORY_RUNS = 10  # the range in the table is over at most this many recorded runs

COLORS = {1: "tab:blue", 3: "tab:orange", 8: "tab:green"}
SERIES_COLORS = {"shared": "tab:blue", "each": "tab:orange", "floor": "tab:gray"}


def load(results: Path) -> dict[str, dict[str, Any]]:
    """Every ``{source}.json`` in ``results`` that parses, by source name."""
    found = {}
    for name in SOURCES:
        path = results / f"{name}.json"
        try:
            found[name] = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
    return found


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _thousands() -> Any:
    from matplotlib.ticker import FuncFormatter

    return FuncFormatter(lambda x, _: f"{x:,.0f}")


def _log_axis(ax: Any, which: str, fmt: str = "{:,.0f}") -> None:
    """A log scale on the ``which`` ("x" or "y") axis of ``ax``, labelled in plain numbers at 1,
    2 and 5 of each decade."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    if which == "x":
        ax.set_xscale("log")
        axis = ax.xaxis
    else:
        ax.set_yscale("log")
        axis = ax.yaxis
    axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    axis.set_major_formatter(FuncFormatter(lambda x, _: fmt.format(x)))
    axis.set_minor_formatter(NullFormatter())


def _footer(fig: Any, report: dict[str, Any]) -> None:
    bits = [
        f"Python {report['python']}" if "python" in report else "",
        f"redis-server {report['redis_server']}" if "redis_server" in report else "",
        f"{report['cpus']} CPUs" if "cpus" in report else "",
        f"measured {report['measured_at']}" if "measured_at" in report else "",
        "QUICK RUN (few samples)" if report.get("quick") else "",
    ]
    fig.text(0.01, 0.01, ", ".join(b for b in bits if b), fontsize=7, color="dimgray")


# -- the plots ---------------------------------------------------------------------------------


def plot_sync_cdf(report: dict[str, Any], out: Path) -> bool:
    topologies = report.get("topologies", {})
    if not any(r.get("quantiles_us") for t in topologies.values() for r in t["results"]):
        return False  # results from before bench.sync_dispatch saved quantiles
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(topologies), figsize=(12, 4.8), sharey=True, squeeze=False)
    for ax, (name, topo) in zip(axes[0], topologies.items(), strict=True):
        for r in topo["results"]:
            q = r.get("quantiles_us")
            if not q:
                continue
            color = COLORS.get(r["hooks"])
            for series, style in (("hookbus", "-"), ("floor", "--"), ("tenant", ":")):
                if series not in q:  # the untrusted tenant: service topology only
                    continue
                values = q[series]
                fractions = [i / (len(values) - 1) for i in range(len(values))]
                label = f"{r['hooks']} hook{'s' if r['hooks'] > 1 else ''}, {series}"
                if series == "hookbus":
                    label += f" ({r['ratio_p50']:.2f}x at p50)"
                if series == "tenant":
                    label = (
                        f"{r['hooks']} hook{'s' if r['hooks'] > 1 else ''}, untrusted tenant "
                        f"({r['tenant_vs_trusted_p50']:.2f}x trusted at p50)"
                    )
                ax.plot(values, fractions, style, color=color, label=label, linewidth=1.4)
        ref = report.get("reference") or {}
        if name == "agent" and ref.get("quantiles_us"):
            values = ref["quantiles_us"]
            fractions = [i / (len(values) - 1) for i in range(len(values))]
            label = f"1 hook, FastStream request() ({ref['ratio_p50']:.2f}x floor at p50)"
            ax.plot(values, fractions, ":", color="tab:red", label=label, linewidth=1.4)
        ax.axhline(0.5, color="lightgray", linewidth=0.8, zorder=0)
        ax.axhline(0.99, color="lightgray", linewidth=0.8, zorder=0)
        _log_axis(ax, "x")
        ax.set_xlabel("latency of one PreToolUse decision (µs, log scale)")
        t = topo.get("target", {})
        verdict = "holds" if t.get("met") else "misses"
        ax.set_title(
            f"{name} topology: target p50 ≤ {t.get('max_ratio_p50', 1.3):g}x floor {verdict}",
            fontsize=10,
        )
        ax.grid(True, which="both", alpha=0.25)
        ax.legend(fontsize=7, loc="lower right")
    axes[0][0].set_ylabel("fraction of calls at or below")
    fig.suptitle(
        "Synchronous dispatch over Redis: HookBus (solid) vs raw redis-py floor (dashed); "
        "untrusted tenant (dotted)"
    )
    return _save(plt, fig, report, out)


def _save(plt: Any, fig: Any, report: dict[str, Any], out: Path) -> bool:
    """Footer, layout, PNG, close: the end of every plot."""
    _footer(fig, report)
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return True


def plot_async(report: dict[str, Any], out: Path) -> bool:
    rows = report.get("results") or []
    if not rows:
        return False
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.5))
    labels = [r["label"] for r in rows]
    medians = [r["events_per_sec"] for r in rows]
    lows = [min(t["events_per_sec"] for t in r["trials"]) for r in rows]
    highs = [max(t["events_per_sec"] for t in r["trials"]) for r in rows]
    errors = [
        [max(0.0, m - lo) for m, lo in zip(medians, lows, strict=True)],
        [max(0.0, hi - m) for m, hi in zip(medians, highs, strict=True)],
    ]
    colors = ["tab:gray" if r["scenario"] == "floor" else "tab:blue" for r in rows]
    bars = ax.bar(labels, medians, color=colors, yerr=errors, capsize=6)
    for bar, r in zip(bars, rows, strict=True):
        ax.annotate(
            f"{r['events_per_sec']:,.0f}/s\n{r['ratio_to_floor']:.2f}x floor",
            (bar.get_x() + bar.get_width() / 2, bar.get_height() / 2),
            ha="center",
            va="center",
            fontsize=9,
            color="white",
            fontweight="bold",
        )
    floor = next((r for r in rows if r["scenario"] == "floor"), None)
    t = report.get("target", {})
    if floor is not None and t:
        line = t["min_ratio"] * floor["events_per_sec"]
        ax.axhline(line, color="tab:red", linestyle="--", linewidth=1)
        ax.text(
            -0.4,
            line,
            f" target: {t['min_ratio']:g}x floor",
            color="tab:red",
            ha="left",
            va="bottom",
            fontsize=8,
            bbox={"facecolor": "white", "edgecolor": "none", "pad": 1},
        )
    ax.yaxis.set_major_formatter(_thousands())
    ax.set_ylabel("events/s handled by both consumer groups")
    ax.set_title(
        f"Async hooks: {report.get('events_per_trial', 0):,} events per trial, "
        f"median of {report.get('rounds', '?')} rounds (bars: min–max)",
        fontsize=10,
    )
    ax.grid(True, axis="y", alpha=0.25)
    return _save(plt, fig, report, out)


def plot_concurrency(report: dict[str, Any], out: Path) -> bool:
    rows = report.get("results") or []
    if not rows:
        return False
    plt = _pyplot()
    loops = list(report.get("loops") or {"closed": {}})
    fig, axes = plt.subplots(1, len(loops), figsize=(12, 4.8), squeeze=False)
    levels = report.get("levels") or sorted({r["agents"] for r in rows})
    for ax, loop in zip(axes[0], loops, strict=True):
        for series, color in SERIES_COLORS.items():
            mine = sorted(
                (r for r in rows if r.get("loop", "closed") == loop and r["series"] == series),
                key=lambda r: r["agents"],
            )
            if not mine:
                continue
            x = [r["agents"] for r in mine]
            for pct, style in (("p50", "o-"), ("p99", "s--")):
                y = [r[f"{pct}_us"] / 1000 for r in mine]
                ax.plot(x, y, style, color=color, label=f"{series} {pct}")
        t = report.get("target") or {}
        vs = (report.get("vs_floor") or {}).get(loop)
        ax.set_xscale("log", base=2)
        ax.set_xticks(levels, [str(level) for level in levels])
        _log_axis(ax, "y", "{:g}")
        ax.set_xlabel("concurrent agents")
        ax.set_ylabel("latency of one PreToolUse decision (ms, log scale)")
        think = (report.get("loops") or {}).get(loop, {}).get("think", "")
        title = f"{loop} loop" + (f" (pause: {think})" if think else "")
        if vs:  # results from before the targets were against the floor have none
            top = max(levels)
            ratios = "; ".join(
                f"{k} p99 {v['p99']:.2f}x" + (f", /s {v['per_sec']:.2f}x" if "per_sec" in v else "")
                for k, v in vs.items()
            )
            title += f"\nat {top} agents over the floor: {ratios}"
            if t.get("loop") == loop:
                title += (
                    f"\ntarget: p99 ≤ {t['max_ratio_p99_to_floor']:g}x, "
                    f"/s ≥ {t['min_ratio_per_sec_to_floor']:g}x the floor's "
                    f"({'holds' if t.get('met') else 'misses'})"
                )
        ax.set_title(title, fontsize=9)
        ax.grid(True, which="both", alpha=0.25)
        ax.legend(fontsize=7, ncol=3, loc="best")
    fig.suptitle("Synchronous dispatch with concurrent agents, 1 hook")
    return _save(plt, fig, report, out)


def plot_commands(report: dict[str, Any], out: Path) -> bool:
    rows = report.get("results") or []
    if not rows:
        return False
    plt = _pyplot()
    variants = list(dict.fromkeys(r["variant"] for r in rows))
    counts = sorted({r["hooks"] for r in rows})
    by = {(r["hooks"], r["variant"]): r for r in rows}
    fig, ax = plt.subplots(figsize=(8, 4.5))
    width = 0.8 / len(variants)
    palette = {"hookbus": "tab:blue", "python": "tab:red", "shell": "tab:purple"}
    for i, variant in enumerate(variants):
        xs, p50s, p99s = [], [], []
        for j, n in enumerate(counts):
            r = by.get((n, variant))
            if r is None:
                continue
            xs.append(j + (i - (len(variants) - 1) / 2) * width)
            p50s.append(r["p50_us"] / 1000)
            p99s.append(r["p99_us"] / 1000)
        bars = ax.bar(xs, p50s, width, label=f"{variant} p50", color=palette.get(variant))
        ax.plot(xs, p99s, "k_", markersize=14, label="p99" if i == 0 else None)
        for bar, p50 in zip(bars, p50s, strict=True):
            ax.annotate(
                f"{p50:.2f} ms" if p50 < 10 else f"{p50:.0f} ms",
                (bar.get_x() + bar.get_width() / 2, p50),
                ha="center",
                va="top",
                fontsize=8,
                color="white",
                fontweight="bold",
                xytext=(0, -3),
                textcoords="offset points",
            )
    ax.set_xticks(range(len(counts)), [f"{n} hook{'s' if n > 1 else ''}" for n in counts])
    ax.set_yscale("log")
    ax.set_ylim(bottom=min(r["p50_us"] for r in rows) / 1000 / 2.5)
    ax.set_ylabel("latency of one PreToolUse decision (ms, log scale)")
    ax.set_title(
        "Command hooks (one process per hook per call, JSON on stdin/stdout) vs HookBus",
        fontsize=10,
    )
    ax.grid(True, axis="y", which="both", alpha=0.25)
    ax.legend(fontsize=8)
    return _save(plt, fig, report, out)


def plot_inprocess(report: dict[str, Any], out: Path) -> bool:
    rows = report.get("results") or []
    if not rows:
        return False
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.5))
    xs = range(len(rows))
    ax.bar([x - 0.2 for x in xs], [r["hookbus_p50_us"] for r in rows], 0.4, label="hookbus p50")
    ax.bar(
        [x + 0.2 for x in xs],
        [r["pluggy_p50_us"] for r in rows],
        0.4,
        label="pluggy p50 (floor)",
        color="tab:gray",
    )
    ax.plot([x - 0.2 for x in xs], [r["hookbus_p99_us"] for r in rows], "k_", markersize=14)
    ax.plot(
        [x + 0.2 for x in xs], [r["pluggy_p99_us"] for r in rows], "k_", markersize=14, label="p99"
    )
    ax.set_xticks(list(xs), [f"{r['hooks']} hook{'' if r['hooks'] == 1 else 's'}" for r in rows])
    ax.set_ylabel("latency of one run_pre_tool_use (µs)")
    t = report.get("target", {})
    ax.set_title(
        f"In-process dispatch; target: p50 ≤ {t.get('max_ratio', 2):g}x pluggy at 1, 3 and 16 "
        f"hooks ({'holds' if t.get('met') else 'misses'})",
        fontsize=10,
    )
    ax.grid(True, axis="y", alpha=0.25)
    ax.legend(fontsize=8)
    return _save(plt, fig, report, out)


PLOTS: dict[str, tuple[str, Callable[[dict[str, Any], Path], bool]]] = {
    "sync_dispatch": ("sync_dispatch_cdf.png", plot_sync_cdf),
    "async_throughput": ("async_throughput.png", plot_async),
    "concurrency": ("concurrency.png", plot_concurrency),
    "command_hooks": ("command_hooks.png", plot_commands),
    "inprocess": ("inprocess.png", plot_inprocess),
}


# -- the summary table -------------------------------------------------------------------------


def _row(
    bench: str,
    case: str,
    value: float | None,
    baseline: float | None,
    unit: str,
    baseline_label: str,
    ratio: float | None = None,
    target: str = "",
    met: bool | None = None,
    key: str = "",
) -> dict[str, Any]:
    if ratio is None and value and baseline:
        ratio = round(value / baseline, 2)
    return {
        "benchmark": bench,
        "case": case,
        "value": value,
        "baseline": baseline,
        "baseline_label": baseline_label,
        "unit": unit,
        "ratio": ratio,
        "target": target,
        "met": met,
        "key": key,
    }


def concurrency_rows(r: dict[str, Any]) -> list[dict[str, Any]]:
    """Per loop, each HookBus series at the highest level against the floor at that level: p99,
    and in the closed loop dispatches/s; the target's loop with its targets. Results from before
    the targets were against the floor give rows without a target."""
    rows: list[dict[str, Any]] = []
    t = r.get("target") or {}
    has_target = "max_ratio_p99_to_floor" in t
    top = max(r["levels"])
    by = {(x.get("loop", "closed"), x["agents"], x["series"]): x for x in r["results"]}
    for loop in r.get("loops") or {"closed": {}}:
        targeted = has_target and loop == t["loop"]
        floor = by[loop, top, "floor"]
        for series in ("shared", "each"):
            x = by[loop, top, series]
            ratios = (t.get("ratios") or {}).get(series, {}) if targeted else {}
            met = (t.get("met_by") or {}).get(series, {}) if targeted else {}
            p99_limit = t.get("max_ratio_p99_to_floor")
            rows.append(
                _row(
                    f"concurrency, {loop}",
                    f"{series}: p99 at {top} agents",
                    x["p99_us"],
                    floor["p99_us"],
                    "µs",
                    "floor",
                    ratios.get("p99"),
                    f"≤ {p99_limit:g}x" if targeted else "",
                    met.get("p99") if targeted else None,
                    f"concurrency.{loop}.{series}.p99_vs_floor",
                )
            )
            if x.get("dispatches_per_sec") is None or not floor.get("dispatches_per_sec"):
                continue  # the paced loop: the agents set the pace
            per_sec_limit = t.get("min_ratio_per_sec_to_floor")
            rows.append(
                _row(
                    f"concurrency, {loop}",
                    f"{series}: dispatches/s at {top} agents",
                    x["dispatches_per_sec"],
                    floor["dispatches_per_sec"],
                    "/s",
                    "floor",
                    ratios.get("per_sec"),
                    f"≥ {per_sec_limit:g}x" if targeted else "",
                    met.get("per_sec") if targeted else None,
                    f"concurrency.{loop}.{series}.per_sec_vs_floor",
                )
            )
    return rows


def summary_rows(reports: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    r = reports.get("inprocess")
    if r:
        t = r.get("target", {})
        limit = t.get("max_ratio")  # older results: a p50 in µs for 3 hooks instead
        sizes = t.get("hooks") if isinstance(t.get("hooks"), list) else [t.get("hooks")]
        for x in r["results"]:
            if x["hooks"] not in (1, 3, 16):
                continue
            is_target = x["hooks"] in sizes
            if limit is not None:
                target, met = f"≤ {limit:g}x", x["ratio"] <= limit
            else:
                target, met = f"≤ {t['max_p50_us']:g} µs", t.get("met")
            rows.append(
                _row(
                    "in-process",
                    f"{x['hooks']} no-op hook{'' if x['hooks'] == 1 else 's'}, p50",
                    x["hookbus_p50_us"],
                    x["pluggy_p50_us"],
                    "µs",
                    "pluggy",
                    x["ratio"],
                    target if is_target else "",
                    met if is_target else None,
                    f"inprocess.{x['hooks']}",
                )
            )
    r = reports.get("sync_dispatch")
    if r:
        for name, topo in r["topologies"].items():
            t = topo["target"]
            for x in topo["results"]:
                is_target = x["hooks"] in t["hooks"]
                rows.append(
                    _row(
                        f"sync, {name}",
                        f"{x['hooks']} hook{'s' if x['hooks'] > 1 else ''}, p50",
                        x["hookbus_p50_us"],
                        x["floor_p50_us"],
                        "µs",
                        "floor",
                        x["ratio_p50"],
                        f"≤ {t['max_ratio_p50']:g}x" if is_target else "",
                        x["ratio_p50"] <= t["max_ratio_p50"] if is_target else None,
                        f"sync.{name}.{x['hooks']}",
                    )
                )
                if "tenant_p50_us" in x:
                    rows.append(
                        _row(
                            f"sync, {name}",
                            f"{x['hooks']} hook{'s' if x['hooks'] > 1 else ''}, untrusted "
                            "tenant, p50",
                            x["tenant_p50_us"],
                            x["hookbus_p50_us"],
                            "µs",
                            "trusted",
                            x["tenant_vs_trusted_p50"],
                            "",
                            None,
                            f"sync.{name}.tenant.{x['hooks']}",
                        )
                    )
        ref = r.get("reference")
        if ref:
            rows.append(
                _row(
                    "sync, agent",
                    "FastStream request(), 1 hook, p50",
                    ref["p50_us"],
                    ref["floor_p50_us"],
                    "µs",
                    "floor",
                    ref["ratio_p50"],
                )
            )
    r = reports.get("command_hooks")
    if r:
        hookbus = {x["hooks"]: x for x in r["results"] if x["variant"] == "hookbus"}
        for x in r["results"]:
            if x["variant"] == "hookbus" or x["hooks"] not in hookbus:
                continue
            rows.append(
                _row(
                    "command hooks",
                    f"{x['variant']}, {x['hooks']} hook{'s' if x['hooks'] > 1 else ''}, p50",
                    x["p50_us"],
                    hookbus[x["hooks"]]["p50_us"],
                    "µs",
                    "hookbus",
                    x["ratio_to_hookbus_p50"],
                )
            )
    r = reports.get("http_gateway")
    if r:
        by = {x["series"]: x for x in r["results"]}
        for name in ("http", "claude-code", "redis", "bridge"):
            x = by[name]
            rows.append(
                _row(
                    "HTTP entry point",
                    f"{name}, 1 hook, p50",
                    x["p50_us"],
                    by["floor"]["p50_us"],
                    "µs",
                    "Starlette floor",
                    x["ratio_to_floor_p50"],
                    key=f"http.{name}",
                )
            )
    r = reports.get("async_throughput")
    if r:
        floor = next(x for x in r["results"] if x["scenario"] == "floor")
        t = r["target"]
        for x in r["results"]:
            if x["scenario"] == "floor":
                continue
            is_target = x["scenario"] == t["scenario"]
            rows.append(
                _row(
                    "async",
                    f"{x['label']}, events/s",
                    x["events_per_sec"],
                    floor["events_per_sec"],
                    "/s",
                    "floor",
                    x["ratio_to_floor"],
                    f"≥ {t['min_ratio']:g}x" if is_target else "",
                    x["ratio_to_floor"] >= t["min_ratio"] if is_target else None,
                    f"async.{x['scenario']}",
                )
            )
    r = reports.get("concurrency")
    if r:
        rows += concurrency_rows(r)
    r = reports.get("tracing_cost")
    if r and "on" in r:
        t = r.get("target") or {}
        series = (
            ("", "1 hook over Redis, tracing on (OTLP)", "on", "off", "tracing off", "tracing"),
            ("sdk_", "1 hook over Redis, tracing on, through the SDK's exporter", "on-sdk", "off",
             "tracing off", "tracing.sdk"),
            ("floor_", "floor (redis-py, stock OpenTelemetry SDK), tracing on", "floor-on",
             "floor-off", "floor, tracing off", "tracing.floor"),
        )  # fmt: skip
        for prefix, case, on, off, baseline, key in series:
            for pct in ("p50", "p99"):
                ratio = r.get(f"{prefix}ratio_{pct}")
                if ratio is None:  # results from before the p99 (or the floor) was measured
                    continue
                limit = None if prefix else t.get(f"max_ratio_{pct}")  # the floor: no target
                rows.append(
                    _row(
                        "tracing",
                        f"{case}, {pct}",
                        round(r[on][f"{pct}_us"], 1),
                        round(r[off][f"{pct}_us"], 1),
                        "µs",
                        baseline,
                        round(ratio, 2),
                        f"≤ {limit:g}x" if limit else "",
                        ratio <= limit if limit else None,
                        f"{key}.{pct}",
                    )
                )
    return rows


def _fmt(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    if unit == "/s":
        return f"{value:,.0f}/s"
    if value >= 10_000:
        return f"{value / 1000:,.1f} ms"
    return f"{value:,.1f} µs" if value < 100 else f"{value:,.0f} µs"


def history(
    results: Path, rows: list[dict[str, Any]], sources: dict[str, Any], record: bool
) -> dict[str, list[float]]:
    """Append this run's keyed ratios to ``history.jsonl`` (full runs only, once per set of
    results); the ratios of the last ``HISTORY_RUNS`` recorded runs, by key."""
    path = results / "history.jsonl"
    keyed = {row["key"]: row["ratio"] for row in rows if row["key"] and row["ratio"] is not None}
    past: list[dict[str, Any]] = []
    if path.exists():
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                past.append(json.loads(line))
            except ValueError:
                continue
    if record and keyed and not any(e.get("sources") == sources for e in past):
        entry = {
            "at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "sources": sources,
            "ratios": keyed,
        }
        with path.open("a", encoding="utf-8") as f:
            f.write(json.dumps(entry) + "\n")
        past.append(entry)
    spread: dict[str, list[float]] = {}
    for entry in past[-HISTORY_RUNS:]:
        for key, value in entry.get("ratios", {}).items():
            spread.setdefault(key, []).append(value)
    return spread


def render(rows: list[dict[str, Any]], spread: dict[str, list[float]], quick: list[str]) -> str:
    width = max([38, *(len(row["case"]) for row in rows)])  # the case column
    head = (
        f"{'benchmark':<20} {'case':<{width}} {'hookbus':>11} {'baseline':>21} {'ratio':>7} "
        f"{'target':>9} {'verdict':>13} {'runs: range':>15}"
    )
    lines = [
        "SUMMARY"
        + (f" (QUICK results of {', '.join(quick)}: few samples, not figures)" if quick else ""),
        head,
        "-" * len(head),
    ]
    for row in rows:
        verdict = "" if row["met"] is None else ("holds" if row["met"] else "misses")
        seen = spread.get(row["key"], [])
        runs = f"{len(seen)}: {min(seen):.2f}-{max(seen):.2f}x" if len(seen) > 1 else ""
        baseline = f"{_fmt(row['baseline'], row['unit'])} {row['baseline_label']}"
        ratio = f"{row['ratio']:.2f}x" if row["ratio"] is not None else "-"
        lines.append(
            f"{row['benchmark']:<20} {row['case']:<{width}} {_fmt(row['value'], row['unit']):>11} "
            f"{baseline:>21} {ratio:>7} {row['target']:>9} {verdict:>13} {runs:>15}"
        )
    lines.append(
        "ratio: hookbus over its baseline (for command hooks: the command over hookbus; for "
        "concurrency: at 32 agents over the floor at 32); runs: range over the recorded full runs"
    )
    return "\n".join(lines)


# -- the step ----------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.plots", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="accepted for python -m bench")
    parser.parse_args(argv)

    reports = load(RESULTS)
    if not reports:
        print(f"no results in {RESULTS}: run python -m bench first", flush=True)
        return 1
    quick_sources = [name for name, r in reports.items() if r.get("quick")]
    quick = bool(quick_sources)
    written: list[Path] = []
    for source, (filename, plot) in PLOTS.items():
        report = reports.get(source)
        if report is None:
            continue
        out = RESULTS / filename
        try:
            made = plot(report, out)
        except (KeyError, TypeError, ValueError) as exc:  # an older or partial result file
            print(f"  {filename}: skipped, {source}.json lacks what it needs ({exc!r})")
            continue
        if made:
            written.append(out)
    copied: list[Path] = []
    if not quick:
        DOCS_IMG.mkdir(parents=True, exist_ok=True)
        for path in written:
            shutil.copyfile(path, DOCS_IMG / path.name)
            copied.append(DOCS_IMG / path.name)

    rows = summary_rows(reports)
    sources = {name: r.get("measured_at") for name, r in reports.items()}
    spread = history(RESULTS, rows, sources, record=not quick)
    targets = [r for r in rows if r["met"] is not None]
    summary = {
        "benchmark": "summary",
        "generated_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "quick": quick,
        "quick_sources": quick_sources,
        "sources": sources,
        "rows": rows,
        "targets": {
            "checked": len(targets),
            "met": sum(1 for r in targets if r["met"]),
            "missed": [f"{r['benchmark']}: {r['case']}" for r in targets if not r["met"]],
        },
        "spread": {k: {"runs": len(v), "min": min(v), "max": max(v)} for k, v in spread.items()},
        "plots": [str(p) for p in written],
        "docs_img": [str(p) for p in copied],
    }
    (RESULTS / "summary.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    print(render(rows, spread, quick_sources), flush=True)
    print(f"plots: {', '.join(str(p) for p in written) or 'none'}", flush=True)
    if copied:
        print(f"copied for docs/performance.md to {DOCS_IMG}", flush=True)
    print(f"summary written to {RESULTS / 'summary.json'}", flush=True)
    if not quick:
        try:
            if write_figures(RESULTS, PAGE):
                print(f"figures written to {PAGE}", flush=True)
        except (KeyError, TypeError, ValueError) as exc:  # an older or partial result file
            print(f"  {PAGE.name}: not updated, a result file lacks what it needs ({exc!r})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
