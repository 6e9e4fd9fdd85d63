"""Scale-out where Redis is the bottleneck: one node and a 3-master cluster, saturated.

The load is HookBus's commonest write, an event's ``XADD {p}:events:{tag}… MAXLEN ~ CAP * data
<PAYLOAD_BYTES>``, sent by ``redis-benchmark`` (C: a few hundred nanoseconds of client CPU per
command, pipelined ``pipeline`` deep over ``clients`` connections) so that the masters, not the
clients, are what limits the rate. On the cluster, ``redis-benchmark --cluster`` spreads its
connections over the masters, each writing keys of its own slots (``{tag}``).

Targets (as ``bench.cluster``): one ``redis-server`` with AOF on, and a
:class:`workers.local.redis_cluster.LocalCluster` of 3 masters + 3 replicas (AOF on).

Measured per trial, for ``requests`` commands: the rate (commands / wall time); each master's
CPU (user + system, ``/proc/PID/stat``) and commands (``INFO commandstats`` after ``CONFIG
RESETSTAT``); from those, each master's **saturation rate** (its commands per second of its own
CPU: what one master core carries at 100 %), how busy it was (CPU / wall time), and the
masters' shares of CPU and commands; the replicas' and the load generator's CPU per command.

Scale-out is shown only where the machine can show it: 3 saturated masters need 3 cores, plus
what their replicas and the load take. The report says how many cores this process may use,
how many the 3-master figure needs (from the CPU per command measured), and, if they are too few,
that the cluster's figure is bounded by cores, not by Redis; then the capacity model of
docs/scaling.md goes from the per-master saturation rate and the shares measured, never from the
rates.

Usage: ``python -m bench.cluster_saturation [--quick]``; results in
``bench/results/cluster_saturation.json``.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis as redis_py

from bench.cluster import (
    Target,
    _median,
    chosen_plan,
    cluster_target,
    median_shares,
    node_target,
    server_version,
)
from bench.common import cpu_seconds, header, progress, terminated, write_results
from bench.sync_dispatch import _dying_with_us
from bus.errors import ConfigError
from workers.local.redis_cluster import LocalCluster
from workers.local.redis_server import RedisServer

RESULTS = Path(__file__).resolve().parent / "results" / "cluster_saturation.json"
PAYLOAD_BYTES = 300  # about an encoded event of bench.cluster's (its event_bytes_mean)
CAP = 100_000  # MAXLEN ~ of each stream (the publishers' hard cap is larger; same cost)
STREAMS = 1000  # distinct stream keys per master (redis-benchmark -r)
TARGET_RATIO = 2.5  # the 3-master figure over one node's, on a machine with the cores
SATURATED = 0.8  # a master this busy (CPU seconds per second) counts as saturated
MISSING_BENCHMARK = "no redis-benchmark binary found on PATH (Debian: apt install redis-tools)"


@dataclass(frozen=True)
class Plan:
    requests: int
    clients: int
    pipeline: int
    rounds: int
    quick: bool = False


FULL = Plan(requests=600_000, clients=24, pipeline=16, rounds=3)
QUICK = Plan(requests=30_000, clients=6, pipeline=16, rounds=1, quick=True)


def cores() -> int:
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def load_command(target: Target, plan: Plan, binary: str) -> list[str]:
    port = target.masters[0][0]
    args = [binary, "-h", "127.0.0.1", "-p", str(port), "-q"]
    if target.key == "cluster":
        args.append("--cluster")
    key = "bench:events:{tag}:__rand_int__"
    return [
        *args,
        *("-c", str(plan.clients), "-n", str(plan.requests), "-P", str(plan.pipeline)),
        *("-r", str(STREAMS)),
        *("XADD", key, "MAXLEN", "~", str(CAP), "*", "data", "x" * PAYLOAD_BYTES),
    ]


def trial(target: Target, plan: Plan, binary: str) -> dict[str, Any]:
    """One run of ``plan.requests`` XADDs against ``target``."""
    admin = target.admin()
    try:
        for _, client in admin:
            client.config_resetstat()
            client.flushall()
        master_pids = [pid for _, pid in target.masters]
        master0 = [cpu_seconds([pid]) or 0.0 for pid in master_pids]
        replicas0 = cpu_seconds(target.replicas) or 0.0
        children0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.monotonic()
        done = subprocess.run(load_command(target, plan, binary), capture_output=True, text=True)
        wall = time.monotonic() - t0
        if done.returncode != 0:
            raise RuntimeError(f"redis-benchmark failed: {done.stderr.strip() or done.stdout}")
        children1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        load_cpu = (children1.ru_utime - children0.ru_utime) + (
            children1.ru_stime - children0.ru_stime
        )
        master_cpu = [
            (cpu_seconds([pid]) or 0.0) - before
            for pid, before in zip(master_pids, master0, strict=True)
        ]
        replica_cpu = (cpu_seconds(target.replicas) or 0.0) - replicas0
        calls = [_xadds(client) for _, client in admin]
        for _, client in admin:
            client.flushall()
    finally:
        for _, client in admin:
            client.close()
    total = sum(calls)
    if total == 0:
        raise RuntimeError(f"no XADD reached the masters of {target.label}")
    return {
        "commands": total,
        "seconds": round(wall, 3),
        "per_sec": round(total / wall, 1),
        "masters": [
            {
                "port": port,
                "commands": c,
                "cpu_s": round(cpu, 3),
                "busy": round(cpu / wall, 3),
                "saturation_per_sec": round(c / cpu, 1) if cpu > 0 else None,
            }
            for (port, _), c, cpu in zip(target.masters, calls, master_cpu, strict=True)
        ],
        "replicas_cpu_us_per_command": round(replica_cpu / total * 1e6, 3),
        "load_cpu_us_per_command": round(load_cpu / total * 1e6, 3),
    }


def _xadds(client: redis_py.Redis) -> int:
    stats: Any = client.info("commandstats")
    return int(stats.get("cmdstat_xadd", {}).get("calls", 0))


def summarise(trials: list[dict[str, Any]]) -> dict[str, Any]:
    masters = len(trials[0]["masters"])
    saturation = [
        _median([t["masters"][k]["saturation_per_sec"] or 0.0 for t in trials])
        for k in range(masters)
    ]
    return {
        "per_sec": _median([t["per_sec"] for t in trials]),
        "saturation_per_sec_per_master": saturation,
        "busy_per_master": [
            _median([t["masters"][k]["busy"] for t in trials]) for k in range(masters)
        ],
        "cpu_share": median_shares(trials, "cpu_s"),
        "commands_share": median_shares(trials, "commands"),
        "replicas_cpu_us_per_command": _median([t["replicas_cpu_us_per_command"] for t in trials]),
        "load_cpu_us_per_command": _median([t["load_cpu_us_per_command"] for t in trials]),
        "trials": trials,
    }


def verdict(rows: dict[str, dict[str, Any]], available: int) -> dict[str, Any]:
    """What the cluster's figure shows on this machine, and what it would take to show 2.5×."""
    out: dict[str, Any] = {
        "cores_available": available,
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }
    cluster = rows.get("cluster")
    if cluster is None:
        return out
    saturation = cluster["saturation_per_sec_per_master"]
    shares_ = cluster["commands_share"]
    # The cluster's ceiling: the master that fills first, at its share of the commands.
    ceiling = min(s / c for s, c in zip(saturation, shares_, strict=True) if c > 0)
    masters = len(saturation)
    # Cores to run that ceiling: every master busy, plus the replicas and the load at that rate.
    others = (cluster["replicas_cpu_us_per_command"] + cluster["load_cpu_us_per_command"]) / 1e6
    needed = masters + others * ceiling
    out |= {
        "masters": masters,
        "cluster_ceiling_per_sec": round(ceiling),
        "cores_needed": round(needed, 1),
        "enough_cores": available >= needed,
    }
    node = rows.get("node")
    if node is not None:
        (one,) = node["saturation_per_sec_per_master"]
        (busy,) = node["busy_per_master"]
        out |= {
            "node_saturation_per_sec": one,
            "node_busy": busy,
            "node_saturated": busy >= SATURATED,
            "measured_ratio": round(cluster["per_sec"] / node["per_sec"], 3),
            "ceiling_ratio": round(ceiling / one, 3) if one else None,
            "target_ratio": TARGET_RATIO,
        }
    return out


