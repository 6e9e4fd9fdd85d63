"""Every operator command says which Redis it talks to: one line on stderr (stdout stays the
command's own, parseable), host, port, db and user, never a password; with no URL configured,
that it uses the default. (A ``hooks list`` pointed at another Redis said "no hooks".)"""

from __future__ import annotations

import os
import subprocess
import sys
import urllib.parse
import uuid
from collections.abc import Iterator

import pytest
import redis

from bus.settings import BusSettings
from tests.harness import ROOT

PASSWORD = "s3cr3t-Pw-" + uuid.uuid4().hex[:8]


def hookbus(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("HOOKBUS_")}
    return subprocess.run(
        [sys.executable, "-m", "workers.cli", *args],
        env={**clean, "COLUMNS": "200", "NO_COLOR": "1", **env}, cwd=ROOT,
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


@pytest.fixture
def operator_url(bus_settings: BusSettings) -> Iterator[str]:
    """The test Redis, as a user ``ops`` with a password."""
    user = f"ops-{uuid.uuid4().hex[:6]}"
    parts = urllib.parse.urlsplit(bus_settings.redis_url)
    with redis.Redis.from_url(bus_settings.redis_url) as admin:
        admin.acl_setuser(user, enabled=True, passwords=[f"+{PASSWORD}"], keys=["*"],
                          channels=["*"], commands=["+@all"])  # fmt: skip
        try:
            host = parts.netloc.rsplit("@", 1)[-1]
            yield urllib.parse.urlunsplit(parts._replace(netloc=f"{user}:{PASSWORD}@{host}"))
        finally:
            admin.acl_deluser(user)


COMMANDS = [
    ("tenants", "add", "acme"),
    ("tenants", "list"),
    ("hooks", "list"),
    ("lag",),
    ("dlq", "list"),
    ("dlq", "purge", "--yes"),
    ("audit", "list"),
    ("cancel", "s1"),
    ("breakglass", "status"),
    ("metrics",),
    ("repair", "--tenant", "acme"),  # refused (no such stream) after saying where it looked
    ("replay", "nohook"),  # refused (no such hook) likewise
]


def test_every_operator_command_names_its_redis_on_stderr_without_the_password(
    bus_settings: BusSettings, operator_url: str
) -> None:
    parts = urllib.parse.urlsplit(operator_url)
    db = parts.path.strip("/") or "0"
    line = (
        f"hookbus: talking to Redis at {parts.hostname}:{parts.port} db {db}, user "
        f"{parts.username} with a password (HOOKBUS_REDIS_URL)"
    )
    for command in COMMANDS:
        done = hookbus(*command, HOOKBUS_REDIS_URL=operator_url, HOOKBUS_PREFIX=bus_settings.prefix)
        said = done.stderr.splitlines()
        assert said.count(line) == 1, (command, done.stderr)
        assert "talking to" not in done.stdout, (command, done.stdout)
        assert PASSWORD not in done.stdout + done.stderr, command
        refused = command[0] in ("replay", "repair")
        assert done.returncode == (2 if refused else 0), (command, done.stderr)
    # stdout is the command's own: the tenants, one a line
    listed = hookbus("tenants", "list", HOOKBUS_REDIS_URL=operator_url,
                     HOOKBUS_PREFIX=bus_settings.prefix)  # fmt: skip
    assert listed.stdout == "acme\n"


def test_the_redis_line_names_where_the_url_came_from(
    bus_settings: BusSettings, operator_url: str
) -> None:
    parts = urllib.parse.urlsplit(operator_url)
    no_password = operator_url.replace(f":{PASSWORD}@", "@")
    done = hookbus("tenants", "list", "--redis", no_password, "--prefix", bus_settings.prefix,
                   HOOKBUS_REDIS_PASSWORD=PASSWORD)  # fmt: skip
    assert done.returncode == 0, done.stderr
    [line] = done.stderr.splitlines()
    assert line.startswith(f"hookbus: talking to Redis at {parts.hostname}:{parts.port} db ")
    assert line.endswith(f"user {parts.username} with a password (--redis)")
    assert PASSWORD not in done.stderr + done.stdout


def test_with_no_url_configured_the_command_says_it_uses_the_default() -> None:
    done = hookbus("tenants", "list")  # whatever answers there (or not): the line comes first
    assert done.stderr.splitlines()[0] == (
        "hookbus: talking to Redis at 127.0.0.1:6379 db 0, user default "
        "(the default: neither --redis nor HOOKBUS_REDIS_URL is set)"
    )
