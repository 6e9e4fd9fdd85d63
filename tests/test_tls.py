"""TLS: hooks decide over ``rediss://`` against a redis-server that requires client certificates.

The test makes its own certificate authority, a server certificate (for 127.0.0.1) and a client
certificate with ``openssl``, starts ``redis-server`` with TLS only (no plaintext port) and
``tls-auth-clients yes``, and runs a real hook worker and a HookClient through it. The
certificate files travel in the URL (redis-py's ``ssl_ca_certs``, ``ssl_certfile``,
``ssl_keyfile`` query parameters), so every HookBus process takes them from
``HOOKBUS_REDIS_URL``.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pytest
import redis

from agent_adapter.client import HookClient
from bus import Block, HookEvent, HookSettings
from bus.settings import BusSettings
from tests.harness import Processes, wait_live
from tests.remote_hooks import HookConfig
from workers.local.redis_server import find_redis_server, free_port, stop_process
from workers.testing import context

pytestmark = pytest.mark.redis

PRE = HookEvent.PRE_TOOL_USE


def openssl(*args: str | Path, cwd: Path) -> None:
    subprocess.run(["openssl", *map(str, args)], cwd=cwd, check=True, capture_output=True)


def make_ca(d: Path, name: str) -> None:
    openssl("req", "-x509", "-new", "-nodes", "-newkey", "ec", "-pkeyopt",
            "ec_paramgen_curve:prime256v1", "-keyout", f"{name}.key", "-out", f"{name}.crt",
            "-days", "2", "-subj", f"/CN={name}", cwd=d)  # fmt: skip


def make_cert(d: Path, name: str, ca: str, ext: str) -> None:
    (d / f"{name}.ext").write_text(ext + "\n")
    openssl(
        "req",
        "-new",
        "-nodes",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-keyout",
        f"{name}.key",
        "-out",
        f"{name}.csr",
        "-subj",
        f"/CN={name}",
        cwd=d,
    )
    openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.crt", "-CAkey", f"{ca}.key",
            "-CAcreateserial", "-out", f"{name}.crt", "-days", "2",
            "-extfile", f"{name}.ext", cwd=d)  # fmt: skip


class TlsRedis:
    def __init__(self, certs: Path, port: int) -> None:
        self.certs, self.port = certs, port

    def url(self, ca: str = "ca", client: str | None = "client") -> str:
        query = f"ssl_ca_certs={quote(str(self.certs / f'{ca}.crt'))}"
        if client:
            query += f"&ssl_certfile={quote(str(self.certs / f'{client}.crt'))}"
            query += f"&ssl_keyfile={quote(str(self.certs / f'{client}.key'))}"
        return f"rediss://127.0.0.1:{self.port}/0?{query}"


@pytest.fixture(scope="module")
def tls_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsRedis]:
    binary = find_redis_server()
    assert binary, "needs a redis-server binary"
    assert shutil.which("openssl"), "the TLS test needs the openssl command (apt install openssl)"
    certs = tmp_path_factory.mktemp("certs")
    make_ca(certs, "ca")
    make_ca(certs, "stranger")
    make_cert(certs, "server", "ca", "subjectAltName=IP:127.0.0.1,DNS:localhost")
    make_cert(certs, "client", "ca", "extendedKeyUsage=clientAuth")
    port = free_port()
    proc = subprocess.Popen(
        [binary, "--port", "0", "--tls-port", str(port), "--bind", "127.0.0.1",
         "--tls-cert-file", certs / "server.crt", "--tls-key-file", certs / "server.key",
         "--tls-ca-cert-file", certs / "ca.crt", "--tls-auth-clients", "yes",
         "--save", "", "--appendonly", "no", "--dir", certs, "--logfile", certs / "redis.log"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    server = TlsRedis(certs, port)
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                if redis.Redis.from_url(server.url(), socket_timeout=1).ping():
                    break
            except redis.RedisError:
                assert proc.poll() is None, (certs / "redis.log").read_text()[-1000:]
                assert time.monotonic() < deadline, "redis-server with TLS did not answer"
                time.sleep(0.05)
        yield server
    finally:
        stop_process(proc)


async def test_hooks_decide_over_tls_with_client_certificates(
    tls_redis: TlsRedis, procs: Processes
) -> None:
    settings = BusSettings(
        redis_url=tls_redis.url(), prefix="tls", heartbeat_secs=0.2, liveness_secs=1.0,
        claim_idle_secs=0.5, refresh_secs=0.2,
    )  # fmt: skip
    procs.scripted(settings, HookConfig(name="Guard", answers={PRE.value: Block(reason="no")}))
    async with HookClient(settings, HookSettings(hook_timeout_secs=10)) as client:
        await wait_live(client, "Guard")
        result = await client.run_pre_tool_use(context(PRE, tool_name="file_read"))
    assert [(b.hook_name, b.reason) for b in result.blocking_errors] == [("Guard", "no")]


def test_tls_redis_refuses_plaintext_clients_without_certificates_and_wrong_servers(
    tls_redis: TlsRedis,
) -> None:
    def fails(url: str) -> bool:
        client = redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2)
        try:
            client.ping()
        except (redis.ConnectionError, redis.TimeoutError, redis.ResponseError):
            return True
        finally:
            client.close()
        return False

    assert not fails(tls_redis.url())
    assert fails(f"redis://127.0.0.1:{tls_redis.port}/0")  # plaintext to the TLS port
    assert fails(tls_redis.url(client=None))  # no client certificate
    assert fails(tls_redis.url(ca="stranger"))  # the server is not who this CA vouches for
