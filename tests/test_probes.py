"""The health endpoint (issue 17, item 17): ``HOOKBUS_HEALTH_PORT`` on a hook worker (sync and
async) and on the coordinator service, as Kubernetes probes it (and Prometheus scrapes it).
Liveness does not depend on Redis; readiness follows the service's own heartbeat to Redis. Real
processes, a real redis-server stopped and started again."""

from __future__ import annotations

import http.client
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from bus.settings import BusSettings
from tests.harness import ROOT, until, worker_env
from workers.local.redis_server import RedisServer, free_port

TIMEOUT = 60
SERVICES = {
    "sync worker": ["worker", "workers.builtins.demo_hooks:SecretGuard"],
    "async worker": ["worker", "workers.builtins.metrics:AsyncMetricsHook"],
    "coordinator": ["coordinator"],
}


def compose_check(port: int) -> int:
    """docker-compose.yml's health check of a hookbus service, against ``port``."""
    doc = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    kind, python, flag, code = doc["x-health"]["test"]
    assert (kind, python, flag) == ("CMD", "python", "-c")
    code = code.replace(f":{doc['x-env']['HOOKBUS_HEALTH_PORT']}/", f":{port}/")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=30).returncode


def get(port: int, path: str, method: str = "GET") -> tuple[int, str]:
    """Status and body of one request, or (0, why) when nothing answers."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request(method, path)
        response = conn.getresponse()
        return response.status, response.read().decode()
    except OSError as exc:
        return 0, str(exc)
    finally:
        conn.close()


@pytest.fixture
def private_redis() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


@pytest.mark.redis
@pytest.mark.parametrize("service", list(SERVICES))
def test_livez_ignores_redis_and_readyz_follows_the_heartbeat(
    service: str, private_redis: RedisServer, tmp_path: Path
) -> None:
    settings = BusSettings(redis_url=private_redis.url, prefix="probes", liveness_secs=2.0)
    port = free_port()
    log = (tmp_path / "service.log").open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "workers.cli", *SERVICES[service]],
        env=worker_env(settings, HOOKBUS_HEALTH_PORT=str(port)),
        cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    log.close()

    def explain() -> str:
        return (tmp_path / "service.log").read_text()

    try:
        until(lambda: get(port, "/readyz")[0] == 200, "ready", TIMEOUT, explain)
        assert get(port, "/livez") == (200, "ok\n")
        assert get(port, "/healthz")[0] == 404
        status, scraped = get(port, "/metrics")  # beside the probes (tests/test_metrics.py)
        assert status == 200 and "# TYPE hookbus_decisions_total counter" in scraped
        assert get(port, "/livez", "POST")[0] == 405
        assert compose_check(port) == 0

        private_redis.stop()  # Redis goes away: the pod stays alive, and is taken out of rotation
        until(lambda: get(port, "/readyz")[0] == 503, "not ready without Redis", TIMEOUT, explain)
        status, why = get(port, "/readyz")
        assert status == 503
        assert "last heartbeat reached Redis" in why and "ready means within 2s" in why
        assert get(port, "/livez") == (200, "ok\n")
        assert compose_check(port) != 0
        assert proc.poll() is None

        private_redis.restart()
        until(lambda: get(port, "/readyz")[0] == 200, "ready again", TIMEOUT, explain)
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(TIMEOUT) == 0, explain()
    assert get(port, "/livez")[0] == 0  # the endpoint ends with the service


def test_a_bad_health_port_is_refused() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "workers.cli", "coordinator"],
        env=worker_env(BusSettings(), HOOKBUS_HEALTH_PORT="70000"),
        cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT, check=False,
    )  # fmt: skip
    assert result.returncode == 2
    assert "HOOKBUS_HEALTH_PORT=70000 is not a TCP port" in result.stderr


@pytest.mark.redis
def test_a_hook_service_whose_clock_is_off_is_alive_but_not_ready(
    private_redis: RedisServer, tmp_path: Path
) -> None:
    """Its host's clock 5 s ahead of Redis's (libfaketime): the service corrects its deadlines,
    but its pod is taken out of rotation until the clock is fixed, as worker --check says."""
    from tests.faketime import faked

    settings = BusSettings(redis_url=private_redis.url, prefix="skewed")
    port = free_port()
    log = (tmp_path / "service.log").open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "workers.cli", *SERVICES["sync worker"]],
        env=worker_env(settings, HOOKBUS_HEALTH_PORT=str(port), **faked("+5s")),
        cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    log.close()
    try:
        until(lambda: get(port, "/livez")[0] == 200, "alive", TIMEOUT)

        def skewed() -> bool:
            status, why = get(port, "/readyz")
            return status == 503 and "clock" in why

        until(skewed, "not ready: its clock", TIMEOUT, (tmp_path / "service.log").read_text)
        status, why = get(port, "/readyz")
        assert status == 503 and "ahead of Redis's, beyond the 1 s bound" in why, why
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(TIMEOUT)
