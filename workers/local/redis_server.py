"""Start a private ``redis-server`` on a free port: for tests, ``hookbus demo`` and local runs."""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from bus.errors import ConfigError

MISSING = (
    "no redis-server binary found on PATH: install Redis 7 (Debian: apt install redis-server) "
    "or point HOOKBUS_REDIS_URL / REDIS_URL at a running server"
)


def find_redis_server() -> str | None:
    """The path of a ``redis-server`` binary, or None."""
    return shutil.which("redis-server")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def stop_process(proc: subprocess.Popen[Any], grace: float = 10.0) -> None:
    """SIGTERM ``proc``, and SIGKILL it if it has not exited after ``grace`` seconds."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


class RedisServer:
    """A ``redis-server`` child process that can be stopped and restarted on the same port.

    Args:
        port: the port to listen on (a free one when omitted).
        extra: more ``redis-server`` arguments, e.g. ``["--appendonly", "yes"]``.
    """

    def __init__(self, port: int | None = None, extra: list[str] | None = None) -> None:
        binary = find_redis_server()
        if binary is None:
            raise ConfigError(MISSING)
        self.binary = binary
        self.port = port or free_port()
        self.extra = list(extra or [])
        self._dir = tempfile.TemporaryDirectory(prefix="hookbus-redis-")
        self.dir = Path(self._dir.name)
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 10.0) -> RedisServer:
        args = [
            self.binary,
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--save", "",
            "--appendonly", "no",
            "--dir", str(self.dir),
            "--logfile", str(self.dir / "redis.log"),
            *self.extra,
        ]  # fmt: skip
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                log = (
                    (self.dir / "redis.log").read_text()
                    if (self.dir / "redis.log").exists()
                    else ""
                )
                raise ConfigError(f"redis-server exited at start: {log[-500:]}")
            if self.ping():
                return self
            time.sleep(0.02)
        raise ConfigError(f"redis-server did not answer on port {self.port} within {timeout}s")

    def ping(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                s.sendall(b"PING\r\n")
                # A server that wants a password answers too (-NOAUTH): it is up.
                return s.recv(16).startswith((b"+PONG", b"-NOAUTH"))
        except OSError:
            return False

    def stop(self) -> None:
        if self.proc is not None:
            stop_process(self.proc)
        self.proc = None

    def kill(self) -> None:
        """SIGKILL: the server dies at once, as in a crash (no shutdown save, no final fsync)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def close(self) -> None:
        self.stop()
        self._dir.cleanup()

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
