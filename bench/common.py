"""What every benchmark shares: progress lines, percentiles and writing the results file."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import math
import os
import platform
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


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


def header(benchmark: str, quick: bool) -> dict[str, Any]:
    """The fields every results file starts with: what, when, how many samples, on what."""
    return {
        "benchmark": benchmark,
        "measured_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "quick": quick,
        "python": sys.version.split()[0],
        "implementation": platform.python_implementation(),
        "machine": f"{platform.system()} {platform.machine()}",
        "cpus": os.cpu_count(),
        "load_average": (
            [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None
        ),
    }


def write_results(path: Path, report: Any) -> None:
    """Write the JSON results and say where."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(f"results written to {path}", flush=True)


def cpu_seconds(pids: Sequence[int]) -> float | None:
    """User + system CPU time of ``pids`` so far (Linux ``/proc``; None elsewhere)."""
    total = 0
    try:
        for pid in pids:
            stat = Path(f"/proc/{pid}/stat").read_text()
            fields = stat[stat.rindex(")") + 2 :].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15)
    except (OSError, ValueError, IndexError):
        return None
    return total / os.sysconf("SC_CLK_TCK")


# -- child processes -------------------------------------------------------------------------

#: How every child starts: on Linux it first asks for SIGKILL when the benchmark dies (so that a
#: benchmark killed without cleaning up leaves nothing behind), then runs its module.
BOOT = """\
import ctypes, runpy, signal, sys
try:
    ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
except Exception:
    pass
sys.argv = sys.argv[1:]
runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
"""


class Children:
    """Every process the benchmark starts, each logging to its own file; all killed at the end."""

    def __init__(self, logdir: Path) -> None:
        self.logdir = logdir
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(
        self, label: str, module: str, args: list[str], env: dict[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        """Run ``python -m module args…`` from the repository root."""
        log = open(self.logdir / f"{label}.log", "wb")  # noqa: SIM115
        try:
            proc = subprocess.Popen(
                [sys.executable, "-c", BOOT, module, *args],
                cwd=ROOT,
                env=dict(os.environ) if env is None else env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
            )
        finally:
            log.close()
        self.procs[label] = proc
        return proc

    def check(self) -> None:
        """Fail at once, with its log, if a child has exited."""
        for label, proc in self.procs.items():
            if proc.poll() is not None:
                raise RuntimeError(
                    f"{label} exited with {proc.returncode}:\n{self.log(label)[-2000:]}"
                )

    def log(self, label: str) -> str:
        path = self.logdir / f"{label}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def stop(self, labels: list[str] | None = None) -> None:
        """Terminate the children named (all by default), then kill whichever lingers."""
        chosen = {k: p for k, p in self.procs.items() if labels is None or k in labels}
        for proc in chosen.values():
            if proc.poll() is None:
                proc.terminate()
        deadline = time.monotonic() + 3
        for proc in chosen.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(max(0.0, deadline - time.monotonic()))
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        for label in chosen:
            del self.procs[label]


def hookbus_env(url: str, prefix: str) -> dict[str, str]:
    """The environment of a HookBus process of a benchmark: this one's, without its HookBus
    settings and without OpenTelemetry's (a shell's ``OTEL_EXPORTER_OTLP_ENDPOINT`` would trace
    HookBus's side and not the floor's; ``bench.tracing_cost`` adds tracing where it wants it)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HOOKBUS_", "OTEL_"))}
    return {**env, "HOOKBUS_REDIS_URL": url, "HOOKBUS_PREFIX": prefix}
