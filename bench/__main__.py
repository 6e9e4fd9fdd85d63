"""Run every benchmark: ``python -m bench [--quick]`` from the repository root.

Each module in ``MODULES`` exposes ``main(argv) -> int``; the arguments are passed to each.
Then ``bench.plots`` draws the PNGs from ``bench/results/*.json`` and prints one summary table
of every headline figure against its target (also ``bench/results/summary.json``).
"""

from __future__ import annotations

import importlib
import sys
import time

MODULES = [
    "bench.inprocess",
    "bench.sync_dispatch",
    "bench.fixed_costs",  # CPU per operation of each process, beside the floor
    "bench.command_hooks",
    "bench.http_gateway",
    "bench.async_throughput",
    "bench.concurrency",
    "bench.tracing_cost",
    "bench.frameworks",
    "bench.mcp_proxy",
    "bench.cluster",
    "bench.cluster_saturation",
]
PLOTS = "bench.plots"  # runs last, on the results of the modules above


def main(argv: list[str]) -> int:
    status = 0
    started = time.monotonic()
    for name in [*MODULES, PLOTS]:
        print(f"== {name}", flush=True)
        status = max(status, importlib.import_module(name).main(argv))
    print(f"== all benchmarks in {time.monotonic() - started:.0f} s", flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
