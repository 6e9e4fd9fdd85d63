"""What every benchmark shares: progress lines, percentiles and writing the results file."""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Plan:
    """How many calls to make: ``rounds`` alternating batches of ``batch`` calls each."""

    warmup: int
    rounds: int
    batch: int

    @property
    def samples(self) -> int:
        return self.rounds * self.batch


def terminated(signum: int, frame: object) -> None:
    """SIGTERM handler: exit through ``finally`` blocks, so children are stopped."""
    raise SystemExit(128 + signum)


def progress(text: str) -> None:
    """One timestamped progress line (benchmarks take minutes)."""
    print(f"  [{time.strftime('%H:%M:%S')}] {text}", flush=True)


def percentiles(samples: list[int]) -> tuple[float, float]:
    """(median, p99) in microseconds of samples in nanoseconds; p99 by nearest rank."""
    ordered = sorted(samples)
    n = len(ordered)
    mid = n // 2
    p50 = ordered[mid] if n % 2 else (ordered[mid - 1] + ordered[mid]) / 2
    p99 = ordered[max(0, math.ceil(0.99 * n) - 1)]
    return p50 / 1000, p99 / 1000


def write_results(path: Path, report: Any) -> None:
    """Write the JSON results and say where."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(f"results written to {path}", flush=True)
