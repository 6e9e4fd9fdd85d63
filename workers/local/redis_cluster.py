"""Start a private Redis Cluster on free ports: 3 masters and 3 replicas, for tests and benchmarks.

Real ``redis-server --cluster-enabled yes`` processes joined by ``redis-cli --cluster create``,
exactly what an operator runs; nothing simulated. Each node is a :class:`RedisServer`, so a test
can SIGKILL a master (:meth:`LocalCluster.kill_master`) and wait for its replica to be promoted.
"""

from __future__ import annotations

import random
import shutil
import socket
import subprocess
import time
from typing import Any

from bus.errors import ConfigError
from workers.local.redis_server import RedisServer


def cluster_port() -> int:
    """A free port whose cluster bus port (+10000) is free too; Redis needs it <= 55535."""
    for _ in range(200):
        port = random.randint(20_000, 45_000)
        if all(_bindable(p) for p in (port, port + 10_000)):
            return port
    raise ConfigError("found no free port pair for a cluster node")


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


MISSING_CLI = "no redis-cli binary found on PATH (Debian: apt install redis-tools)"


class LocalCluster:
    """``masters`` masters, each with ``replicas`` replicas, on 127.0.0.1.

    Args:
        masters: number of masters (at least 3: Redis Cluster's own minimum for failover).
        replicas: replicas per master.
        node_timeout_ms: ``cluster-node-timeout``: how long a silent master has before its
            replica is promoted (short, so that failover tests do not wait long).
    """

    def __init__(self, masters: int = 3, replicas: int = 1, node_timeout_ms: int = 1000) -> None:
        cli = shutil.which("redis-cli")
        if cli is None:
            raise ConfigError(MISSING_CLI)
        self.cli = cli
        self.masters = masters
        self.replicas = replicas
        self.nodes: list[RedisServer] = []
        for _ in range(masters * (1 + replicas)):
            port = cluster_port()
            self.nodes.append(
                RedisServer(
                    port,
                    [
                        "--cluster-enabled", "yes",
                        "--cluster-config-file", "nodes.conf",
                        "--cluster-node-timeout", str(node_timeout_ms),
                        # Tests kill masters on purpose: a replica may take over at once.
                        "--cluster-replica-validity-factor", "0",
                        "--appendonly", "yes",
                    ],
                )
            )  # fmt: skip

    @property
    def url(self) -> str:
        """A URL of one node: a cluster client discovers the others from it."""
        return self.nodes[0].url

    def start(self, timeout: float = 30.0) -> LocalCluster:
        for node in self.nodes:
            node.start()
        addresses = [f"127.0.0.1:{node.port}" for node in self.nodes]
        created = subprocess.run(
            [
                self.cli,
                "--cluster",
                "create",
                *addresses,
                "--cluster-replicas",
                str(self.replicas),
                "--cluster-yes",
            ],
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if created.returncode != 0:
            self.close()
            raise ConfigError(f"redis-cli --cluster create failed: {created.stdout[-800:]}")
        self.wait_ok(timeout)
        self.wait_replicas_synced(timeout)
        return self

    def info(self, node: RedisServer, *command: str) -> str:
        """One command's reply on one node, as text (empty if the node does not answer)."""
        result = subprocess.run(
            [self.cli, "-p", str(node.port), *command], capture_output=True, text=True, timeout=5
        )
        return result.stdout if result.returncode == 0 else ""

    def wait_ok(self, timeout: float = 30.0) -> None:
        """Until every running node reports ``cluster_state:ok`` and agrees on the masters."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            running = [n for n in self.nodes if n.proc is not None]
            if all("cluster_state:ok" in self.info(n, "cluster", "info") for n in running):
                masters = {tuple(self.master_ports(n)) for n in running}
                if len(masters) == 1 and len(next(iter(masters))) == self.masters:
                    return
            time.sleep(0.1)
        raise ConfigError(f"the cluster did not become ready within {timeout}s")

    def wait_replicas_synced(self, timeout: float = 30.0) -> None:
        """Until every master has all its replicas online (their first full sync done), so
        that replication (and ``WAIT``) works from the first write."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            states = [self.info(self.node(p), "info", "replication") for p in self.master_ports()]
            if all(s.count("state=online") == self.replicas for s in states):
                return
            time.sleep(0.1)
        raise ConfigError(f"the replicas did not finish their first sync within {timeout}s")

    def master_ports(self, node: RedisServer | None = None) -> list[int]:
        """Ports of the masters that serve slots, as ``node`` sees the cluster."""
        seen = self.info(node or self._running()[0], "cluster", "nodes")
        ports = []
        for line in seen.splitlines():
            fields = line.split()
            if len(fields) > 8 and "master" in fields[2] and "fail" not in fields[2]:
                ports.append(int(fields[1].split("@")[0].rsplit(":", 1)[1]))
        return sorted(ports)

    def node(self, port: int) -> RedisServer:
        return next(n for n in self.nodes if n.port == port)

    def kill_master(self, port: int | None = None) -> int:
        """SIGKILL one master (the first, unless ``port``); returns its port."""
        port = port or self.master_ports()[0]
        self.node(port).kill()
        return port

    def wait_promoted(self, killed: int, timeout: float = 30.0) -> None:
        """Until a replica has taken over the killed master's slots and the cluster is ok."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            running = self._running()
            if running and killed not in self.master_ports(running[0]):
                try:
                    self.wait_ok(max(0.1, deadline - time.monotonic()))
                    return
                except ConfigError:
                    break
            time.sleep(0.1)
        raise ConfigError(f"no replica took over from the master on port {killed}")

    def _running(self) -> list[RedisServer]:
        return [n for n in self.nodes if n.proc is not None]

    def close(self) -> None:
        for node in self.nodes:
            node.close()

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.close()
