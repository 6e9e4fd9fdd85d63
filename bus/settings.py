"""Settings, built once at start-up from the environment and passed down.

Nothing in HookBus reads the environment at import time or on a hot path.

Hand-written rather than pydantic-settings (which the environment offers): it would not catch
what went wrong in practice, a misspelled variable (``HOOKBUS_REDIS_URI``) — pydantic-settings
ignores environment variables it has no field for — which ``unknown_variables`` reports with a
"did you mean"; it would bring a second validation library next to msgspec into the core for
about a dozen numbers; and the secrets files of a deployment are read where they are mounted
(deploy/redis/start.sh), not here.

Secrets from files, the Docker convention: every variable ``X`` read here may instead be given
as ``X_FILE``, the path of a file holding its value (``HOOKBUS_REDIS_PASSWORD_FILE=/run/secrets/
hookbus_hook-SecretGuard_password``; one trailing newline is dropped). ``HOOKBUS_REDIS_PASSWORD``
is put into the Redis URL, so that no password needs to be written in one.
"""

from __future__ import annotations

import difflib
import math
import os
import re
import urllib.parse
from collections.abc import Mapping

import msgspec

from bus.errors import ConfigError


def _positive(env: Mapping[str, str], key: str, default: float) -> float:
    raw = env.get(key)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{key}={raw!r} is not a number of seconds") from None
    if not math.isfinite(value) or value <= 0:
        raise ConfigError(f"{key}={raw!r} must be a positive number")
    return value


class HookSettings(msgspec.Struct, frozen=True, kw_only=True):
    """How hooks are dispatched.

    Attributes:
        hook_timeout_secs: timeout of a sync hook that declares none (``HOOK_TIMEOUT_SECS``, 30).
        async_timeout_secs: timeout of an async hook call (``HOOKBUS_ASYNC_TIMEOUT_SECS``, 5).
        truncate_chars: length a ``Warning(truncate_output=True)`` cuts output to
            (``HOOKBUS_TRUNCATE_CHARS``, 2000).
        max_output_chars: tool output longer than this is cut, with a marker, before any hook
            sees it (``HOOKBUS_MAX_OUTPUT_CHARS``, 100000), so that no message outgrows the
            protocol's size limit.
    """

    hook_timeout_secs: float = 30.0
    async_timeout_secs: float = 5.0
    truncate_chars: int = 2000
    max_output_chars: int = 100_000

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> HookSettings:
        env = from_files(os.environ if env is None else env)
        return cls(
            hook_timeout_secs=_positive(env, "HOOK_TIMEOUT_SECS", 30.0),
            async_timeout_secs=_positive(env, "HOOKBUS_ASYNC_TIMEOUT_SECS", 5.0),
            truncate_chars=int(_positive(env, "HOOKBUS_TRUNCATE_CHARS", 2000)),
            max_output_chars=int(_positive(env, "HOOKBUS_MAX_OUTPUT_CHARS", 100_000)),
        )


def _int(env: Mapping[str, str], key: str, default: int) -> int:
    raw = env.get(key)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"{key}={raw!r} is not a whole number") from None
    if value <= 0:
        raise ConfigError(f"{key}={raw!r} must be positive")
    return value


def _count(env: Mapping[str, str], key: str, default: int) -> int:
    """A whole number >= 0 (0 switches a feature off)."""
    raw = env.get(key)
    if raw is None or raw == "":
        return default
    if not raw.isdigit():
        raise ConfigError(f"{key}={raw!r} must be a whole number >= 0")
    return int(raw)


def _switch(env: Mapping[str, str], key: str) -> bool:
    """An on/off switch: ``1``, ``true``, ``yes`` or ``on`` (any case) is on; unset, empty,
    ``0``, ``false``, ``no`` or ``off`` is off; anything else is a ConfigError (a typo must not
    pass for either)."""
    raw = env.get(key, "").strip().lower()
    if raw in ("1", "true", "yes", "on"):
        return True
    if raw in ("", "0", "false", "no", "off"):
        return False
    raise ConfigError(f"{key}={env[key]!r} must be 1 or 0 (true/false, yes/no, on/off)")


def _port(env: Mapping[str, str], key: str) -> int:
    """A TCP port, or 0 (off) when unset."""
    value = _count(env, key, 0)
    if value > 65535:
        raise ConfigError(f"{key}={value} is not a TCP port (1-65535, or 0 for none)")
    return value


DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"

