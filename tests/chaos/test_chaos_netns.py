"""Faults across hosts: the agent, Redis and the workers each in a network namespace of their own.

Topology (one set of namespaces per test, named ``hb-<role>-<random>``, always deleted at the
end): a switch namespace holds a Linux bridge, and every other namespace is one "host" joined
to it by a veth pair, on 10.18.0.0/24 —

* ``redis`` (10.18.0.2): ``redis-server``;
* ``proxy`` (10.18.0.3): the latency relay, when a case wants latency;
* ``agent`` (10.18.0.10): ``python -m tests.chaos.netns_agent``, closed-loop agents asking the
  ``fail`` hook Guard through a ``HookClient`` plus a publisher that keeps the id of every
  event Redis acknowledged (see that module);
* ``worker1`` (10.18.0.21) and ``worker2`` (10.18.0.22): one Guard replica and one replica of
  the async hook Ledger each, as ``hookbus worker`` processes.

No traffic of the bus leaves these namespaces: the test process only starts processes in them,
applies faults, and reads the files the agent writes.

Cases: a worker cut off from Redis (the other namespace's replicas take over, and the cut one
comes back after healing); the agent cut off (its decisions fail closed within their deadline);
50 ms one-way latency on every path to Redis; 5 % packet loss in and out of Redis's host. In
each, no decision outlives its deadline (plus the scheduling slack of the other chaos tests),
no tool runs unchecked, every event Redis acknowledged is still in ``{p}:events``, and Ledger
handles every event there.

How the faults are made, and why not ``tc netem``: the kernel these tests run on is built
without the netem queueing discipline (``CONFIG_NET_SCH_NETEM`` is not set, and there are no
modules to load: ``tc qdisc add dev lo root netem delay 50ms`` answers "Specified qdisc kind is
unknown"). So

* partitions are nftables ``drop`` rules inside the cut-off namespace;
* loss is an nftables rule in Redis's namespace, ``numgen random mod 100 < 5 drop``, on its
  veth in both directions (with counters: the dropped packets are reported);
* latency is ``tests/chaos/delay_proxy.py``, a TCP relay in its own namespace that delays each
  chunk by 50 ms in each direction; agent and workers reach Redis only through it.

The test fails (it does not skip) with one line when it cannot create namespaces or lacks
``ip`` or ``nft``: it needs root; ``.ci/run`` installs iproute2 and nftables on Debian.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from tests.chaos.conftest import Ledger
from tests.chaos.load import GUARD, GUARD_TIMEOUT, SLACK
from tests.chaos.netns_agent import settings_for
from tests.harness import ROOT, Processes, until, worker_env
from tests.remote_hooks import AsyncConfig

pytestmark = pytest.mark.timeout(180)

ADDRESSES = {
    "redis": "10.18.0.2",
    "proxy": "10.18.0.3",
    "agent": "10.18.0.10",
    "worker1": "10.18.0.21",
    "worker2": "10.18.0.22",
}
PORT = 6379
LATENCY_MS = 50
LOSS_PERCENT = 5
PARTITION = 3.0  # seconds a partition lasts at least (the fault's duration)
LOAD = 4.0  # seconds of load under latency or loss
# Both live in /usr/sbin, which a non-root PATH may lack.
SBIN = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])
IP = shutil.which("ip", path=SBIN) or ""
NFT = shutil.which("nft", path=SBIN) or ""


class NetnsError(Exception):
    pass


class Network:
    """The namespaces of one test, joined by a bridge; faults are nftables tables in them."""

    def __init__(self) -> None:
        self.suffix = secrets.token_hex(3)
        self.created: list[str] = []
        self.ns: dict[str, str] = {}

    @staticmethod
    def run(*args: str, input: str | None = None) -> str:
        done = subprocess.run(args, input=input, capture_output=True, text=True, timeout=30)
        if done.returncode != 0:
            raise NetnsError(f"`{' '.join(args)}` failed: {done.stderr.strip()}")
        return done.stdout

    def namespace(self, role: str) -> str:
        name = f"hb-{role}-{self.suffix}"
        self.run(IP, "netns", "add", name)
        self.created.append(name)
        self.run(IP, "-n", name, "link", "set", "lo", "up")
        return name

    def build(self) -> None:
        switch = self.namespace("switch")
        self.run(IP, "-n", switch, "link", "add", "br0", "type", "bridge")
        self.run(IP, "-n", switch, "link", "set", "br0", "up")
        for role, address in ADDRESSES.items():
            ns = self.ns[role] = self.namespace(role)
            port = f"to-{role}"
            self.run(IP, "-n", switch, "link", "add", port, "type", "veth",
                     "peer", "name", "eth0", "netns", ns)  # fmt: skip
            self.run(IP, "-n", switch, "link", "set", port, "master", "br0", "up")
            self.run(IP, "-n", ns, "addr", "add", f"{address}/24", "dev", "eth0")
            self.run(IP, "-n", ns, "link", "set", "eth0", "up")

    def exec(self, role: str) -> list[str]:
        return [IP, "netns", "exec", self.ns[role]]

    def fault(self, role: str, input_rule: str, output_rule: str) -> None:
        """One nftables table ``hookbus`` in ``role``'s namespace, filtering its traffic."""
        self.run(*self.exec(role), NFT, "-f", "-", input=f"""
            table inet hookbus {{
                chain in {{ type filter hook input priority 0; {input_rule}; }}
                chain out {{ type filter hook output priority 0; {output_rule}; }}
            }}""")  # fmt: skip

    def partition(self, role: str, peer: str = "") -> None:
        """Drop everything between ``role`` and ``peer`` (or the whole bridge)."""
        if peer:
            self.fault(role, f"ip saddr {ADDRESSES[peer]} drop", f"ip daddr {ADDRESSES[peer]} drop")
        else:
            self.fault(role, 'iifname "eth0" drop', 'oifname "eth0" drop')

    def lose(self, role: str, percent: int) -> None:
        """Drop ``percent`` % of the packets in and out of ``role``, at random, counting."""
        self.fault(
            role,
            f'iifname "eth0" counter numgen random mod 100 < {percent} counter drop',
            f'oifname "eth0" counter numgen random mod 100 < {percent} counter drop',
        )

    def counters(self, role: str) -> list[int]:
        """Packet counts of the ``hookbus`` table's counters, in rule order."""
        listing = self.run(*self.exec(role), NFT, "-j", "list", "table", "inet", "hookbus")
        table = json.loads(listing)
        return [
            expr["counter"]["packets"]
            for item in table["nftables"]
            if "rule" in item
            for expr in item["rule"]["expr"]
            if "counter" in expr
        ]

    def heal(self, role: str) -> None:
        self.run(*self.exec(role), NFT, "delete", "table", "inet", "hookbus")

    def close(self) -> None:
        """Kill whatever still runs in the namespaces, then delete them."""
        for name in reversed(self.created):
            pids = subprocess.run([IP, "netns", "pids", name], capture_output=True, text=True)
            for pid in pids.stdout.split():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid), signal.SIGKILL)
            subprocess.run([IP, "netns", "del", name], capture_output=True)


