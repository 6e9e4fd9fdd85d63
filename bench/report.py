"""The figures of the latest full run as Markdown, written into ``docs/performance.md``.

``bench.plots`` calls ``write_figures`` after a full run (never after ``--quick``): it replaces
what lies between the two marker lines of the page, so the page always shows the figures of
the last run while its prose (method, explanations) stays hand-written.

Usage on its own: ``python -m bench.report`` prints the section from ``bench/results/``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

BEGIN = "<!-- figures of the latest run: written by bench/report.py; do not edit by hand -->"
END = "<!-- end of the figures of the latest run -->"
PAGE = Path(__file__).resolve().parent.parent / "docs" / "performance.md"


def _n(value: float, digits: int = 0) -> str:
    return f"{value:,.{digits}f}"


def _table(head: list[str], rows: list[list[str]], align: str) -> list[str]:
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join(align) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return [*lines, ""]


def _ms_or_us(us: float) -> str:
    return f"{us / 1000:,.1f} ms" if us >= 10_000 else f"{us:,.0f} µs"


def summary(summary: dict[str, Any]) -> list[str]:
    spread = summary.get("spread", {})
    rows = []
    for r in summary["rows"]:
        seen = spread.get(r["key"])
        many = seen and seen["runs"] > 1
        runs = f"{seen['min']:.2f}–{seen['max']:.2f}× ({seen['runs']})" if many else ""
        unit = r["unit"]
        value = f"{r['value']:,.0f}/s" if unit == "/s" else _ms_or_us(r["value"])
        if unit == "µs" and r["value"] < 100:
            value = f"{r['value']:.1f} µs"
        base = f"{r['baseline']:,.0f}/s" if unit == "/s" else _ms_or_us(r["baseline"])
        if unit == "µs" and r["baseline"] < 100:
            base = f"{r['baseline']:.1f} µs"
        verdict = "" if r["met"] is None else ("holds" if r["met"] else "**misses**")
        target = r["target"].replace("x", "×")
        rows.append([r["benchmark"], r["case"], value, f"{base} {r['baseline_label']}",
                     f"{r['ratio']:.2f}×", target, verdict, runs])  # fmt: skip
    return _table(
        ["benchmark", "case", "HookBus", "baseline", "ratio", "target", "verdict", "range (runs)"],
        rows,
        ["---", "---", "---:", "---:", "---:", "---", "---", "---:"],
    )


def inprocess(r: dict[str, Any]) -> list[str]:
    rows = [
        [str(x["hooks"]), f"{x['hookbus_p50_us']:.2f}", f"{x['hookbus_p99_us']:.2f}",
         f"{x['pluggy_p50_us']:.2f}", f"{x['ratio']:.1f}×"]
        for x in r["results"]
    ]  # fmt: skip
    out = _table(["hooks", "HookBus p50 µs", "p99 µs", "pluggy p50 µs", "ratio"], rows,
                 ["---:"] * 5)  # fmt: skip
    s = r.get("secondary")
    if s:
        out += [
            f"{s['hooks']} hooks that really suspend (`await asyncio.sleep(0)`): p50 "
            f"{s['hookbus_p50_us']:.1f} µs against {s['gather_p50_us']:.1f} µs for "
            f"`asyncio.gather` of the same coroutines ({s['ratio']:.1f}×).",
            "",
        ]
    return out


def sync(r: dict[str, Any]) -> list[str]:
    out: list[str] = []
    for name, topo in r["topologies"].items():
        out += [f"{name.capitalize()} topology ({topo['description']}):", ""]
        rows = []
        for x in topo["results"]:
            b = x.get("ratio_p50_per_batch")
            spread = f"{b['min']:.2f}–{b['max']:.2f}×" if b else ""
            rows.append([str(x["hooks"]), _n(x["hookbus_p50_us"], 1), _n(x["hookbus_p99_us"], 1),
                         _n(x["floor_p50_us"], 1), _n(x["floor_p99_us"], 1),
                         f"{x['ratio_p50']:.2f}×", spread])  # fmt: skip
        out += _table(
            ["hooks", "HookBus p50 µs", "p99 µs", "floor p50 µs", "p99 µs", "ratio p50",
             "ratio over the batches"],
            rows, ["---:"] * 7,
        )  # fmt: skip
        tenants = [x for x in topo["results"] if "tenant_p50_us" in x]
        if tenants:
            rows = []
            for x in tenants:
                b = x.get("tenant_vs_trusted_p50_per_batch")
                spread = f"{b['min']:.2f}–{b['max']:.2f}×" if b else ""
                rows.append([str(x["hooks"]), _n(x["tenant_p50_us"], 1),
                             _n(x["tenant_p99_us"], 1), _n(x["hookbus_p50_us"], 1),
                             f"{x['tenant_vs_trusted_p50']:.2f}×", spread,
                             f"{x['tenant_ratio_p50']:.2f}×"])  # fmt: skip
            out += ["An untrusted agent of a tenant, in the same alternating batches:", ""]
            out += _table(
                ["hooks", "untrusted p50 µs", "p99 µs", "trusted p50 µs", "vs trusted p50",
                 "over the batches", "vs floor p50"],
                rows, ["---:"] * 7,
            )  # fmt: skip
    ref = r.get("reference")
    if ref:
        out += [
            f"Reference: {ref['what']}, {ref['hooks']} hook: p50 {_n(ref['p50_us'])} µs, p99 "
            f"{_n(ref['p99_us'])} µs, **{ref['ratio_p50']:.2f}× the floor**.",
            "",
        ]
    return out


def commands(r: dict[str, Any]) -> list[str]:
    rows = [
        [str(x["hooks"]), x["variant"], _n(x["samples"]), _ms_or_us(x["p50_us"]),
         _ms_or_us(x["p99_us"]), f"{x['ratio_to_hookbus_p50']:.1f}×"]
        for x in r["results"]
    ]  # fmt: skip
    return _table(["hooks", "variant", "samples", "p50", "p99", "p50 vs HookBus"], rows,
                  ["---:", "---", "---:", "---:", "---:", "---:"])  # fmt: skip


def throughput(r: dict[str, Any]) -> list[str]:
    rows = [
        [x["label"], _n(x["events_per_sec"]), _n(x["best_events_per_sec"]),
         f"{x['ratio_to_floor']:.2f}×", f"{x['consumer_cpu_us_per_event']:.1f}",
         f"{x['cpu_ratio_to_floor']:.2f}×"]
        for x in r["results"]
    ]  # fmt: skip
    return _table(
        ["scenario", f"events/s (median of {r['rounds']})", "best", "ratio to floor",
         "consumer CPU µs/event", "CPU ratio"],
        rows, ["---", "---:", "---:", "---:", "---:", "---:"],
    )  # fmt: skip


def concurrency(r: dict[str, Any]) -> list[str]:
    out: list[str] = []
    by = {(x["loop"], x["agents"], x["series"]): x for x in r["results"]}
    for loop, spec in r["loops"].items():
        closed = loop == "closed"
        title = "Closed loop" if closed else f"Paced loop ({spec['think']} between calls)"
        out += [f"{title}, latencies in µs" + ("; dispatches/s = C / mean latency:" if closed
                                                else ":"), ""]  # fmt: skip
        rows = []
        for c in r["levels"]:
            cells = [str(c)]
            for series in ("shared", "each", "floor"):
                x = by.get((loop, c, series))
                cells += [_n(x["p50_us"]), _n(x["p99_us"])] if x else ["", ""]
            if closed:
                for series in ("shared", "each", "floor"):
                    x = by.get((loop, c, series))
                    cells.append(_n(x["dispatches_per_sec"]) if x else "")
            rows.append(cells)
        head = ["agents", "shared p50", "p99", "each p50", "p99", "floor p50", "p99"]
        if closed:
            head += ["shared /s", "each /s", "floor /s"]
        out += _table(head, rows, ["---:"] * len(head))
        growth = r["growth"][loop]
        out += [
            "p99(32)/p99(1): "
            + ", ".join(f"{s} {growth[s]['p99']:.2f}×" for s in ("shared", "each", "floor"))
            + "; p50(32)/p50(1): "
            + ", ".join(f"{s} {growth[s]['p50']:.2f}×" for s in ("shared", "each", "floor"))
            + ".",
            "",
        ]
    return out


def tracing(t: dict[str, Any]) -> list[str]:
    out = [f"One 1-hook dispatch over Redis, every span exported over OTLP/HTTP to a receiver "
           f"that decodes them: tracing off p50 {_n(t['off']['p50_us'])} µs / p99 "
           f"{_n(t['off']['p99_us'])} µs; on p50 {_n(t['on']['p50_us'])} µs / p99 "
           f"{_n(t['on']['p99_us'])} µs: **{t['ratio_p50']:.2f}× at p50**"]  # fmt: skip
    if "ratio_p99" in t:
        out[0] += f", **{t['ratio_p99']:.2f}× at p99**"
    b = t.get("ratio_p50_per_batch")
    if b:
        out[0] += f" (p50 ratio over the batches {b['min']:.2f}–{b['max']:.2f}×)"
    out[0] += "."
    if "floor_ratio_p50" in t:
        off, on = t["floor-off"], t["floor-on"]
        out[0] += (f" The floor (the hand-written redis-py agent and hook, traced with the stock "
                   f"OpenTelemetry SDK as its documentation shows), same spans, same receiver: "
                   f"off p50 {_n(off['p50_us'])} µs / p99 {_n(off['p99_us'])} µs; on p50 "
                   f"{_n(on['p50_us'])} µs / p99 {_n(on['p99_us'])} µs: "
                   f"**{t['floor_ratio_p50']:.2f}× at p50**, **{t['floor_ratio_p99']:.2f}× at "
                   f"p99**.")  # fmt: skip
    if "sdk_ratio_p50" in t:
        sdk = t["on-sdk"]
        out[0] += (f" HookBus with its spans sent through the SDK's span machinery, batch span "
                   f"processor and OTLP/HTTP exporter instead of its own (`on-sdk`): p50 "
                   f"{_n(sdk['p50_us'])} µs / p99 {_n(sdk['p99_us'])} µs: "
                   f"**{t['sdk_ratio_p50']:.2f}× at p50**, **{t['sdk_ratio_p99']:.2f}× at "
                   f"p99**.")  # fmt: skip
    spans = t.get("spans")
    if spans:
        got, want = sum(spans["received"].values()), sum(spans["expected"].values())
        out[0] += f" Spans received: {got:,} of {want:,}."
    out.append("")
    cpu = t.get("cpu_us_per_dispatch")
    if cpu:
        rows = []
        for role in ("agent", "worker"):
            for side, on_side, who in (("", "on", "HookBus"),
                                       ("", "on-sdk", "HookBus (the SDK's exporter)"),
                                       ("floor-", "on", "floor")):  # fmt: skip
                for thread in ("main", "python"):
                    off = cpu.get(f"{role}-{side}off:{thread}")
                    on = cpu.get(f"{role}-{side}{on_side}:{thread}")
                    if on is None:
                        continue
                    what = "event loop" if thread == "main" else "export thread"
                    rows.append([f"{who} {role}, {what}", _n(off or 0), _n(on),
                                 f"{on - (off or 0):+,.0f}"])  # fmt: skip
        rows.append(["receiver (decodes the spans)", "", _n(cpu.get("receiver", 0)), ""])
        by_side = t.get("cpu_us_per_dispatch_by_side") or {}
        for who, off, on in (("HookBus", "off", "on"), ("HookBus, the SDK's exporter", "off",
                             "on-sdk"), ("floor", "floor-off", "floor-on")):  # fmt: skip
            if on in by_side:
                rows.append([f"{who}: agent + hook process, every thread", _n(by_side[off]),
                             _n(by_side[on]), f"{by_side[on] / by_side[off]:.2f}×"])  # fmt: skip
        out += ["CPU per dispatch over the timed batches (µs):", ""]
        out += _table(["process, thread", "off", "on", "difference"], rows,
                      ["---", "---:", "---:", "---:"])  # fmt: skip
    return out


def section(results: Path) -> str:
    """The Markdown between the markers, from the JSON files in ``results``."""
    import json

    def load(name: str) -> dict[str, Any] | None:
        path = results / f"{name}.json"
        return json.loads(path.read_text(encoding="utf-8")) if path.exists() else None

    parts: list[str] = [BEGIN, ""]
    s = load("summary")
    if s:
        when = min(v for v in s["sources"].values() if v)
        parts += [f"Measured {when[:16].replace('T', ' ')} UTC onwards by `python -m bench` "
                  "(\"range\": the ratio over the last recorded full runs).", ""]  # fmt: skip
        parts += summary(s)
    for name, title, render in [
        ("inprocess", "In-process dispatch", inprocess),
        ("sync_dispatch", "Synchronous dispatch over Redis", sync),
        ("command_hooks", "Command hooks (one process per call) vs HookBus", commands),
        ("async_throughput", "Async hook throughput", throughput),
        ("concurrency", "Concurrent agents (1 hook)", concurrency),
    ]:
        r = load(name)
        if r:
            parts += [f"### {title}", "", *render(r)]
    t = load("tracing_cost")
    if t:
        parts += ["### Tracing", "", *tracing(t)]
    parts.append(END)
    return "\n".join(parts)


def write_figures(results: Path, page: Path = PAGE) -> bool:
    """Replace the figures section of ``page``; False if the page has no markers."""
    text = page.read_text(encoding="utf-8")
    if BEGIN not in text or END not in text:
        return False
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    page.write_text(head + section(results) + tail, encoding="utf-8")
    return True


if __name__ == "__main__":
    print(section(Path(__file__).resolve().parent / "results"))
    sys.exit(0)
