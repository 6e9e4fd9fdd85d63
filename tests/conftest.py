"""Shared fixtures: a real Redis for the tests that need one.

Order of preference: ``REDIS_URL`` (an existing server), a private ``redis-server`` started on a
free port for this test session, or a testcontainers Redis when a Docker engine answers. When
none is available the tests that need Redis FAIL with one clear line — they never skip.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from bus.settings import BusSettings
from workers.local.redis_server import MISSING, RedisServer, find_redis_server


class ExternalRedis:
    """A server we did not start (REDIS_URL or a container): it cannot be stopped from here."""

    def __init__(self, url: str, container: Any = None) -> None:
        self.url = url
        self.container = container

    def stop(self) -> None:
        pytest.fail("this test stops Redis, which needs a private redis-server (unset REDIS_URL)")

    restart = start = stop


def _docker_redis() -> ExternalRedis | None:
    try:
        from testcontainers.redis import RedisContainer

        container = RedisContainer("redis:7").start()
    except Exception:
        return None
    host, port = container.get_container_host_ip(), container.get_exposed_port(6379)
    return ExternalRedis(f"redis://{host}:{port}/0", container)


@pytest.fixture(scope="session")
def redis_server() -> Iterator[Any]:
    if url := os.environ.get("REDIS_URL"):
        yield ExternalRedis(url)
        return
    if find_redis_server():
        server = RedisServer().start()
        try:
            yield server
        finally:
            server.close()
        return
    docker = _docker_redis()
    if docker is None:
        pytest.fail(MISSING + " (and no Docker engine answers for testcontainers)")
    try:
        yield docker
    finally:
        docker.container.stop()


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[Any]:
    """A private Redis Cluster (3 masters, 3 replicas) for this test session."""
    from workers.local.redis_cluster import LocalCluster

    with LocalCluster() as cluster:
        yield cluster


@pytest.fixture
def cluster_settings(redis_cluster: Any) -> BusSettings:
    """Settings for the cluster, as a user gives them: a ``redis+cluster://`` URL of one node."""
    return BusSettings(
        redis_url=redis_cluster.url.replace("redis://", "redis+cluster://", 1),
        prefix=f"t{uuid.uuid4().hex[:10]}",
        heartbeat_secs=0.2,
        liveness_secs=1.0,
        claim_idle_secs=0.5,
        refresh_secs=0.2,
    )


@pytest.fixture
def bus_settings(redis_server: Any) -> BusSettings:
    """Settings with a prefix of its own, so that tests never see each other's keys."""
    return BusSettings(
        redis_url=redis_server.url,
        prefix=f"t{uuid.uuid4().hex[:10]}",
        heartbeat_secs=0.2,
        liveness_secs=1.0,
        claim_idle_secs=0.5,
        refresh_secs=0.2,
    )


@pytest.fixture
def procs(tmp_path: Any) -> Iterator[Any]:
    from tests.harness import Processes

    logdir = tmp_path / "logs"
    logdir.mkdir()
    processes = Processes(logdir)
    try:
        yield processes
    finally:
        processes.stop_all()


@pytest.fixture(params=["embedded", "distributed", "cluster"])
async def harness(request: Any, procs: Any) -> Any:
    """The shared semantic suite runs embedded, over one Redis node, and over a Redis Cluster."""
    from tests.harness import Harness

    settings = {
        "embedded": None,
        "distributed": lambda: request.getfixturevalue("bus_settings"),
        "cluster": lambda: request.getfixturevalue("cluster_settings"),
    }[request.param]
    mode = "embedded" if settings is None else "distributed"
    h = Harness(mode, settings and settings(), procs)  # type: ignore[arg-type]
    try:
        yield h
    finally:
        await h.close()
