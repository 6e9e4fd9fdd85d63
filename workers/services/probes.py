"""The health endpoint of a service (``HOOKBUS_HEALTH_PORT``): what Kubernetes probes ask.

* ``GET /livez``: 200 while the service's event loop answers. It does not touch Redis, so a
  Redis outage never restarts a pod; only a process whose loop is stuck (or gone) fails it.
* ``GET /readyz``: 200 while the service's last heartbeat reached Redis less than
  ``HOOKBUS_LIVENESS_SECS`` ago — the same rule other processes judge it by —, its host's
  clock, as last measured against Redis's, is within the 1 s bound (docs/protocol.md 1.5: the
  service corrects its deadlines by the offset, but a host that far off needs its clock fixed),
  and it is not stopping; 503 otherwise, with the reason as the body.
* ``GET /metrics``: the process's metrics for Prometheus (bus/telemetry/metrics.py), in
  Prometheus's text format, or OpenMetrics when the ``Accept`` header asks for it.

Answering costs the service a few microseconds on its own loop, where an exec probe started a
Python process (about 0.3 s of CPU and 40 MB) every time.

Why no web framework: three fixed paths, a status line and a short body; the image does not need
an HTTP server library for that (uvicorn is the optional ``gateway`` extra). Requests are read
with a deadline and a size cap; anything else gets 404 or 405.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from bus.telemetry import metrics
from bus.transport.clock import MAX_SKEW_MS, RedisClock, describe

log = logging.getLogger("hookbus.probes")
READ_TIMEOUT_SECS = 2.0
MAX_REQUEST_BYTES = 8192


class Health:
    """A service's state as its probes see it; the service calls ``beat()`` after each
    heartbeat that reached Redis, and ``stopping()`` when it begins to shut down."""

    def __init__(self, fresh_secs: float, clock: RedisClock | None = None) -> None:
        self.fresh_secs = fresh_secs
        self.clock = clock
        self.last_beat: float | None = None
        self.is_stopping = False
        #: Why the service cannot decide yet (None when it can): a coordinator that has not
        #: read the hook directory answers every tool call with a refusal (bus/unread.py), so
        #: it is not ready, however fresh its heartbeat.
        self.not_deciding: Callable[[], str | None] = lambda: None

    def beat(self) -> None:
        self.last_beat = time.monotonic()

    def stopping(self) -> None:
        self.is_stopping = True

    def ready(self) -> tuple[bool, str]:
        if self.is_stopping:
            return False, "stopping"
        if self.last_beat is None:
            return False, "not registered yet: no heartbeat has reached Redis"
        why = self.not_deciding()
        if why is not None:
            return False, why
        age = time.monotonic() - self.last_beat
        if age > self.fresh_secs:
            return False, (
                f"last heartbeat reached Redis {age:.1f}s ago (ready means within "
                f"{self.fresh_secs:g}s)"
            )
        if self.clock is not None and self.clock.skewed:
            return False, (
                f"this host's clock is {describe(self.clock.offset_ms)} Redis's, beyond the "
                f"{MAX_SKEW_MS / 1000:g} s bound (docs/protocol.md 1.5): keep it in sync (NTP)"
            )
        return True, f"last heartbeat reached Redis {age:.1f}s ago"


async def start_probes(health: Health, port: int, host: str = "0.0.0.0") -> asyncio.Server:
    """Serve ``/livez`` and ``/readyz`` on ``host:port`` (every interface by default: the
    kubelet probes the pod's address) until the returned server is closed."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), READ_TIMEOUT_SECS)
            status, body = answer(health, head)
        except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            status, body = "400 Bad Request", "bad request"
        except ConnectionError:
            return
        content_type = "text/plain; charset=utf-8"
        if isinstance(body, tuple):  # /metrics: already encoded, with its own type
            payload, content_type = body
        else:
            payload = (body + "\n").encode()
        writer.write(
            f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\n"
            f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n".encode()
            + payload
        )
        with contextlib.suppress(ConnectionError):
            await writer.drain()
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()

    server = await asyncio.start_server(handle, host, port, limit=MAX_REQUEST_BYTES)
    log.info("health endpoint on %s:%d (/livez, /readyz, /metrics)", host, port)
    return server


def answer(health: Health, head: bytes) -> tuple[str, str | tuple[bytes, str]]:
    """The status line and body for one request head (``/metrics``: the body encoded, and its
    content type)."""
    request_line = head.split(b"\r\n", 1)[0].decode("latin-1")
    parts = request_line.split()
    if len(parts) != 3 or not parts[2].startswith("HTTP/"):
        return "400 Bad Request", "bad request"
    method, target = parts[0], parts[1].split("?", 1)[0]
    if target not in ("/livez", "/readyz", "/metrics"):
        return "404 Not Found", "not found: /livez, /readyz or /metrics"
    if method not in ("GET", "HEAD"):
        return "405 Method Not Allowed", "GET only"
    if target == "/livez":
        return "200 OK", "ok"
    if target == "/metrics":
        return "200 OK", metrics.exposition(header(head, b"accept"))
    ok, why = health.ready()
    return ("200 OK" if ok else "503 Service Unavailable"), why


def header(head: bytes, name: bytes) -> str | None:
    """The value of header ``name`` (lower case) in a request head, if it has one."""
    for line in head.split(b"\r\n")[1:]:
        key, sep, value = line.partition(b":")
        if sep and key.strip().lower() == name:
            return value.strip().decode("latin-1")
    return None
