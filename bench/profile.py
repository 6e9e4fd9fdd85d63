"""Sampling profiles of benchmark processes with py-spy, and a plain-text summary of them.

A benchmark that takes ``--profile DIR`` starts ``py-spy record`` on the processes it names
once they are warm, and stops it after the timed batches: each process's samples land in
``DIR/<label>.txt`` as collapsed stacks (one line per distinct stack: ``frame;frame;… count``,
``--threads`` puts the thread first; ``--gil`` keeps only the samples of the thread that holds
the GIL, so a thread waiting in ``epoll`` or on the GIL is not counted as busy). Profiled runs
are slower (py-spy reads the target's memory ~250 times a second on the same two cores): their
figures are not the benchmark's.

``python -m bench.profile FILE…`` prints, per file, the share of the samples each function
is on the stack for (inclusive) and at the top of (self), for the thread named by ``--thread``
(default: every thread); with ``--area opentelemetry/`` it shows instead where the samples
spent in that package come from.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

_FRAME = re.compile(r"^(?P<func>.*) \((?P<file>[^()]*?)(?::(?P<line>\d+))?\)$")


def py_spy() -> str:
    """The py-spy binary of this environment (the ``bench`` extra installs it)."""
    found = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(found).exists():
        raise RuntimeError("--profile needs py-spy: pip install -e '.[bench]'")
    return found


class Recorder:
    """``py-spy record`` on some processes, from ``start`` until ``stop``."""

    def __init__(self, outdir: Path, rate: int = 250, gil: bool = True) -> None:
        self.outdir = outdir
        self.rate = rate
        self.gil = gil
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        outdir.mkdir(parents=True, exist_ok=True)

    def start(self, label: str, pid: int) -> None:
        out = str(self.outdir / f"{label}.txt")
        args = [py_spy(), "record", "--pid", str(pid), "--format", "raw", "--threads",
                "--full-filenames", "--nonblocking", "--rate", str(self.rate), "-o", out,
                *(["--gil"] if self.gil else [])]  # fmt: skip
        self.procs[label] = subprocess.Popen(
            args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )

    def stop(self) -> list[Path]:
        """Stop every recorder (py-spy writes its file on SIGINT); the files written."""
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
        written = []
        for label, proc in self.procs.items():
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            path = self.outdir / f"{label}.txt"
            if path.exists():
                written.append(path)
        self.procs.clear()
        return written


def _func(frame: str) -> str:
    """``func (path)`` with the path from its package on (``opentelemetry/sdk/…``)."""
    m = _FRAME.match(frame)
    if not m:
        return frame
    file = m["file"]
    for marker in ("site-packages/", "/bench/", "/bus/", "/workers/", "/agent_adapter/"):
        if marker in file:
            tail = file.split(marker, 1)[1]
            file = tail if marker == "site-packages/" else marker[1:] + tail
            break
    else:
        if "/lib/python3" in file:  # the standard library
            file = file.split("/lib/python3", 1)[1].split("/", 1)[-1]
    return f"{m['func']} ({file})"


def load(path: Path, thread: str | None = None) -> list[tuple[list[str], int]]:
    """The stacks of ``path`` (root first) with their sample counts, for one thread or all."""
    stacks = []
    for line in path.read_text(errors="replace").splitlines():
        head, _, count = line.rpartition(" ")
        if not head or not count.isdigit():
            continue
        frames = head.split(";")
        if frames and frames[0].startswith(("thread (", "process ")):
            name = frames[0]
            frames = frames[1:]
            if thread and thread not in name:
                continue
        stacks.append(([_func(f) for f in frames], int(count)))
    return stacks


def summarize(path: Path, thread: str | None = None, top: int = 25) -> str:
    stacks = load(path, thread)
    total = sum(c for _, c in stacks)
    if not total:
        return f"{path.name}: no samples"
    inclusive: collections.Counter[str] = collections.Counter()
    own: collections.Counter[str] = collections.Counter()
    for frames, count in stacks:
        for f in set(frames):
            inclusive[f] += count
        if frames:
            own[frames[-1]] += count
    lines = [f"{path.name}: {total} samples" + (f" ({thread})" if thread else "")]
    lines.append(f"{'incl %':>7} {'self %':>7}  function")
    for func, count in inclusive.most_common(top):
        lines.append(f"{100 * count / total:7.1f} {100 * own[func] / total:7.1f}  {func}")
    lines.append("top by self:")
    for func, count in own.most_common(top // 2):
        lines.append(f"{100 * count / total:7.1f}  {func}")
    return "\n".join(lines)


def callers(path: Path, area: str, thread: str | None = None, top: int = 25) -> str:
    """Where the samples spent in ``area`` (a path prefix: ``opentelemetry/``) come from: the
    frame just outside the area, with the area's first frame."""
    stacks = load(path, thread)
    total = sum(c for _, c in stacks)
    entry: collections.Counter[str] = collections.Counter()
    inside = 0
    for frames, count in stacks:
        for i, f in enumerate(frames):
            if f"({area}" in f:
                inside += count
                entry[f"{frames[i - 1] if i else '(root)'} -> {f}"] += count
                break
    lines = [f"{path.name}: {inside} of {total} samples ({100 * inside / max(total, 1):.1f} %) "
             f"in {area}" + (f" ({thread})" if thread else "")]  # fmt: skip
    for where, count in entry.most_common(top):
        lines.append(f"{100 * count / max(total, 1):7.1f}  {where}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.profile", description=__doc__)
    parser.add_argument("files", nargs="+", type=Path)
    parser.add_argument("--thread", help="only stacks of threads whose name holds this")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--area", help="where the samples in this path prefix come from")
    args = parser.parse_args(argv)
    for path in args.files:
        with contextlib.suppress(BrokenPipeError):
            if args.area:
                print(callers(path, args.area, args.thread, args.top), end="\n\n", flush=True)
            else:
                print(summarize(path, args.thread, args.top), end="\n\n", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
