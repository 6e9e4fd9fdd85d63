"""``hookbus gateway``: its options, and serving, adding or revoking tokens from the command
line. The gateway itself (tokens, tenants, the HTTP app) is workers/services/gateway.py."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import secrets
import signal
import sys
import urllib.error
import urllib.request
from pathlib import Path

import msgspec

from bus.errors import ConfigError
from bus.protocol import (
    MAX_MESSAGE_BYTES,
)
from bus.settings import BusSettings
from bus.transport.keys import check_tenant
from workers.services.gateway import (
    DEFAULT_PORT,
    DEFAULT_TIMEOUT_MS,
    Gateway,
    TokenFile,
    Tokens,
    app,
    digest,
    log,
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``hookbus gateway``'s options (``--redis`` and ``--prefix`` come with every command)."""
    env = os.environ
    parser.add_argument("--host", default=env.get("HOOKBUS_GATEWAY_HOST", "127.0.0.1"),
                        help="address to listen on (127.0.0.1; $HOOKBUS_GATEWAY_HOST)")  # fmt: skip
    parser.add_argument(
        "--port", type=int, default=int(env.get("HOOKBUS_GATEWAY_PORT", DEFAULT_PORT)),
        help=f"port to listen on ({DEFAULT_PORT}; $HOOKBUS_GATEWAY_PORT)",
    )  # fmt: skip
    parser.add_argument(
        "--tokens", metavar="FILE", default=env.get("HOOKBUS_GATEWAY_TOKENS"),
        help="the token file: one `tenant:sha256hex-of-token` line per token "
        "($HOOKBUS_GATEWAY_TOKENS)",
    )  # fmt: skip
    parser.add_argument(
        "--timeout-ms", type=int, default=DEFAULT_TIMEOUT_MS, metavar="MS",
        help=f"how long a /claude-code call may take ({DEFAULT_TIMEOUT_MS}); /v1/decisions "
        "requests carry their own timeout_ms",
    )  # fmt: skip
    parser.add_argument(
        "--max-body", type=int, default=MAX_MESSAGE_BYTES, metavar="BYTES",
        help=f"largest request body accepted ({MAX_MESSAGE_BYTES}); larger: 413",
    )  # fmt: skip
    parser.add_argument(
        "--new-token", metavar="TENANT",
        help="do not serve: add a new token for TENANT to the token file (created if missing, "
        "mode 0600) and print the token",
    )  # fmt: skip
    parser.add_argument(
        "--revoke-token", metavar="TENANT|SHA256",
        help="do not serve: take every token of TENANT (or the one whose SHA-256 is given) out "
        "of the token file; a running gateway answers it 401 within "
        f"{Gateway.TOKENS_CHECK_SECS:g} s",
    )  # fmt: skip
    parser.add_argument(
        "--check", action="store_true",
        help="health check, do not serve: exit 0 if GET /healthz on --host/--port answers 200, "
        "else 1, with one line",
    )  # fmt: skip


def run(args: argparse.Namespace) -> int:
    """``hookbus gateway``: serve until SIGTERM or Ctrl-C (or ``--new-token``, ``--check``)."""
    if args.new_token is not None:
        code = _new_token(args.tokens, args.new_token)
        _serve_tenant(args, args.new_token)
        return code
    if args.revoke_token is not None:
        return _revoke_token(args.tokens, args.revoke_token)
    if args.check:
        return _check(args.host, args.port)
    if args.timeout_ms <= 0 or args.max_body <= 0:
        raise ConfigError("--timeout-ms and --max-body must be positive")
    if not args.tokens:
        Tokens.load(args.tokens)  # the ConfigError that says what to give
    tokens = TokenFile(args.tokens)
    settings = BusSettings.from_env(redis_url=args.redis)
    if args.prefix:
        settings = msgspec.structs.replace(settings, prefix=args.prefix)
    return _serve(settings, tokens, args)


def _new_token(path: str | None, tenant: str) -> int:
    if not path:
        raise ConfigError("--new-token needs --tokens FILE (or HOOKBUS_GATEWAY_TOKENS)")
    check_tenant(tenant)
    token = secrets.token_urlsafe(32)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    with os.fdopen(fd, "a", encoding="utf-8") as f:
        f.write(f"{tenant}:{digest(token)}\n")
    print(token)
    return 0


