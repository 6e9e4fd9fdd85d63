"""``hookbus gateway``: decisions over HTTP, for agents that speak neither Redis nor Python.

One POST, one request, one decision:

``POST /v1/decisions``
    The JSON of a ``DecisionRequest`` (docs/protocol.md 3.5) — ``reply_to`` is not needed, and
    ``id`` and ``ts`` may be left out (then a fresh id, and the time the gateway read it) — is
    answered with the ``DecisionReply`` the coordinator service would push (3.6). Every answer
    of this endpoint is a ``DecisionReply``; an error one (``status: "error"``) comes with 400
    (the request breaks the protocol: ``field`` names where), 401, 413 or 504 (no decision
    within ``timeout_ms``).
``POST /claude-code``
    Claude Code's hook input, for its ``http`` hook type (or through the command bridge,
    ``hookbus-claude-code``), answered in Claude Code's hook output format
    (``workers/claude_code.py``, docs/integrations.md). Claude Code runs the tool on any
    answer but a 2xx, so a tool call's input or output no hook can inspect (too deep, too
    large, unreadable) is refused with 200, never answered 400 or 413.
``GET /healthz``
    200 while Redis answers, else 503.
``GET /livez``, ``GET /readyz``
    The probes of every HookBus service (workers/probes.py): ``/livez`` 200 while the process
    answers, Redis not asked; ``/readyz`` as ``/healthz``, and 503 until the hook directory
    has been read.

Every POST needs ``Authorization: Bearer <token>``. The token file holds one ``tenant:sha256``
line per token (the hex SHA-256 of the token, never the token itself); a request's tenant is
the one its token names, never anything in the body, and is recorded as the dispatch's source
(``tenant:<name>`` on the event published to the events stream and on audit records), and
scopes its sessions: a request's session id ``S`` is dispatched as ``<tenant>/S``
(``qualify()``, as by the coordinator service), so a token reaches only its own tenant's
sessions. Dispatches
run on a ``Coordinator`` in this process, with the same ``decide()`` as the coordinator service,
so HTTP and Redis agents get the same semantics.

Starlette and uvicorn are the ``gateway`` extra (``pip install 'hookbus[gateway]'``): they are
imported when the gateway serves, so that the rest of the ``hookbus`` command works without them.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import hmac
import logging
import os
import re
import secrets
import signal
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from bus.errors import ConfigError, InvalidInputError, LimitError, ProtocolError
from bus.events import HookEvent
from bus.protocol import (
    MAX_MESSAGE_BYTES,
    PROTOCOL_VERSION,
    DecisionReply,
    decode_head,
    encode,
    new_id,
    now_ms,
    raw,
)
from bus.ratelog import RateLimitedLog
from bus.settings import BusSettings

if TYPE_CHECKING:
    from starlette.applications import Starlette
    from starlette.requests import Request

    from bus.coordinator import Coordinator

log = logging.getLogger("hookbus.gateway")
_failures = RateLimitedLog(log)

DEFAULT_PORT = 8787
#: How long a ``/claude-code`` call may take, unless ``--timeout-ms`` says otherwise (the
#: ``DecisionRequest`` default).
DEFAULT_TIMEOUT_MS = 30_000
TENANT = re.compile(r"^[A-Za-z0-9_.-]{1,128}$")
SHA256_HEX = re.compile(r"^[0-9a-f]{64}$")
JSON = "application/json"
_EVENT_NAMES = frozenset(event.value for event in HookEvent)


class HttpDecisionRequest(msgspec.Struct, frozen=True, kw_only=True):
    """A ``DecisionRequest`` as posted to ``/v1/decisions``: ``reply_to`` is not needed over HTTP
    (ignored if sent), ``id`` and ``ts`` may be left out."""

    v: int = PROTOCOL_VERSION
    id: str = ""
    ts: int = 0
    traceparent: str = ""
    tracestate: str = ""
    event: HookEvent
    context: msgspec.Raw
    reply_to: str = ""
    timeout_ms: int = 30_000


class _Head(msgspec.Struct):
    """Enough of a request that could not be decoded to answer it."""

    id: str = ""
    event: str = ""


# -- tokens ------------------------------------------------------------------------------------


def digest(token: str) -> str:
    """The hex SHA-256 of a token: what the token file holds."""
    return hashlib.sha256(token.encode()).hexdigest()


@dataclass(frozen=True)
class Tokens:
    """Which tenant each token belongs to, from a file of ``tenant:sha256hex`` lines."""

    entries: tuple[tuple[str, bytes], ...]  # (tenant, SHA-256 of its token)

    @classmethod
    def load(cls, path: str | Path | None) -> Tokens:
        if not path:
            raise ConfigError(
                "the gateway needs a token file: --tokens FILE or HOOKBUS_GATEWAY_TOKENS, one "
                "`tenant:sha256-of-token` line per token (`hookbus gateway --new-token TENANT "
                "--tokens FILE` adds one)"
            )
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"cannot read the token file {path}: {exc}") from exc
        entries = []
        for number, line in enumerate(text.splitlines(), 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            tenant, _, hexdigest = line.partition(":")
            if not TENANT.match(tenant) or not SHA256_HEX.match(hexdigest.lower()):
                raise ConfigError(
                    f"{path}:{number}: expected `tenant:sha256hex` (tenant: 1-128 of A-Z a-z "
                    "0-9 _ . -; the 64 hex digits of the token's SHA-256)"
                )
            entries.append((tenant, bytes.fromhex(hexdigest)))
        if not entries:
            raise ConfigError(f"the token file {path} holds no token")
        return cls(tuple(entries))

    def tenant(self, authorization: str | None) -> str | None:
        """The tenant of an ``Authorization: Bearer <token>`` header, or None.

        Every entry is compared, each in constant time, so that the time taken says nothing
        about which tenants exist or how much of a token was right.
        """
        if not authorization:
            return None
        scheme, _, token = authorization.partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            return None
        presented = hashlib.sha256(token.encode()).digest()
        found = None
        for tenant, expected in self.entries:
            if hmac.compare_digest(presented, expected) and found is None:
                found = tenant
        return found


# -- tenants' sessions --------------------------------------------------------------------------


# -- the gateway, without its HTTP framework -------------------------------------------------


@dataclass
class Answer:
    status: int
    body: bytes
    headers: dict[str, str] = field(default_factory=dict)


def _json(status: int, value: Any, **headers: str) -> Answer:
    return Answer(status, encode(value), headers)


UNAUTHORIZED = {"WWW-Authenticate": 'Bearer realm="hookbus"'}


class Gateway:
    """What each endpoint answers; ``app()`` puts it behind Starlette."""

    def __init__(
        self,
        coordinator: Coordinator,
        tokens: Tokens,
        *,
        max_body: int = MAX_MESSAGE_BYTES,
        claude_timeout_ms: int = DEFAULT_TIMEOUT_MS,
    ) -> None:
        self.coordinator = coordinator
        self.tokens = tokens
        self.max_body = max_body
        self.claude_timeout_ms = claude_timeout_ms
        self.stats = {
            "decisions": 0,
            "claude_code": 0,
            "unauthorized": 0,
            "bad_requests": 0,
            "too_large": 0,
            "timed_out": 0,
            "failed_closed": 0,
            "refused": 0,
            "no_counterpart": 0,
        }

    def error_reply(self, status: int, error: str, request_id: str = "", where: str = "") -> Answer:
        reply = DecisionReply(
            id=new_id(), ts=now_ms(), request_id=request_id, status="error", error=error,
            field=where,
        )  # fmt: skip
        return _json(status, reply, **(UNAUTHORIZED if status == 401 else {}))

    def authorize(self, authorization: str | None) -> str | None:
        tenant = self.tokens.tenant(authorization)
        if tenant is None:
            self.stats["unauthorized"] += 1
        return tenant

    def too_large(self, what: str) -> str:
        self.stats["too_large"] += 1
        return f"{what} is over the {self.max_body}-byte limit"

    async def decisions(self, tenant: str, body: bytes) -> Answer:
        """``POST /v1/decisions``: one ``DecisionRequest``, one ``DecisionReply``."""
        from workers.coordinator_service import decide, qualify, read_request, refused_reply

        self.stats["decisions"] += 1
        try:
            request, ctx = read_request(body, HttpDecisionRequest)
        except InvalidInputError as exc:
            # Reading the head of a body over the bounds walks all of it (up to ~0.2 s for a
            # megabyte of small strings): off the event loop, so that other decisions go on.
            head = await asyncio.to_thread(decode_head, body, _Head) or _Head()
            if isinstance(exc, LimitError) and head.event in _EVENT_NAMES:
                # A context no hook could be shown: refused, as by the coordinator service.
                self.stats["refused"] += 1
                _failures.warning("refused %s request of tenant %s: %s", head.event, tenant, exc)
                return _json(200, refused_reply(head.id, HookEvent(head.event), exc))
            self.stats["bad_requests"] += 1
            where = exc.field if isinstance(exc, ProtocolError) else ""
            return self.error_reply(400, str(exc), head.id, where)
        if not request.id or not request.ts:
            request = msgspec.structs.replace(
                request, id=request.id or new_id(), ts=request.ts or now_ms()
            )
        # The tenant's sessions are its own: qualified as the coordinator service does.
        ctx = qualify(ctx, tenant)
        reply = await decide(self.coordinator, request, ctx, source=f"tenant:{tenant}")
        if reply is None or reply.status == "error":
            self.stats["timed_out"] += 1
            error = f"no decision within timeout_ms={request.timeout_ms}"
            return self.error_reply(504, reply.error if reply else error, request.id)
        return _json(200, reply)

    async def claude_code(self, tenant: str, body: bytes, *, whole: bool = True) -> Answer:
        """``POST /claude-code``: Claude Code's hook input, answered in its output format.
        ``whole`` False: ``body`` is the first part of a body over ``max_body``."""
        from workers.claude_code import fail_closed, to_claude_code, to_hookbus
        from workers.coordinator_service import decide, qualify

        self.stats["claude_code"] += 1
        if not whole:
            error = LimitError(self.too_large("the hook input"), limit="max_body")
            return await self._unreadable(tenant, body, error, 413)
        try:
            call = to_hookbus(body)
            if call is None:  # an event HookBus has no counterpart for: no opinion
                self.stats["no_counterpart"] += 1
                return _json(200, {})
            ctx = qualify(call.ctx, tenant)
            context = raw(ctx)
        except InvalidInputError as exc:
            return await self._unreadable(tenant, body, exc, 400)
        request = HttpDecisionRequest(
            id=new_id(), ts=now_ms(), event=call.event, context=context,
            timeout_ms=self.claude_timeout_ms,
        )  # fmt: skip
        reply = await decide(self.coordinator, request, ctx, source=f"tenant:{tenant}")
        if reply is not None and reply.status == "ok":
            return _json(200, to_claude_code(call, reply.result))
        self.stats["timed_out"] += 1
        reason = f"HookBus reached no decision within {self.claude_timeout_ms} ms"
        # Claude Code takes any answer but a 2xx as a non-blocking error and runs the tool: a
        # call that waits on a decision is denied instead (never approved by default).
        closed = fail_closed(call, f"{reason}; denied (fail closed)")
        if closed is not None:
            self.stats["failed_closed"] += 1
            return _json(200, closed)
        return _json(504, {"error": reason})

    async def _unreadable(
        self, tenant: str, body: bytes, exc: InvalidInputError, status: int
    ) -> Answer:
        """A Claude Code hook input no hook could be shown: too large, too deep, not JSON, not
        Claude Code's. Claude Code runs the tool on any answer but a 2xx, so the events that
        gate a tool or carry its output get the refusal with 200 (denied, output withheld), as
        every agent does (protocol.md 5.6); any other input gets ``status`` (400, 413)."""
        from workers.claude_code import event_named, refused

        name = await asyncio.to_thread(event_named, body)  # may walk a deep body: off the loop
        if answer := refused(name, str(exc)):
            self.stats["refused"] += 1
            _failures.warning("refused %s input of tenant %s: %s", name, tenant, exc)
            return _json(200, answer)
        self.stats["bad_requests"] += 1
        return _json(status, {"error": str(exc), "field": getattr(exc, "field", "")})

    async def health(self) -> Answer:
        """``GET /healthz``: 200 while Redis answers (within 1 s), else 503."""
        from redis.exceptions import RedisError

        try:
            async with asyncio.timeout(1.0):
                await self.coordinator.redis.ping()
        except (RedisError, OSError, TimeoutError) as exc:
            return _json(503, {"status": "unavailable", "error": f"Redis: {exc!r}"})
        hooks = len(self.coordinator.directory.by_name)
        return _json(200, {"status": "ok", "hooks": hooks, "stats": self.stats})


# -- on Starlette ------------------------------------------------------------------------------


async def _read(request: Request, limit: int) -> tuple[bytes, bool]:
    """The request's body and True; or, once it is longer than ``limit`` bytes (declared or
    sent), what was read of it (at most ``limit`` bytes and a chunk) and False."""
    declared = request.headers.get("content-length", "")
    chunks, size = [], 0
    async for chunk in request.stream():
        chunks.append(chunk)
        size += len(chunk)
        if size > limit:
            break
    over = size > limit or (declared.isdigit() and int(declared) > limit)
    return b"".join(chunks), not over


def app(gateway: Gateway) -> Starlette:
    """The gateway's ASGI application; its lifespan starts and closes the coordinator."""
    import contextlib

    from starlette.applications import Starlette
    from starlette.responses import Response
    from starlette.routing import Route

    def respond(answer: Answer) -> Response:
        return Response(answer.body, answer.status, answer.headers, media_type=JSON)

    async def decisions(request: Request) -> Response:
        tenant = gateway.authorize(request.headers.get("authorization"))
        if tenant is None:
            return respond(gateway.error_reply(401, "a valid bearer token is needed"))
        body, whole = await _read(request, gateway.max_body)
        if not whole:
            return respond(gateway.error_reply(413, gateway.too_large("the request")))
        return respond(await gateway.decisions(tenant, body))

    async def claude_code(request: Request) -> Response:
        tenant = gateway.authorize(request.headers.get("authorization"))
        if tenant is None:
            return respond(_json(401, {"error": "a valid bearer token is needed"}, **UNAUTHORIZED))
        body, whole = await _read(request, gateway.max_body)
        return respond(await gateway.claude_code(tenant, body, whole=whole))

    async def health(request: Request) -> Response:
        return respond(await gateway.health())

    # The services' probe convention (workers/probes.py): /livez asks nothing of Redis (an
    # outage restarts no pod); /readyz as /healthz, and not before the hook directory is read.
    async def livez(request: Request) -> Response:
        return Response(b"ok\n", 200, media_type="text/plain")

    async def readyz(request: Request) -> Response:
        if (why := gateway.coordinator.not_deciding()) is not None:
            return respond(_json(503, {"status": "unavailable", "error": why}))
        return respond(await gateway.health())

    @contextlib.asynccontextmanager
    async def lifespan(_: Starlette) -> Any:
        await gateway.coordinator.start()
        try:
            yield
        finally:
            await gateway.coordinator.close()
            log.info("gateway stopped: %s", gateway.stats)

    return Starlette(
        routes=[
            Route("/v1/decisions", decisions, methods=["POST"]),
            Route("/claude-code", claude_code, methods=["POST"]),
            Route("/healthz", health, methods=["GET"]),
            Route("/livez", livez, methods=["GET"]),
            Route("/readyz", readyz, methods=["GET"]),
        ],
        lifespan=lifespan,
    )