#: Every ``HOOKBUS_*`` variable a HookBus process reads: the settings here, the audit log
#: hook's database, and what the Redis container's start.sh and Compose read.
KNOWN_VARIABLES = frozenset(
    {
        "HOOKBUS_REDIS_URL",
        "HOOKBUS_REDIS_PASSWORD",
        "HOOKBUS_PREFIX",
        "HOOKBUS_HEARTBEAT_SECS",
        "HOOKBUS_LIVENESS_SECS",
        "HOOKBUS_CLAIM_IDLE_SECS",
        "HOOKBUS_EVENTS_MAXLEN",
        "HOOKBUS_REQUESTS_MAXLEN",
        "HOOKBUS_SESSION_TTL_SECS",
        "HOOKBUS_REFRESH_SECS",
        "HOOKBUS_PARTITIONS",
        "HOOKBUS_DURABLE_REPLICAS",
        "HOOKBUS_DURABLE_WAIT_MS",
        "HOOKBUS_AUDIT_MAXLEN",
        "HOOKBUS_ASYNC_TIMEOUT_SECS",
        "HOOKBUS_TRUNCATE_CHARS",
        "HOOKBUS_MAX_OUTPUT_CHARS",
        "HOOKBUS_AUDIT_DB",
        "HOOKBUS_HEALTH_PORT",
        "HOOKBUS_LOG_FORMAT",
        "HOOKBUS_FAIL_OPEN_UNTIL_DIRECTORY",
        "HOOKBUS_RETRY_SECS",  # operator commands (workers/cli/common.py)
        # The HTTP gateway (workers/services/gateway.py) and the Claude Code command hook
        # (workers/integrations/command_hook.py): docs/integrations.md.
        *(f"HOOKBUS_GATEWAY_{v}" for v in ("HOST", "PORT", "TIMEOUT", "TOKEN", "TOKENS", "URL")),
        "HOOKBUS_COMMAND",
        *(f"HOOKBUS_COMMAND_{v}" for v in ("NAME", "EVENTS", "MATCHER", "TIMEOUT", "CWD")),
        "HOOKBUS_COMMAND_FAILURE_POLICY",
        "HOOKBUS_SECRETS_DIR",
        "HOOKBUS_ACL_TEMPLATE",
        "HOOKBUS_ACL_FILE",
        *(
            f"HOOKBUS_{role}_PASSWORD"
            for role in ("COORDINATOR", "AGENT", "OPERATOR", "SCALER", "ADMIN")
        ),
    }
)
#: Left alone: names a test suite may use for itself.
RESERVED_PREFIXES = ("HOOKBUS_TEST_",)
#: The passwords start.sh reads for the generated users ``hook-NAME`` and ``tenant-NAME``
#: (workers/ops/acl.py): one per hook service and per tenant, so known by their form.
USER_PASSWORD = re.compile(r"^HOOKBUS_(HOOK|TENANT)_[A-Z0-9_]+_PASSWORD$")


def unknown_variables(env: Mapping[str, str] | None = None) -> list[str]:
    """Each ``HOOKBUS_*`` variable in ``env`` that HookBus does not read, with a "did you mean"
    when one it reads is close: a typo there silently means the default."""
    env = os.environ if env is None else env
    found = []
    for name in sorted(env):
        if not name.startswith("HOOKBUS_") or name in KNOWN_VARIABLES:
            continue
        if name.endswith("_FILE") and name.removesuffix("_FILE") in KNOWN_VARIABLES:
            continue
        if name.startswith(RESERVED_PREFIXES) or USER_PASSWORD.match(name):
            continue
        close = difflib.get_close_matches(name, KNOWN_VARIABLES, n=1, cutoff=0.75)
        found.append(f"{name} (did you mean {close[0]}?)" if close else name)
    return found