def run(plan: Plan, targets: dict[str, Target], binary: str) -> dict[str, Any]:
    trials: dict[str, list[dict[str, Any]]] = {k: [] for k in targets}
    for rnd in range(plan.rounds):
        order = list(targets) if rnd % 2 == 0 else list(reversed(targets))
        for key in order:
            t = trial(targets[key], plan, binary)
            trials[key].append(t)
            progress(
                f"round {rnd + 1}/{plan.rounds} {targets[key].label:<17} {t['per_sec']:>9,.0f}/s"
                f"  masters busy {[m['busy'] for m in t['masters']]}"
                f"  saturation/s {[m['saturation_per_sec'] for m in t['masters']]}"
            )
    rows = {k: summarise(v) for k, v in trials.items()}
    return {
        **header("cluster_saturation", plan.quick),
        "redis_server": server_version(next(iter(targets.values()))),
        "plan": {
            "requests_per_trial": plan.requests,
            "clients": plan.clients,
            "pipeline": plan.pipeline,
            "payload_bytes": PAYLOAD_BYTES,
            "streams": STREAMS,
            "rounds": plan.rounds,
        },
        "targets": {k: {"label": v.label, "masters": len(v.masters)} for k, v in targets.items()},
        "results": rows,
        "verdict": verdict(rows, cores()),
    }