@pytest.fixture
def net(procs: Processes) -> Iterator[Network]:
    for tool, package in ((IP, "iproute2"), (NFT, "nftables")):
        if not tool:
            pytest.fail(f"the netns chaos test needs `{package}` (Debian: apt install {package})",
                        pytrace=False)  # fmt: skip
    network = Network()
    try:
        failed = ""
        try:
            network.build()
        except (NetnsError, OSError) as exc:
            failed = str(exc)
        if failed:
            pytest.fail(f"cannot create network namespaces (needs root): {failed}", pytrace=False)
        yield network
    finally:
        network.close()


class Bus:
    """Redis, the two worker hosts and the agent, each started in its namespace."""

    def __init__(self, net: Network, procs: Processes, tmp: Path, latency_ms: float = 0) -> None:
        self.net, self.procs, self.tmp = net, procs, tmp
        self.handled = tmp / "handled.txt"
        self.handled.touch()
        self.progress_file, self.out = tmp / "progress.json", tmp / "agent.json"
        self.start("redis", ["redis-server", "--port", str(PORT), "--bind", ADDRESSES["redis"],
                             "--protected-mode", "no", "--save", "", "--appendonly", "no",
                             "--dir", str(tmp), "--logfile", str(tmp / "redis.log")])  # fmt: skip
        host = redis = ADDRESSES["redis"]
        if latency_ms:
            host = ADDRESSES["proxy"]
            self.start("proxy", [sys.executable, "-m", "tests.chaos.delay_proxy",
                                 "--listen", f"{host}:{PORT}", "--to", f"{redis}:{PORT}",
                                 "--delay-ms", str(latency_ms)])  # fmt: skip
        self.url = f"redis://{host}:{PORT}/0"
        ping = [*net.exec("agent"), "redis-cli", "-h", host, "-p", str(PORT), "ping"]
        until(lambda: subprocess.run(ping, capture_output=True, text=True).stdout.strip() == "PONG",
              "Redis to answer from the agent's namespace", 30)  # fmt: skip
        settings = settings_for(self.url)
        ledger = msgspec.json.encode(AsyncConfig(name="Ledger", record=str(self.handled))).decode()
        guard = msgspec.json.encode(GUARD).decode()
        for role in ("worker1", "worker2"):
            self.start(role, ["hookbus-worker", "tests.remote_hooks:Scripted"],
                       worker_env(settings, HOOKBUS_TEST_HOOK=guard))  # fmt: skip
            self.start(role, ["hookbus-worker", "tests.remote_hooks:ScriptedAsync"],
                       worker_env(settings, HOOKBUS_TEST_ASYNC=ledger))  # fmt: skip
        self.agent = self.start("agent", [
            sys.executable, "-m", "tests.chaos.netns_agent", "--redis", self.url,
            "--handled", str(self.handled), "--progress", str(self.progress_file),
            "--out", str(self.out),
        ])  # fmt: skip
        self.wait(lambda p: p["checked"] >= 20, "the load to run", 90)

    def start(
        self, role: str, args: list[str], env: dict[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        if args[0] == "hookbus-worker":
            args = [sys.executable, "-m", "workers.cli", "worker", *args[1:]]
        log = open(self.procs.logdir / f"{role}-{len(self.procs.procs)}.log", "wb")  # noqa: SIM115
        proc = subprocess.Popen([*self.net.exec(role), *args], env=env or dict(os.environ),
                                cwd=ROOT, stdout=log, stderr=log)  # fmt: skip
        log.close()
        self.procs.procs.append(proc)
        return proc

    def progress(self) -> dict[str, int]:
        if self.agent.poll() is not None:
            raise AssertionError(f"the agent exited ({self.agent.returncode}):\n{self.agent_log()}")
        if not self.progress_file.exists():
            return {"checked": 0, "blocked by Guard's failure policy": 0, "guard replicas": 0}
        return json.loads(self.progress_file.read_text())  # type: ignore[no-any-return]

    @property
    def checked(self) -> int:
        return self.progress()["checked"]

    @property
    def blocked(self) -> int:
        return self.progress()["blocked by Guard's failure policy"]

    def wait(self, condition: Any, what: str, timeout: float = 30) -> None:
        until(lambda: condition(self.progress()), what, timeout, explain=self.progress)

    def more_checked(self, n: int, what: str, timeout: float = 40) -> None:
        start = self.checked
        self.wait(lambda p: p["checked"] >= start + n, what, timeout)

    def agent_log(self) -> str:
        logs = sorted(self.procs.logdir.glob("agent-*.log"))
        return logs[0].read_text()[-3000:] if logs else ""

    def finish(self) -> dict[str, Any]:
        """Stop the agent; its figures, once it has reconciled with Redis and Ledger."""
        self.agent.send_signal(signal.SIGTERM)
        try:
            self.agent.wait(120)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the agent did not finish:\n{self.agent_log()}") from None
        assert self.agent.returncode == 0, self.agent_log()
        result: dict[str, Any] = json.loads(self.out.read_text())
        return result


def check(result: dict[str, Any]) -> None:
    """Deadlines held, nothing ran unchecked, nothing acknowledged was lost."""
    outcomes, latencies = result["outcomes"], result["latencies"]
    assert outcomes["checked"] > 0
    assert result["unchecked"] == 0, "a tool ran without Guard's answer"
    assert result["ran"] == outcomes["checked"]
    assert len(latencies) == sum(outcomes.values()), "a decision was never timed"
    assert max(latencies) <= GUARD_TIMEOUT + SLACK, sorted(latencies)[-5:]
    assert result["figures"]["events acknowledged (publisher)"] > 0
    assert result["lost"] == [], f"{len(result['lost'])} acknowledged events lost"


def test_a_worker_cut_off_from_redis_is_replaced_by_the_other_host(
    net: Network, procs: Processes, ledger: Ledger, tmp_path: Path
) -> None:
    bus = Bus(net, procs, tmp_path)
    net.partition("worker1", "redis")
    cut = time.monotonic()
    bus.wait(lambda p: p["guard replicas"] == 1, "worker1's Guard to leave the directory")
    left_after = time.monotonic() - cut
    bus.more_checked(50, "worker2 to answer alone while worker1 is cut off")
    time.sleep(max(0.0, PARTITION - (time.monotonic() - cut)))  # the partition's duration
    blocked_while_cut = bus.blocked
    net.heal("worker1")
    healed = time.monotonic()
    bus.wait(lambda p: p["guard replicas"] == 2, "worker1's Guard to come back", 60)
    back_after = time.monotonic() - healed
    bus.more_checked(50, "decisions after healing")
    lasted = healed - cut
    result = bus.finish()
    ledger.add(
        fault=f"worker1 (Guard + Ledger replicas) cut off from Redis {lasted:.1f} s",
        **{"out of the directory after (s)": f"{left_after:.1f}"},
        **{"back after healing (s)": f"{back_after:.1f}"},
        **{"blocked while cut off": blocked_while_cut},
        **result["figures"],
    )  # fmt: skip
    check(result)


def test_an_agent_cut_off_fails_closed_within_its_deadlines(
    net: Network, procs: Processes, ledger: Ledger, tmp_path: Path
) -> None:
    bus = Bus(net, procs, tmp_path)
    blocked_before = bus.blocked
    net.partition("agent")
    time.sleep(PARTITION)  # the partition's duration
    blocked_while_cut = bus.blocked - blocked_before
    net.heal("agent")
    bus.more_checked(50, "decisions after healing", 60)
    result = bus.finish()
    ledger.add(
        fault=f"agent cut off from every host {PARTITION:g} s",
        **{"blocked while cut off": blocked_while_cut},
        **result["figures"],
    )  # fmt: skip
    assert blocked_while_cut > 0, "no decision was taken while the agent was cut off"
    check(result)


def test_50_ms_of_latency_holds_every_deadline(
    net: Network, procs: Processes, ledger: Ledger, tmp_path: Path
) -> None:
    bus = Bus(net, procs, tmp_path, latency_ms=LATENCY_MS)
    time.sleep(LOAD)  # load under latency
    result = bus.finish()
    latencies = sorted(result["latencies"])
    fastest, median = latencies[0], latencies[len(latencies) // 2]
    ledger.add(
        fault=f"{LATENCY_MS} ms one-way on every path to Redis (delay relay), {LOAD:g} s",
        **{"fastest decision (s)": f"{fastest:.3f}"},
        **result["figures"],
    )  # fmt: skip
    # An answered decision crosses the relay four times (request in, to the worker, reply in,
    # to the agent): the latency was really there.
    assert median >= 4 * LATENCY_MS / 1000
    check(result)


def test_5_percent_packet_loss_loses_nothing_acknowledged(
    net: Network, procs: Processes, ledger: Ledger, tmp_path: Path
) -> None:
    bus = Bus(net, procs, tmp_path)
    net.lose("redis", LOSS_PERCENT)
    time.sleep(LOAD)  # load under loss
    seen_in, dropped_in, seen_out, dropped_out = net.counters("redis")
    net.heal("redis")
    bus.more_checked(50, "decisions after the loss")
    result = bus.finish()
    ledger.add(
        fault=f"{LOSS_PERCENT} % of packets dropped in and out of Redis's host, {LOAD:g} s",
        **{"packets dropped / seen": f"{dropped_in + dropped_out} / {seen_in + seen_out}"},
        **result["figures"],
    )  # fmt: skip
    assert dropped_in + dropped_out > 0
    check(result)
