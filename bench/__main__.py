"""Run every benchmark: ``python -m bench [--quick]`` from the repository root.

Each module in ``MODULES`` exposes ``main(argv) -> int``; the arguments are passed to each.
"""

from __future__ import annotations

import importlib
import sys

MODULES = ["bench.inprocess", "bench.sync_dispatch", "bench.async_throughput", "bench.tracing_cost"]


def main(argv: list[str]) -> int:
    status = 0
    for name in MODULES:
        print(f"== {name}", flush=True)
        status = max(status, importlib.import_module(name).main(argv))
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
