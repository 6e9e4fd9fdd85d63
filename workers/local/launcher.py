"""``hookbus up``: the docker-compose stack as local processes, for machines without Docker.

The topology of docker-compose.yml — the coordinator service, the built-in hook services
(cancellation, audit log, metrics), the policy hook with the starter rules
(``examples/policy/starter.toml``, relative to the current directory: run it from a checkout),
the example custom hook ``secret-guard`` (two replicas) and,
with ``--demo``, the demo agent — each a ``hookbus`` child process with a log file of its own, on
a private ``redis-server`` unless ``HOOKBUS_REDIS_URL`` (or ``--redis``) names a Redis. Jaeger is
not started: ``OTEL_EXPORTER_OTLP_ENDPOINT`` sends traces to a collector you run.

Every child runs in a process group of its own, so that Ctrl-C in a terminal reaches only this
launcher, which then stops them all — SIGTERM, then SIGKILL for what still runs after
``stop_timeout`` — then the private Redis, and exits 0.

``Stack`` is the process management without the terminal: the tests start it with one Redis URL
per role and per hook service (deploy/redis/users.acl, workers/ops/acl.py) to run the stack under
its ACL users.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import msgspec
from redis.exceptions import RedisError

from bus.errors import ConfigError
from bus.hooks import spec_of
from bus.protocol import now_ms
from bus.settings import BusSettings
from bus.transport.keys import COORDINATORS_GROUP, Keys
from bus.transport.redis_io import connect
from workers.local.redis_server import RedisServer
from workers.services.loading import load_hook, parse_config

#: The Redis user each kind of process runs as (deploy/redis/users.acl); "operator" is the one
#: this launcher uses to tell when the others are ready. A hook service runs as its own user,
#: ``hook-NAME`` (workers/ops/acl.py), if ``urls`` has one, else as "worker" (``hookbus up``: one
#: URL for every process).
ROLES = ("coordinator", "worker", "agent", "operator")


@dataclass(frozen=True)
class Service:
    """One service of docker-compose.yml: ``hookbus ARGS``, run as ``role``."""

    name: str
    role: str
    args: tuple[str, ...]
    replicas: int = 1

    @property
    def target(self) -> str | None:
        """The MODULE:CLASS a worker serves."""
        return self.args[1] if self.args[0] == "worker" else None

    @property
    def config(self) -> dict[str, Any]:
        """The hook's constructor arguments: its ``--set NAME=VALUE`` (as ``hookbus worker``)."""
        pairs = zip(self.args, self.args[1:], strict=False)
        return parse_config([value for key, value in pairs if key == "--set"])


#: The services of docker-compose.yml but Redis, Jaeger, the gateway (it needs tokens and a
#: port of its own: README) and the demo agent (tests/test_up.py holds the two to the same
#: commands).
STACK = (
    Service("coordinator", "coordinator", ("coordinator",)),
    Service(
        "cancellation", "worker", ("worker", "workers.builtins.cancellation:RedisCancellationHook")
    ),
    Service(
        "audit-log",
        "worker",
        (
            "worker",
            "workers.builtins.audit:AsyncAuditLogHook",
            "--from",
            "0",
            "--set",
            "redact=true",
        ),
    ),
    Service(
        "metrics", "worker", ("worker", "workers.builtins.metrics:AsyncMetricsHook", "--from", "0")
    ),
    Service(
        "policy",
        "worker",
        (
            "worker",
            "workers.builtins.policy:Policy",
            "--set",
            "rules=examples/policy/starter.toml",
        ),
    ),
    Service(
        "secret-guard", "worker", ("worker", "workers.builtins.demo_hooks:SecretGuard"), replicas=2
    ),
)
DEMO = Service("demo-agent", "agent", ("demo", "--attach"))


@dataclass
class Child:
    """One running ``hookbus`` process."""

    name: str
    service: Service
    popen: subprocess.Popen[bytes]
    log: Path | None
    reported: bool = field(default=False, repr=False)

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def command(self) -> str:
        return " ".join(("hookbus", *self.service.args))