# -- the command -------------------------------------------------------------------------------


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
        "--check", action="store_true",
        help="health check, do not serve: exit 0 if GET /healthz on --host/--port answers 200, "
        "else 1, with one line",
    )  # fmt: skip


def run(args: argparse.Namespace) -> int:
    """``hookbus gateway``: serve until SIGTERM or Ctrl-C (or ``--new-token``, ``--check``)."""
    if args.new_token is not None:
        return _new_token(args.tokens, args.new_token)
    if args.check:
        return _check(args.host, args.port)
    if args.timeout_ms <= 0 or args.max_body <= 0:
        raise ConfigError("--timeout-ms and --max-body must be positive")
    tokens = Tokens.load(args.tokens)
    settings = BusSettings.from_env(redis_url=args.redis)
    if args.prefix:
        settings = msgspec.structs.replace(settings, prefix=args.prefix)
    return _serve(settings, tokens, args)


def _new_token(path: str | None, tenant: str) -> int:
    if not path:
        raise ConfigError("--new-token needs --tokens FILE (or HOOKBUS_GATEWAY_TOKENS)")
    if not TENANT.match(tenant):
        raise ConfigError(f"tenant {tenant!r}: 1-128 characters of A-Z a-z 0-9 _ . -")
    token = secrets.token_urlsafe(32)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    with os.fdopen(fd, "a", encoding="utf-8") as f:
        f.write(f"{tenant}:{digest(token)}\n")
    print(token)
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
    from bus import telemetry
    from bus.coordinator import Coordinator

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
    log.info(
        "gateway on http://%s:%d for %d token(s), Redis prefix %s",
        args.host, args.port, len(tokens.entries), settings.prefix,
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