def from_files(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` with each ``X_FILE`` of a known variable ``X`` replaced by ``X``, the content of
    that file (one trailing newline dropped). Giving both, or a file that cannot be read, is a
    ConfigError."""
    out = dict(env)
    for name in KNOWN_VARIABLES:
        path = env.get(f"{name}_FILE")
        if not path:
            continue
        if env.get(name):
            raise ConfigError(f"both {name} and {name}_FILE are set: give one")
        try:
            with open(path, encoding="utf-8") as f:
                value = f.read()
        except OSError as exc:
            raise ConfigError(f"{name}_FILE={path}: {exc.strerror or exc}") from None
        out[name] = value[:-1] if value.endswith("\n") else value
        del out[f"{name}_FILE"]
    return out


def env_value(name: str, env: Mapping[str, str] | None = None) -> str | None:
    """The value of one known variable, from ``name`` or ``name_FILE`` (for settings read
    outside this module, such as the audit log hook's database)."""
    return from_files(os.environ if env is None else env).get(name) or None


def with_password(url: str, password: str) -> str:
    """``url`` with ``password`` as its password (URL-quoted: any characters will do). A URL
    that already carries a password is a ConfigError: say it once."""
    parts = urllib.parse.urlsplit(url)
    query = urllib.parse.parse_qs(parts.query)
    if parts.password is not None or "password" in query:
        raise ConfigError(
            "HOOKBUS_REDIS_PASSWORD is set and the Redis URL holds a password too: give one"
        )
    if parts.scheme == "unix":  # no host part: redis-py reads it from the query
        return f"{url}{'&' if parts.query else '?'}{urllib.parse.urlencode({'password': password})}"
    user = urllib.parse.quote(urllib.parse.unquote(parts.username or ""), safe="")
    secret = urllib.parse.quote(password, safe="")
    host = parts.netloc.rsplit("@", 1)[-1]
    return urllib.parse.urlunsplit(parts._replace(netloc=f"{user}:{secret}@{host}"))


#: Accepted Redis URL schemes; the ``+cluster`` ones select redis-py's cluster client.
URL_SCHEMES = ("redis://", "rediss://", "unix://", "redis+cluster://", "rediss+cluster://")
CLUSTER_URL_SCHEMES = ("redis+cluster://", "rediss+cluster://")


def cluster_seeds(url: str) -> list[tuple[str, int]]:
    """The seed nodes a ``redis+cluster://`` URL names, in order: one or more ``host:port``
    separated by commas (``redis+cluster://user@h1:7000,h2:7001,[::1]:7002/0``; the port
    defaults to 6379). Any one that answers is enough for the client to learn the cluster; a
    name that resolves to several addresses is tried at each (bus/transport/redis_io.py)."""
    rest = url.split("://", 1)[1]
    hosts = re.split(r"[/?#]", rest.rsplit("@", 1)[-1], maxsplit=1)[0]
    seeds = []
    for item in hosts.split(","):
        match = re.fullmatch(r"(\[[0-9a-fA-F:.]+\]|[^:\[\]]+)(?::(\d+))?", item.strip())
        if match is None or not 0 < int(match[2] or 6379) < 65536:
            raise ConfigError(
                f"Redis Cluster URL {redacted(url)!r}: {item.strip()!r} is not a host:port seed "
                "(several are separated by commas: redis+cluster://h1:7000,h2:7001/0)"
            )
        seeds.append((match[1].strip("[]"), int(match[2] or 6379)))
    return seeds


class BusSettings(msgspec.Struct, frozen=True, kw_only=True):
    """How the distributed mode talks to Redis.

    Attributes:
        redis_url: ``HOOKBUS_REDIS_URL`` (``redis://``, ``rediss://``, ``unix://``, or
            ``redis+cluster://`` / ``rediss+cluster://`` for a Redis Cluster, naming one or
            more seed nodes separated by commas, ``redis+cluster://h1:7000,h2:7001/0``, or a
            DNS name that resolves to several: any live one is enough to start;
            :func:`cluster_seeds`).
        prefix: ``HOOKBUS_PREFIX`` for every key (default ``hookbus``).
        heartbeat_secs: how often a worker refreshes its heartbeat (``HOOKBUS_HEARTBEAT_SECS``, 1).
        liveness_secs: a replica without a heartbeat for this long is dead
            (``HOOKBUS_LIVENESS_SECS``, 3).
        claim_idle_secs: a request pending this long on a silent replica is taken over by
            another (``HOOKBUS_CLAIM_IDLE_SECS``, 1).
        events_maxlen: approximate length the events stream is trimmed to
            (``HOOKBUS_EVENTS_MAXLEN``, 100000).
        requests_maxlen: the same for each hook's request stream (``HOOKBUS_REQUESTS_MAXLEN``,
            10000).
        audit_maxlen: approximate length the audit trail ``{p}:audit`` is trimmed to
            (``HOOKBUS_AUDIT_MAXLEN``, 10000). Like the events stream, never past what a group
            that follows it still needs; publishers cap it at 10 times that
            (bus/transport/retention.py).
        session_ttl_secs: how long session hooks and cancellations outlive their last use
            (``HOOKBUS_SESSION_TTL_SECS``, 3600).
        refresh_secs: how often a coordinator re-reads the hook directory
            (``HOOKBUS_REFRESH_SECS``, 1).
        partitions: how many partitions the events and decisions streams have
            (``HOOKBUS_PARTITIONS``, 1); every process of one bus must use the same number.
        durable_replicas: the durable mode (``HOOKBUS_DURABLE_REPLICAS``, 0 = off): a
            coordinator counts an event or request as published only once this many replicas
            of its Redis master have it (``WAIT``), so a failover cannot lose it silently.
        durable_wait_ms: how long a durable publish waits for them
            (``HOOKBUS_DURABLE_WAIT_MS``, 1000).
        health_port: where services (workers, coordinators) answer ``/livez`` and ``/readyz``
            over HTTP (``HOOKBUS_HEALTH_PORT``, 0 = no health endpoint; workers/services/probes.py).
        fail_open_until_directory: the operator's opt-out of failing closed before the hook
            directory is read (``HOOKBUS_FAIL_OPEN_UNTIL_DIRECTORY``, off). Off: until a
            coordinator has read the directory once, it blocks every tool call, denies every
            permission request and withholds tool output (``bus/unread.py``). On: it decides
            as if no hook service were registered, and logs a warning each time it does
            (docs/reliability.md, promise 1).
    """

    redis_url: str = DEFAULT_REDIS_URL
    prefix: str = "hookbus"
    heartbeat_secs: float = 1.0
    liveness_secs: float = 3.0
    claim_idle_secs: float = 1.0
    events_maxlen: int = 100_000
    requests_maxlen: int = 10_000
    audit_maxlen: int = 10_000
    session_ttl_secs: int = 3600
    refresh_secs: float = 1.0
    partitions: int = 1
    durable_replicas: int = 0
    durable_wait_ms: int = 1000
    health_port: int = 0
    fail_open_until_directory: bool = False

    @classmethod
    def from_env(
        cls, env: Mapping[str, str] | None = None, *, redis_url: str | None = None
    ) -> BusSettings:
        env = from_files(os.environ if env is None else env)
        url = redis_url or env.get("HOOKBUS_REDIS_URL") or DEFAULT_REDIS_URL
        if not url.startswith(URL_SCHEMES):
            raise ConfigError(f"Redis URL {url!r} must start with {', '.join(URL_SCHEMES)}")
        if url.startswith(CLUSTER_URL_SCHEMES):
            cluster_seeds(url)  # one line now, not a traceback at the first command
        if password := env.get("HOOKBUS_REDIS_PASSWORD"):
            url = with_password(url, password)
        return cls(
            redis_url=url,
            prefix=env.get("HOOKBUS_PREFIX") or "hookbus",
            heartbeat_secs=_positive(env, "HOOKBUS_HEARTBEAT_SECS", 1.0),
            liveness_secs=_positive(env, "HOOKBUS_LIVENESS_SECS", 3.0),
            claim_idle_secs=_positive(env, "HOOKBUS_CLAIM_IDLE_SECS", 1.0),
            events_maxlen=_int(env, "HOOKBUS_EVENTS_MAXLEN", 100_000),
            requests_maxlen=_int(env, "HOOKBUS_REQUESTS_MAXLEN", 10_000),
            audit_maxlen=_int(env, "HOOKBUS_AUDIT_MAXLEN", 10_000),
            session_ttl_secs=_int(env, "HOOKBUS_SESSION_TTL_SECS", 3600),
            refresh_secs=_positive(env, "HOOKBUS_REFRESH_SECS", 1.0),
            partitions=_int(env, "HOOKBUS_PARTITIONS", 1),
            durable_replicas=_count(env, "HOOKBUS_DURABLE_REPLICAS", 0),
            durable_wait_ms=_int(env, "HOOKBUS_DURABLE_WAIT_MS", 1000),
            health_port=_port(env, "HOOKBUS_HEALTH_PORT"),
            fail_open_until_directory=_switch(env, "HOOKBUS_FAIL_OPEN_UNTIL_DIRECTORY"),
        )


def redacted(url: str) -> str:
    """The URL without its password."""
    parts = urllib.parse.urlsplit(url)
    if "password=" in parts.query:  # unix:///path?password=… (bus.settings.with_password)
        url = re.sub(r"([?&]password=)[^&#]*", r"\1***", url)
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)[1]
    user = f"{parts.username}:***@" if parts.username else ":***@"
    return urllib.parse.urlunsplit(parts._replace(netloc=user + netloc))