def render(report: dict[str, Any]) -> str:
    p, v = report["plan"], report["verdict"]
    lines = [
        f"saturation: XADD of {p['payload_bytes']} B by redis-benchmark ({p['clients']} clients, "
        f"pipeline {p['pipeline']}), {p['requests_per_trial']:,} per trial, median of "
        f"{p['rounds']} (Redis {report['redis_server']}, {report['cpus']} CPUs"
        f"{', QUICK' if report['quick'] else ''})",
        f"{'target':<8} {'per s':>9} {'saturation/s per master':>30} {'busy':>18} "
        f"{'CPU share':>18}",
    ]
    for key, r in report["results"].items():
        lines.append(
            f"{key:<8} {r['per_sec']:>9,.0f} "
            f"{'/'.join(f'{s:,.0f}' for s in r['saturation_per_sec_per_master']):>30} "
            f"{'/'.join(f'{b:.2f}' for b in r['busy_per_master']):>18} "
            f"{'/'.join(f'{s:.2f}' for s in r['cpu_share']):>18}"
        )
    if "measured_ratio" in v:
        lines.append(
            f"cluster / node: {v['measured_ratio']:.2f}x measured; its masters' ceiling "
            f"{v['cluster_ceiling_per_sec']:,}/s = {v['ceiling_ratio']:.2f}x one node's "
            f"saturation rate"
        )
    if "node_saturated" in v and not v["node_saturated"]:
        lines.append(
            f"one node was busy {v['node_busy']:.2f} of a core, not saturated: this machine's "
            f"cores were taken by other processes (load average {v['load_average'][0]:.1f} on "
            f"{v['cores_available']} cores); the saturation rates (commands per CPU-second of "
            "each master) stand, the rates per second are not ceilings"
        )
    if "cores_needed" in v:
        if v["enough_cores"]:
            lines.append(
                f"cores: {v['cores_available']} available, {v['cores_needed']} needed: the "
                f"measured ratio is the scale-out (target {TARGET_RATIO}x)"
            )
        else:
            lines.append(
                f"cores: {v['cores_available']} available, {v['cores_needed']} needed for "
                f"{v['masters']} saturated masters with their replicas and the load: this "
                "machine cannot show the cluster's scale-out; the measured ratio is bounded by "
                "cores, not Redis. Capacity comes from the saturation rate per master and the "
                "shares above (docs/scaling.md)."
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.cluster_saturation", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="few commands, one round")
    parser.add_argument("--rounds", type=int, help=f"rounds (default {FULL.rounds}; quick: 1)")
    parser.add_argument("--only", choices=["node", "cluster"], help="one target")
    args = parser.parse_args(argv)
    plan = chosen_plan(parser, args, QUICK, FULL)
    binary = shutil.which("redis-benchmark")
    if binary is None:
        raise ConfigError(MISSING_BENCHMARK)
    previous = signal.signal(signal.SIGTERM, terminated)
    with tempfile.TemporaryDirectory(prefix="hookbus-bench-") as logdir:
        server = RedisServer(extra=["--appendonly", "yes"])
        cluster = LocalCluster(node_timeout_ms=5000)
        for node in [server, *cluster.nodes]:
            node.binary = _dying_with_us(node.binary, Path(logdir))
        try:
            targets: dict[str, Target] = {}
            if args.only != "cluster":
                server.start()
                targets["node"] = node_target(server)
            if args.only != "node":
                cluster.start()
                targets["cluster"] = cluster_target(cluster)
            result = run(plan, targets, binary)
        finally:
            cluster.close()
            server.close()
            signal.signal(signal.SIGTERM, previous)
    print(render(result), flush=True)
    write_results(RESULTS, result)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