def _serve_tenant(args: argparse.Namespace, tenant: str) -> None:
    """After ``--new-token``: make ``tenant`` one the bus serves (``hookbus tenants add``), if
    it is not yet, so that its token is answered. Redis unreachable or the credential not
    allowed: said on stderr; the token is written, and gets 401 until an operator adds it."""
    from redis.exceptions import RedisError

    from bus.transport.keys import Keys
    from bus.transport.redis_io import connect
    from workers.cli.common import announce_redis, redis_url, settings_of
    from workers.ops.tenants import add_tenant

    settings = settings_of(args)
    announce_redis(args, settings)
    keys = Keys.of(settings)

    async def serve() -> bool:
        redis = connect(settings)
        try:
            served = {m.decode() if isinstance(m, bytes) else m
                      for m in await redis.smembers(keys.tenants)}  # fmt: skip
            return tenant not in served and await add_tenant(
                redis, keys, tenant, "hookbus gateway --new-token"
            )
        finally:
            await redis.aclose()

    try:
        added = asyncio.run(serve())
    except (RedisError, OSError) as exc:
        print(
            f"hookbus: warning: the token is written, but tenant {tenant} could not be made one "
            f"the bus serves (Redis at {redis_url(args)}: {exc}): its requests get 401 until an "
            f"operator runs: hookbus tenants add {tenant}",
            file=sys.stderr,
        )
        return
    if added:
        print(
            f"hookbus: tenant {tenant} added to the tenants the bus serves ({keys.tenants}); "
            f"hookbus tenants remove {tenant} ends that",
            file=sys.stderr,
        )


def _revoke_token(path: str | None, which: str) -> int:
    """Take the tokens of a tenant, or the one of a digest, out of the token file: rewritten
    whole and renamed over it, so that a gateway reading it never sees half a file."""
    if not path:
        raise ConfigError("--revoke-token needs --tokens FILE (or HOOKBUS_GATEWAY_TOKENS)")
    try:
        text = Path(path).read_text(encoding="utf-8")
        mode = os.stat(path).st_mode & 0o777
    except OSError as exc:
        raise ConfigError(f"cannot read the token file {path}: {exc}") from exc
    kept, revoked = [], []
    for line in text.splitlines(keepends=True):
        tenant, _, hexdigest = line.strip().partition(":")
        if line.strip() and (tenant == which or hexdigest.lower() == which.lower()):
            revoked.append(tenant)
        else:
            kept.append(line)
    if not revoked:
        raise ConfigError(f"no token of tenant {which!r} (nor with that SHA-256) in {path}")
    temporary = f"{path}.{os.getpid()}.new"
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write("".join(kept))
            f.flush()
            os.fsync(f.fileno())
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
    whose = ", ".join(sorted(set(revoked)))
    print(
        f"revoked {len(revoked)} token{'' if len(revoked) == 1 else 's'} of {whose}: a running "
        f"gateway answers {'it' if len(revoked) == 1 else 'them'} 401 within "
        f"{Gateway.TOKENS_CHECK_SECS:g} s"
    )
    return 0


def _check(host: str, port: int) -> int:
    url = f"http://{host}:{port}/healthz"
    try:
        with urllib.request.urlopen(url, timeout=3) as response:
            status = response.status
    except urllib.error.HTTPError as exc:
        status = exc.code
    except OSError as exc:
        print(f"hookbus: no gateway answers at {url}: {exc}")
        return 1
    print(f"{'ok' if status == 200 else 'hookbus'}: {url} answered {status}")
    return 0 if status == 200 else 1


def _serve(settings: BusSettings, tokens: Tokens, args: argparse.Namespace) -> int:
    try:
        import uvicorn
    except ImportError as exc:
        raise ConfigError(
            f"the gateway needs the `gateway` extra: pip install 'hookbus[gateway]' ({exc})"
        ) from exc
    from bus.telemetry import tracing as telemetry
    from bus.transport.coordinator import Coordinator

    telemetry.configure("gateway")
    gateway = Gateway(
        Coordinator(settings, source="gateway"),
        tokens,
        max_body=args.max_body,
        claude_timeout_ms=args.timeout_ms,
    )
    config = uvicorn.Config(
        app(gateway), host=args.host, port=args.port, lifespan="on", log_config=None,
        access_log=False, server_header=False,
    )  # fmt: skip
    server = uvicorn.Server(config)
    from workers.cli.common import describe_redis

    log.info(
        "gateway on http://%s:%d for %d token(s), %s, prefix %s",
        args.host, args.port, len(tokens.tokens.entries), describe_redis(settings.redis_url),
        settings.prefix,
    )  # fmt: skip

    def stopped(signum: int, frame: object) -> None:
        # uvicorn shuts down gracefully on SIGTERM, then raises it again: end here, cleanly.
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, stopped)
    try:
        asyncio.run(server.serve())
    except SystemExit as exc:
        return int(exc.code or 0)
    finally:
        telemetry.shutdown()
    return 0 if server.started else 1