class Stack:
    """Child processes started from ``services``, each logging to ``log_dir/NAME.log``.

    Args:
        urls: the Redis URL of each role in ROLES; "worker" may be left out when every hook
            service has its own (``hook-NAME``).
        log_dir: where the log files go (created if missing).
        prefix: HOOKBUS_PREFIX for every child (default: the environment's).
        env: the children's environment (default: this process's).
        stop_timeout: seconds between SIGTERM and SIGKILL in ``stop``.
    """

    def __init__(
        self,
        urls: Mapping[str, str],
        log_dir: Path,
        *,
        services: tuple[Service, ...] = STACK,
        prefix: str | None = None,
        env: Mapping[str, str] | None = None,
        stop_timeout: float = 10.0,
    ) -> None:
        self.urls = dict(urls)
        self.log_dir = log_dir
        self.services = services
        self.env = dict(os.environ if env is None else env)
        if prefix:
            self.env["HOOKBUS_PREFIX"] = prefix
        self.env.setdefault("HOOKBUS_AUDIT_DB", str(log_dir / "audit.db"))
        self.env["PYTHONUNBUFFERED"] = "1"
        self.stop_timeout = stop_timeout
        self.children: list[Child] = []
        self.host = socket.gethostname()
        self.hooks = {
            s.name: spec_of(load_hook(s.target, config=s.config)).name
            for s in services
            if s.target is not None
        }
        needed = {"operator"} | {s.role for s in services if s.target is None}
        needed |= {"worker" for h in self.hooks.values() if f"hook-{h}" not in urls}
        if missing := sorted(needed - set(urls)):
            raise ConfigError(f"no Redis URL for role {', '.join(missing)}")

    def url_of(self, service: Service) -> str:
        """The Redis URL ``service`` connects with: its hook's own user, else its role's."""
        hook = self.hooks.get(service.name)
        if hook is not None and f"hook-{hook}" in self.urls:
            return self.urls[f"hook-{hook}"]
        return self.urls[service.role]

    # -- starting ------------------------------------------------------------------------------

    def start(self) -> list[Child]:
        """Start every replica of every service."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        for service in self.services:
            for i in range(1, service.replicas + 1):
                name = service.name if service.replicas == 1 else f"{service.name}-{i}"
                self.spawn(service, name)
        return self.children

    def spawn(self, service: Service, name: str | None = None, *, log: bool = True) -> Child:
        """Start one process of ``service``; ``log=False`` leaves it this process's output."""
        name = name or service.name
        env = {
            **self.env,
            "HOOKBUS_REDIS_URL": self.url_of(service),
            "OTEL_SERVICE_NAME": f"hookbus-{service.name}",
        }
        path = self.log_dir / f"{name}.log" if log else None
        with contextlib.ExitStack() as files:
            out = files.enter_context(path.open("ab")) if path is not None else None
            popen = subprocess.Popen(
                [sys.executable, "-m", "workers.cli", *service.args],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=out,
                process_group=0,  # Ctrl-C in a terminal reaches the launcher, not the children
            )
        child = Child(name, service, popen, path)
        self.children.append(child)
        return child

    # -- readiness -----------------------------------------------------------------------------

    def exited(self) -> list[Child]:
        return [c for c in self.children if c.popen.poll() is not None]

    def _settings(self) -> BusSettings:
        return BusSettings.from_env(self.env, redis_url=self.urls["operator"])

    def _mine(self, member: Any, pid: int) -> bool:
        text = member.decode() if isinstance(member, bytes) else str(member)
        return text.startswith(f"{self.host}-{pid}-")

    async def pending(self, redis: Any, keys: Keys, settings: BusSettings) -> list[str]:
        """The children not ready yet: a hook replica without a fresh heartbeat under its own
        pid; a coordinator while no coordinator replica beats (``coordinator --check``)."""
        from workers.ops.health import coordinator_status

        live_ms = settings.liveness_secs * 1000
        now = now_ms()
        waiting = []
        coordinator: bool | None = None
        for child in self.children:
            if child.service.name in self.hooks:
                hook = self.hooks[child.service.name]
                beats: Any = await redis.zrange(keys.replicas(hook), 0, -1, withscores=True)
                if not any(self._mine(m, child.pid) and now - s <= live_ms for m, s in beats):
                    waiting.append(f"{child.name} (hook {hook})")
            elif child.service.args[0] == "coordinator":
                if coordinator is None:
                    coordinator, _ = await coordinator_status(redis, keys, settings)
                if not coordinator:
                    waiting.append(f"{child.name} (group {COORDINATORS_GROUP})")
        return waiting

    def wait_ready(self, timeout: float = 60.0, stop: threading.Event | None = None) -> str | None:
        """Wait until every child is ready: None, or why not (a child exited, the time ran out,
        ``stop`` was set: "stopped")."""
        settings = self._settings()
        keys = Keys.of(settings)
        deadline = time.monotonic() + timeout

        async def poll() -> str | None:
            redis = connect(settings)
            try:
                waiting = ["every process"]
                while True:
                    if stop is not None and stop.is_set():
                        return "stopped"
                    if dead := self.exited():
                        return "; ".join(self.describe_exit(c) for c in dead)
                    with contextlib.suppress(RedisError, OSError):
                        waiting = await self.pending(redis, keys, settings)
                        if not waiting:
                            return None
                    if time.monotonic() > deadline:
                        return f"not ready after {timeout:g}s: {', '.join(waiting)}"
                    await asyncio.sleep(0.1)
            finally:
                await redis.aclose()

        return asyncio.run(poll())

    def describe_exit(self, child: Child) -> str:
        child.reported = True
        line = f"{child.name} (pid {child.pid}) exited with code {child.popen.returncode}"
        if child.log is None:
            return line
        last = [x for x in child.log.read_text(errors="replace").splitlines() if x.strip()]
        return f"{line}: {last[-1].strip() if last else '(no output)'} — log {child.log}"

    # -- stopping ------------------------------------------------------------------------------

    def stop(self) -> list[tuple[Child, str]]:
        """SIGTERM every child still running, SIGKILL those left after ``stop_timeout``;
        returns how each ended ("stopped", "killed")."""
        alive = [c for c in reversed(self.children) if c.popen.poll() is None]
        for child in alive:
            _signal(child, signal.SIGTERM)
        deadline = time.monotonic() + self.stop_timeout
        ended = []
        for child in alive:
            try:
                child.popen.wait(max(0.0, deadline - time.monotonic()))
                ended.append((child, "stopped"))
            except subprocess.TimeoutExpired:
                _signal(child, signal.SIGKILL)
                child.popen.wait()
                ended.append((child, "killed"))
        return ended


