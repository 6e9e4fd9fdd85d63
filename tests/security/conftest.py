"""A real redis-server loaded with the ACL file ``hookbus acl`` generates, started by
deploy/redis/start.sh, with a password per user; each attack connects as the user whose
credential the attacker would hold (a tenant's agent, a hook service, the trusted agent).

The users: the shared roles (coordinator, agent, operator), hooks ``Guard`` (a sync hook that
blocks), ``Rogue`` (the attacker's own sync hook), ``CancellationHook`` (the built-in) and
``Tail`` (an async hook), ``AsyncAuditLogHook`` (the built-in audit log), and tenants ``acme``
(the attacker) and ``beta`` (the victim). The generated ``admin`` user only sets the scene and
reads ACL LOG. One server for the session; every test starts from an empty keyspace and an
empty ACL LOG.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from bus.settings import BusSettings
from bus.transport.keys import Keys
from tests.harness import ROOT, until
from workers.local.redis_server import free_port, stop_process

HOOKS = (
    "Guard,Rogue,workers.builtins.cancellation:RedisCancellationHook,Tail=async,"
    "workers.builtins.audit:AsyncAuditLogHook"
)
TENANTS = "acme,beta"
ADMIN = "admin-security-pw"
KEYS = Keys()  # the default prefix, as the generated file is written for


def password(user: str) -> str:
    return f"{user}-{os.getpid()}-pw"


def password_var(user: str) -> str:
    return f"HOOKBUS_{user.upper().replace('-', '_').replace('.', '_')}_PASSWORD"


class AclServer:
    """redis-server with the generated users (see the module's docstring)."""

    def __init__(self, tmp: Path) -> None:
        generated = subprocess.run(
            [sys.executable, "-m", "workers.cli", "acl", "--hooks", HOOKS, "--tenants", TENANTS],
            cwd=ROOT, capture_output=True, text=True, timeout=60, check=True,
        )  # fmt: skip
        self.acl = generated.stdout
        self.users = [line.split()[1] for line in self.acl.splitlines() if line.startswith("user ")]
        template = tmp / "users.acl"
        template.write_text(self.acl)  # its admin user (password ADMIN) sets the scene
        self.port = free_port()
        env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("HOOKBUS_")},
            "HOOKBUS_ACL_TEMPLATE": str(template),
            "HOOKBUS_ACL_FILE": str(tmp / "rendered.acl"),
            "HOOKBUS_SECRETS_DIR": str(tmp / "no-secrets"),
            **{password_var(u): password(u) for u in self.users if u != "default"},
        }
        env[password_var("admin")] = ADMIN
        self.log = tmp / "redis.log"
        self.proc = subprocess.Popen(
            ["sh", str(ROOT / "deploy" / "redis" / "start.sh"), "--port", str(self.port),
             "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", str(tmp),
             "--logfile", str(self.log)],
            env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        )  # fmt: skip
        self.admin = redis.Redis(port=self.port, username="admin", password=ADMIN)

        def up() -> bool:
            if self.proc.poll() is not None:
                out = self.proc.stdout.read().decode() if self.proc.stdout else ""
                pytest.fail(f"start.sh exited {self.proc.returncode}: {out}")
            try:
                return bool(self.admin.ping())
            except redis.RedisError:
                return False

        until(up, "redis-server with the generated ACL", timeout=20)

    def url(self, user: str) -> str:
        return f"redis://{user}:{password(user)}@127.0.0.1:{self.port}/0"

    def client(self, user: str) -> redis.Redis:
        return redis.Redis(port=self.port, username=user, password=password(user))

    def settings(self, user: str) -> BusSettings:
        return BusSettings(
            redis_url=self.url(user),
            heartbeat_secs=0.2,
            liveness_secs=1.0,
            claim_idle_secs=0.5,
            refresh_secs=0.2,
        )

    def denied(self, user: str | None = None) -> list[dict[str, Any]]:
        """ACL LOG entries (of ``user``, if given)."""
        entries: Any = self.admin.acl_log(count=1000)
        return [e for e in entries if user is None or e["username"] == user]

    def close(self) -> None:
        self.admin.close()
        stop_process(self.proc)
        if self.proc.stdout:
            self.proc.stdout.close()


@pytest.fixture(scope="session")
def acl_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AclServer]:
    server = AclServer(tmp_path_factory.mktemp("acl-redis"))
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def acl(acl_server: AclServer) -> AclServer:
    """The server, emptied: no keys, an empty ACL LOG."""
    acl_server.admin.flushall()
    acl_server.admin.acl_log_reset()
    return acl_server


class Attacker:
    """One credential, and the attacks run with it."""

    def __init__(self, server: AclServer, user: str) -> None:
        self.server = server
        self.user = user
        self.redis = server.client(user)

    def refused(self, *command: Any) -> None:
        """The command is refused with NOPERM (and Redis records it in ACL LOG)."""
        with pytest.raises(redis.exceptions.NoPermissionError):
            self.redis.execute_command(*command)

    def subscribe_refused(self, *channels: str, pattern: bool = False) -> None:
        pubsub = self.redis.pubsub()
        try:
            with pytest.raises(redis.exceptions.NoPermissionError):
                (pubsub.psubscribe if pattern else pubsub.subscribe)(*channels)
                pubsub.get_message(timeout=1)
        finally:
            pubsub.close()

    def close(self) -> None:
        self.redis.close()


@pytest.fixture
def attacker(acl: AclServer) -> Iterator[Any]:
    """``attacker("tenant-acme")``: an Attacker holding that user's credential."""
    made: list[Attacker] = []

    def make(user: str) -> Attacker:
        made.append(Attacker(acl, user))
        return made[-1]

    try:
        yield make
    finally:
        for a in made:
            a.close()