def _signal(child: Child, sig: int) -> None:
    """Signal the child's process group (its own, with anything it started) while the child
    has not been reaped: until then no other group can have that id."""
    if child.popen.returncode is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(child.pid, sig)


def table(rows: Sequence[Sequence[str]]) -> str:
    """Plain aligned columns (easy to read in a log file too)."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows
    )


@contextlib.contextmanager
def _signals(stop: threading.Event) -> Iterator[None]:
    """SIGINT and SIGTERM set ``stop`` (instead of raising KeyboardInterrupt) meanwhile."""
    handler = lambda *_: stop.set()  # noqa: E731
    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def _private_redis(log_dir: Path) -> RedisServer:
    """A private redis-server, deaf to a terminal's Ctrl-C (SIGINT stays blocked in it), so that
    it outlives the services while they stop; ``stop`` ends it with SIGTERM."""
    server = RedisServer(extra=["--logfile", str(log_dir / "redis.log")])
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        server.start()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)
    return server


def _unreachable(url: str, prefix: str | None) -> str | None:
    """Why Redis at ``url`` does not answer a PING, or None."""
    settings = BusSettings.from_env(redis_url=url)
    if prefix:
        settings = msgspec.structs.replace(settings, prefix=prefix)

    async def ping() -> None:
        redis = connect(settings)
        try:
            await asyncio.wait_for(redis.ping(), 5)
        finally:
            await redis.aclose()

    try:
        asyncio.run(ping())
    except (RedisError, OSError, TimeoutError) as exc:
        return str(exc) or type(exc).__name__
    return None


def up(
    *,
    redis_url: str | None,
    prefix: str | None = None,
    demo: bool = False,
    once: bool = False,
    log_dir: str | None = None,
    stop_timeout: float = 10.0,
    ready_timeout: float = 60.0,
    out: TextIO = sys.stdout,
) -> int:
    """``hookbus up``: start the stack, say what runs, run until Ctrl-C or SIGTERM."""
    from bus.settings import redacted as _redacted

    def say(*lines: str, error: bool = False) -> None:
        stream = sys.stderr if error else out
        for line in lines:
            print(line, file=stream)
        stream.flush()

    stop = threading.Event()
    logs = Path(log_dir) if log_dir else Path(tempfile.mkdtemp(prefix="hookbus-up-"))
    logs.mkdir(parents=True, exist_ok=True)
    server: RedisServer | None = None
    stack: Stack | None = None
    with _signals(stop):
        try:
            if redis_url is None:
                server = _private_redis(logs)
                url = server.url
            else:
                url = redis_url
                if why := _unreachable(url, prefix):
                    say(f"hookbus: cannot reach Redis at {_redacted(url)}: {why}", error=True)
                    return 1
            stack = Stack(dict.fromkeys(ROLES, url), logs, prefix=prefix, stop_timeout=stop_timeout)
            stack.start()
            rows = [("ROLE", "NAME", "PID", "COMMAND")]
            if server is not None and server.proc is not None:
                rows.append(
                    (
                        "redis",
                        "redis",
                        str(server.proc.pid),
                        f"redis-server --port {server.port} (private)",
                    )
                )
            rows += [(c.service.role, c.name, str(c.pid), c.command) for c in stack.children]
            where = "a private redis-server, discarded on exit" if server else "given"
            say(
                table(rows),
                f"redis: {_redacted(url)} ({where})",
                f"logs:  {logs}/NAME.log, one per process",
            )
            if not os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
                say(
                    "traces: off (set OTEL_EXPORTER_OTLP_ENDPOINT, e.g. Jaeger's http://localhost:4318)"
                )
            why_not = stack.wait_ready(ready_timeout, stop)
            if why_not == "stopped":
                return 0
            if why_not is not None:
                say(f"hookbus up: the stack did not start: {why_not}", error=True)
                return 1
            hooks = sorted(set(stack.hooks.values()))
            say(f"ready: the coordinator and {len(hooks)} hooks ({', '.join(hooks)}) are live")
            code = 0
            if demo:
                say(f"running the demo agent: {' '.join(('hookbus', *DEMO.args))}")
                agent = stack.spawn(DEMO, log=False)
                while agent.popen.poll() is None and not stop.wait(0.1):
                    pass
                if stop.is_set():
                    return 0
                code = agent.popen.returncode
                agent.reported = True
                say(f"the demo agent exited with code {code}")
            if once:
                return code
            say("running: Ctrl-C or SIGTERM stops everything")
            while not stop.wait(0.5):
                for child in stack.exited():
                    if not child.reported:
                        say(f"hookbus up: {stack.describe_exit(child)}", error=True)
                if all(c.reported for c in stack.children):
                    say("hookbus up: every process has exited", error=True)
                    return 1
            return 0
        finally:
            if stack is not None:
                ended = stack.stop()
                killed = [c.name for c, how in ended if how == "killed"]
                say(
                    f"stopped {len(ended)} process{'es' if len(ended) != 1 else ''}"
                    + (f" (killed after {stop_timeout:g}s: {', '.join(killed)})" if killed else "")
                )
            if server is not None:
                server.close()
                say("stopped the private redis-server")
