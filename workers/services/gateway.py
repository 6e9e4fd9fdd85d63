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
    (``workers/integrations/claude_code.py``, docs/integrations.md). Claude Code runs the tool on
    any answer but a 2xx, so a tool call's input or output no hook can inspect (too deep, too
    large, unreadable) is refused with 200, never answered 400 or 413.
``POST /v1/sessions/{id}/cancel``
    Cancel one of the token's tenant's own sessions (``<tenant>/id``, as ``hookbus cancel``
    would): its next tool call is blocked, wherever it runs. 200 ``{"cancelled": "<tenant>/id"}``.
``GET /healthz``
    200 while Redis answers, else 503.
``GET /livez``, ``GET /readyz``
    The probes of every HookBus service (workers/services/probes.py): ``/livez`` 200 while the
    process answers, Redis not asked; ``/readyz`` as ``/healthz``, and 503 until the hook directory
    has been read.

Every POST needs ``Authorization: Bearer <token>``. The token file holds one ``tenant:sha256``
line per token (the hex SHA-256 of the token, never the token itself); it is read again when it
changes (checked every ``TOKENS_CHECK_SECS``), so that a token removed from it (``--revoke-token``)
gets 401 within that, without a restart. A token is answered only while its tenant is one the
bus serves (``{p}:tenants``, ``hookbus tenants add|remove``, read every
``TENANTS_REFRESH_SECS``): a removed tenant's tokens get 401. A request's tenant is
the one its token names, never anything in the body, and is recorded as the dispatch's source
(``tenant:<name>`` on the event published to the events stream and on audit records), and
scopes its sessions: a request's session id ``S`` is dispatched as ``<tenant>/S``
(``qualify()``, as by the coordinator service), so a token reaches only its own tenant's
sessions. Dispatches
run on a ``Coordinator`` in this process, with the same ``decide()`` as the coordinator service,
so HTTP and Redis agents get the same semantics. A POST's W3C ``traceparent`` header continues
the caller's trace through the dispatch (docs/protocol.md 6.9).

Starlette and uvicorn are the ``gateway`` extra (``pip install 'hookbus[gateway]'``): they are
imported when the gateway serves, so that the rest of the ``hookbus`` command works without them.

Why one module: the gateway is one service answered three ways (decisions, Claude Code,
cancellations), and every route first checks what this module keeps: tokens and the tenants the
bus serves; the Starlette routes are thin. Its command line is workers/cli/gateway.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import logging
import os
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from bus import limits
from bus.actions import PostToolUseResult
from bus.errors import ConfigError, InvalidInputError, LimitError, ProtocolError
from bus.events import HookEvent
from bus.protocol import (
    MAX_MESSAGE_BYTES,
    PROTOCOL_VERSION,
    DecisionReply,
    TimeoutMs,
    decode_head,
    encode,
    new_id,
    now_ms,
    raw,
)
from bus.ratelog import RateLimitedLog
from bus.telemetry import metrics

if TYPE_CHECKING:
    from starlette.applications import Starlette
    from starlette.requests import Request

    from bus.transport.coordinator import Coordinator

log = logging.getLogger("hookbus.gateway")
_failures = RateLimitedLog(log)

DEFAULT_PORT = 8787
#: How long a ``/claude-code`` call may take, unless ``--timeout-ms`` says otherwise (the
#: ``DecisionRequest`` default).
DEFAULT_TIMEOUT_MS = 30_000
#: Tenant names as ``hookbus tenants`` takes them (bus/transport/keys.py): a token's tenant must be
#: one the bus can serve.
TENANT = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
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
    timeout_ms: TimeoutMs = 30_000


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
    def load(cls, path: str | Path | None, *, empty: bool = False) -> Tokens:
        """The tokens of the file at ``path``; a ConfigError naming the line for a file that
        cannot be used, and for one that holds no token unless ``empty``."""
        if not path:
            raise ConfigError(
                "the gateway needs a token file: --tokens FILE or HOOKBUS_GATEWAY_TOKENS, one "
                "`tenant:sha256-of-token` line per token (`hookbus gateway --new-token TENANT "
                "--tokens FILE` adds one)"
            )
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"cannot read the token file {path}: {exc}") from exc
        entries = []
        for number, line in enumerate(text.splitlines(), 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            tenant, _, hexdigest = line.partition(":")
            if not TENANT.match(tenant) or not SHA256_HEX.match(hexdigest.lower()):
                raise ConfigError(
                    f"{path}:{number}: expected `tenant:sha256hex` (tenant: 1-64 of A-Z a-z "
                    "0-9 _ -, as `hookbus tenants add` takes it; the 64 hex digits of the "
                    "token's SHA-256)"
                )
            entries.append((tenant, bytes.fromhex(hexdigest)))
        if not entries and not empty:
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


class TokenFile:
    """The token file, read again when it changes: its identity, size and times are checked
    (``check()``); a changed file that cannot be used (unreadable, a line that is not
    ``tenant:sha256hex``) leaves the tokens read before in force, logged as an error, until it
    is fixed. A file that holds no token (every one revoked) is used: every request gets 401."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._seen = self._signature()
        self.tokens = Tokens.load(self.path)

    def _signature(self) -> tuple[int, ...] | None:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)

    def check(self) -> bool:
        """Read the file again if it changed; True if the tokens did."""
        seen = self._signature()
        if seen == self._seen:
            return False
        self._seen = seen
        try:
            tokens = Tokens.load(self.path, empty=True)
        except ConfigError as exc:
            _failures.error(
                "the token file changed but cannot be used; the %d token(s) read before stay "
                "in force (a token taken out of it is accepted until it is fixed): %s",
                len(self.tokens.entries), exc, key="token file",
            )  # fmt: skip
            return False
        if tokens == self.tokens:
            return False
        before = {t for t, _ in self.tokens.entries}
        self.tokens = tokens
        tenants = {t for t, _ in tokens.entries}
        log.info(
            "token file %s read again: %d token(s) of %d tenant(s)%s",
            self.path, len(tokens.entries), len(tenants),
            f"; no token left for {', '.join(sorted(before - tenants))}"
            if before - tenants else "",
        )  # fmt: skip
        return True


# -- tenants the bus serves ---------------------------------------------------------------------


class ServedTenants:
    """The tenants the bus serves (``{p}:tenants``, which ``hookbus tenants add|remove`` keeps
    and the coordinator service follows too), as last read. Until a first read (Redis down at
    start) every tenant with a token counts as served: the dispatch then decides under the
    hooks' failure policies, where a 401 would make Claude Code run the tool unchecked. While
    Redis cannot be read, the last list read stays in force."""

    def __init__(self) -> None:
        self.names: frozenset[str] | None = None

    def serves(self, tenant: str) -> bool:
        return self.names is None or tenant in self.names

    async def read(self, redis: Any, key: str) -> None:
        members = await redis.smembers(key)
        names = frozenset(m.decode() if isinstance(m, bytes) else str(m) for m in members)
        if self.names is not None:
            for gone in sorted(self.names - names):
                log.info("tenant %s removed: its tokens get 401", gone)
        self.names = names


# -- the gateway, without its HTTP framework -------------------------------------------------


@dataclass
class Answer:
    status: int
    body: bytes
    headers: dict[str, str] = field(default_factory=dict)


def _json(status: int, value: Any, **headers: str) -> Answer:
    return Answer(status, encode(value), headers)


UNAUTHORIZED = {"WWW-Authenticate": 'Bearer realm="hookbus"'}
POST_TOOL_USE, POST_TOOL_USE_FAILURE = HookEvent.POST_TOOL_USE, HookEvent.POST_TOOL_USE_FAILURE


#: The longest session id ``/v1/sessions/{id}/cancel`` takes (characters).
MAX_SESSION_ID = 1024
#: A body longer than this with more brackets than ``MAX_DEPTH`` may take milliseconds to read
#: (bus/limits.py's scan, msgspec's parse; tens of them when it is nested past what msgspec
#: skips and its head is walked in Python): it is read off the event loop, one at a time
#: (``Gateway._walk``). A shorter one costs at most about 2 ms: read on the loop.
WALK_BYTES = 16_384


def _heavy(body: bytes) -> bool:
    """Whether reading ``body`` may be slow (two C passes over it, no parse)."""
    return len(body) > WALK_BYTES and (
        limits.openers(body) > limits.MAX_DEPTH or limits.has_surrogate_escape(body)
    )


class Gateway:
    """What each endpoint answers; ``app()`` puts it behind Starlette."""

    #: How often the tenants the bus serves are read again, and the token file checked.
    TENANTS_REFRESH_SECS = 0.5
    TOKENS_CHECK_SECS = 1.0

    def __init__(
        self,
        coordinator: Coordinator,
        tokens: Tokens | TokenFile,
        *,
        max_body: int = MAX_MESSAGE_BYTES,
        claude_timeout_ms: int = DEFAULT_TIMEOUT_MS,
    ) -> None:
        self.coordinator = coordinator
        self.token_file = tokens if isinstance(tokens, TokenFile) else None
        self._tokens = tokens if isinstance(tokens, Tokens) else tokens.tokens
        self.tenants = ServedTenants()
        self.max_body = max_body
        self.claude_timeout_ms = claude_timeout_ms
        # Bodies that may be slow to read are read in a thread, one at a time (as the
        # coordinator service reads the heads of requests over the bounds), and each tenant's
        # behind its own: a tenant's flood holds another's at most one read, and its threads
        # never take more than one thread's share of the interpreter from the event loop.
        self._walking = asyncio.Semaphore(1)
        self._walkers: dict[str, asyncio.Semaphore] = {}
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
            "not_served": 0,
            "unauthorized_refused": 0,
            "cancelled": 0,
        }
        metrics.watch(coordinator, "coordinator")  # at /metrics (bus/telemetry/metrics.py)
        metrics.track(self, "gateway", "gateway")
        metrics.track_refusals(self, "request", lambda g: g.stats["refused"])

    @property
    def tokens(self) -> Tokens:
        return self.token_file.tokens if self.token_file is not None else self._tokens

    async def read_tenants(self) -> None:
        """Read the tenants the bus serves (Redis unreachable: the last list read stays)."""
        from redis.exceptions import RedisError

        try:
            async with asyncio.timeout(2.0):
                await self.tenants.read(self.coordinator.redis, self.coordinator.keys.tenants)
        except (RedisError, OSError, TimeoutError) as exc:
            _failures.warning("cannot read the tenants the bus serves: %r", exc, key="tenants")

    async def keep_current(self) -> None:
        """Follow ``{p}:tenants`` and the token file until cancelled."""
        next_check = time.monotonic() + self.TOKENS_CHECK_SECS
        while True:
            await asyncio.sleep(self.TENANTS_REFRESH_SECS)
            try:
                await self.read_tenants()
                if self.token_file is not None and time.monotonic() >= next_check:
                    next_check = time.monotonic() + self.TOKENS_CHECK_SECS
                    self.token_file.check()
            except Exception:  # following them outlives anything: a revocation must land
                _failures.error("following the tenants and tokens failed", exc_info=True)

    def unserved(self) -> list[str]:
        """The tenants with a token that the bus does not serve."""
        return sorted({t for t, _ in self.tokens.entries if not self.tenants.serves(t)})

    def error_reply(self, status: int, error: str, request_id: str = "", where: str = "") -> Answer:
        reply = DecisionReply(
            id=new_id(), ts=now_ms(), request_id=request_id, status="error", error=error,
            field=where,
        )  # fmt: skip
        return _json(status, reply, **(UNAUTHORIZED if status == 401 else {}))

    def authorize(self, authorization: str | None) -> tuple[str | None, str]:
        """The request's tenant, or None and why not: no valid token, or one whose tenant the
        bus does not serve (removed, or never added)."""
        tenant = self.tokens.tenant(authorization)
        if tenant is None:
            self.stats["unauthorized"] += 1
            return None, "a valid bearer token is needed"
        if not self.tenants.serves(tenant):
            self.stats["not_served"] += 1
            _failures.warning(
                "refused a request of tenant %s: not a tenant the bus serves (hookbus tenants "
                "add %s)", tenant, tenant, key=f"unserved {tenant}",
            )  # fmt: skip
            return None, "the token's tenant is not served (hookbus tenants list)"
        return tenant, ""

    async def _walk(self, tenant: str, read: Callable[[bytes], Any], body: bytes) -> Any:
        """``read(body)`` in a thread, after the tenant's reads before it, one at a time."""
        mine = self._walkers.get(tenant)
        if mine is None:
            mine = self._walkers[tenant] = asyncio.Semaphore(1)
        async with mine, self._walking:
            return await asyncio.to_thread(read, body)

    def too_large(self, what: str) -> str:
        self.stats["too_large"] += 1
        return f"{what} is over the {self.max_body}-byte limit"

    async def decisions(self, tenant: str, body: bytes) -> Answer:
        """``POST /v1/decisions``: one ``DecisionRequest``, one ``DecisionReply``."""
        from workers.services.coordinator_service import (
            decide,
            qualify,
            read_request,
            refused_reply,
        )

        def read(data: bytes) -> tuple[HttpDecisionRequest, Any] | tuple[InvalidInputError, _Head]:
            try:
                return read_request(data, HttpDecisionRequest)
            except InvalidInputError as exc:
                # Reading the head of a body over the bounds walks all of it (up to ~0.2 s
                # for a megabyte of small strings).
                return exc, decode_head(data, _Head) or _Head()

        self.stats["decisions"] += 1
        found = await self._walk(tenant, read, body) if _heavy(body) else read(body)
        if isinstance(found[0], InvalidInputError):
            exc, head = found
            if isinstance(exc, LimitError) and head.event in _EVENT_NAMES:
                # A context no hook could be shown: refused, as by the coordinator service.
                self.stats["refused"] += 1
                _failures.warning("refused %s request of tenant %s: %s", head.event, tenant, exc)
                return _json(200, refused_reply(head.id, HookEvent(head.event), exc))
            self.stats["bad_requests"] += 1
            where = exc.field if isinstance(exc, ProtocolError) else ""
            return self.error_reply(400, str(exc), head.id, where)
        request, ctx = found
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
        from workers.integrations.claude_code import (
            event_named,
            fail_closed,
            to_claude_code,
            to_hookbus,
        )
        from workers.services.coordinator_service import decide, qualify

        self.stats["claude_code"] += 1
        if not whole:
            error = LimitError(self.too_large("the hook input"), limit="max_body")
            return await self._unreadable(tenant, body, error, 413)

        def read(data: bytes) -> Any:
            try:
                return to_hookbus(data)
            except InvalidInputError as exc:  # the event it is for, read at once: a walk
                return exc, event_named(data)

        found = await self._walk(tenant, read, body) if _heavy(body) else read(body)
        if isinstance(found, tuple):
            exc, name = found
            return self._refused_input(tenant, name, exc, 400)
        call = found
        if call is None:  # an event HookBus has no counterpart for: no opinion
            self.stats["no_counterpart"] += 1
            return _json(200, {})
        try:
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
        if closed is None and call.event in (
            HookEvent.POST_TOOL_USE,
            HookEvent.POST_TOOL_USE_FAILURE,
        ):
            # The output a redactor never saw is withheld, in the shape Claude Code applies.
            withheld = PostToolUseResult(
                final_content=f"[output withheld by HookBus: {reason}]", warnings=(reason,)
            )
            closed = to_claude_code(call, withheld)
        if closed is not None:
            self.stats["failed_closed"] += 1
            return _json(200, closed)
        return _json(504, {"error": reason})

    def unauthorized_claude_code(self, body: bytes, why: str) -> Answer:
        """A Claude Code hook call whose token the gateway does not accept (revoked, its tenant
        removed, or wrong). Claude Code takes a 401 as a non-blocking error and runs the tool
        unguarded, so the events that gate a tool or carry its output are refused with 200:
        denied, output withheld, naming why. The event is found without a parser (the caller
        is not known: no walk of its body)."""
        from workers.integrations.claude_code import refused
        from workers.integrations.claude_code_bridge import event_name

        name = event_name(body)
        answer = refused(name, f"the gateway does not accept this token ({why})")
        if answer:
            self.stats["unauthorized_refused"] += 1
            _failures.warning("refused %s of a caller whose token is not accepted: %s", name, why)
            return _json(200, answer)
        return _json(401, {"error": why}, **UNAUTHORIZED)

    async def _unreadable(
        self, tenant: str, body: bytes, exc: InvalidInputError, status: int
    ) -> Answer:
        """A Claude Code hook input no hook could be shown: too large, too deep, not JSON, not
        Claude Code's. Claude Code runs the tool on any answer but a 2xx, so the events that
        gate a tool or carry its output get the refusal with 200 (denied, output withheld), as
        every agent does (protocol.md 5.6); any other input gets ``status`` (400, 413)."""
        from workers.integrations.claude_code import event_named

        name = await self._walk(tenant, event_named, body)  # may walk a deep body: off the loop
        return self._refused_input(tenant, name, exc, status)

    def _refused_input(self, tenant: str, name: str, exc: InvalidInputError, status: int) -> Answer:
        """The answer to a hook input of Claude Code event ``name`` that could not be read."""
        from workers.integrations.claude_code import refused

        if answer := refused(name, str(exc)):
            self.stats["refused"] += 1
            _failures.warning("refused %s input of tenant %s: %s", name, tenant, exc)
            return _json(200, answer)
        self.stats["bad_requests"] += 1
        return _json(status, {"error": str(exc), "field": getattr(exc, "field", "")})

    async def cancel(self, tenant: str, session_id: str) -> Answer:
        """``POST /v1/sessions/{id}/cancel``: cancel the tenant's own session ``<tenant>/id``
        (as the coordinator service does a tenant's cancel request): every later PreToolUse of
        it is blocked until the cancellation's TTL ends. Only adds: nothing here lifts one."""
        from redis.exceptions import RedisError

        from bus.transport.redis_io import cancel_session

        if not session_id or len(session_id) > MAX_SESSION_ID:
            self.stats["bad_requests"] += 1
            error = f"a session id is 1-{MAX_SESSION_ID} characters"
            return _json(400, {"error": error, "field": "session_id"})
        session = f"{tenant}/{session_id}"
        by = f"tenant:{tenant}"
        coordinator = self.coordinator
        try:
            await cancel_session(
                coordinator.redis, coordinator.keys, session, coordinator.bus.session_ttl_secs, by
            )
        except (RedisError, OSError) as exc:
            return _json(503, {"error": f"not cancelled: Redis: {exc!r}"})
        self.stats["cancelled"] += 1
        log.info("session %s cancelled by %s", session, by)
        return _json(200, {"cancelled": session})

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

    from opentelemetry import propagate
    from opentelemetry.trace import SpanKind
    from starlette.applications import Starlette
    from starlette.responses import Response
    from starlette.routing import Route

    from bus.telemetry import tracing as telemetry

    def respond(answer: Answer) -> Response:
        return Response(answer.body, answer.status, answer.headers, media_type=JSON)

    @contextlib.contextmanager
    def served(request: Request, route: str) -> Iterator[Any]:
        """The request's span (kind SERVER, as OpenTelemetry's ASGI instrumentation makes),
        in the caller's trace when its W3C ``traceparent`` header names one (read by
        OpenTelemetry's propagators, ``OTEL_PROPAGATORS``); the dispatch's span is its child.
        A ``DecisionRequest``'s own ``traceparent`` field, when set, still comes first."""
        if not telemetry.enabled():
            yield None
            return
        caller = propagate.extract(request.headers) if "traceparent" in request.headers else None
        attributes = {"http.request.method": "POST", "http.route": route}
        with telemetry.span(
            f"POST {route}", attributes, kind=SpanKind.SERVER, context=caller
        ) as span:
            yield span

    def answered(span: Any, answer: Answer) -> Response:
        if span is not None:
            span.set_attribute("http.response.status_code", answer.status)
        return respond(answer)

    async def decisions(request: Request) -> Response:
        tenant, why = gateway.authorize(request.headers.get("authorization"))
        if tenant is None:
            return respond(gateway.error_reply(401, why))
        body, whole = await _read(request, gateway.max_body)
        if not whole:
            return respond(gateway.error_reply(413, gateway.too_large("the request")))
        with served(request, "/v1/decisions") as span:
            return answered(span, await gateway.decisions(tenant, body))

    async def claude_code(request: Request) -> Response:
        tenant, why = gateway.authorize(request.headers.get("authorization"))
        body, whole = await _read(request, gateway.max_body)
        if tenant is None:
            return respond(gateway.unauthorized_claude_code(body, why))
        with served(request, "/claude-code") as span:
            return answered(span, await gateway.claude_code(tenant, body, whole=whole))

    async def cancel(request: Request) -> Response:
        tenant, why = gateway.authorize(request.headers.get("authorization"))
        if tenant is None:
            return respond(_json(401, {"error": why}, **UNAUTHORIZED))
        return respond(await gateway.cancel(tenant, request.path_params["session_id"]))

    async def health(request: Request) -> Response:
        return respond(await gateway.health())

    # The services' probe convention (workers/services/probes.py): /livez asks nothing of Redis (an
    # outage restarts no pod); /readyz as /healthz, and not before the hook directory is read.
    async def livez(request: Request) -> Response:
        return Response(b"ok\n", 200, media_type="text/plain")

    async def readyz(request: Request) -> Response:
        if (why := gateway.coordinator.not_deciding()) is not None:
            return respond(_json(503, {"status": "unavailable", "error": why}))
        return respond(await gateway.health())

    async def prometheus(request: Request) -> Response:  # as the services' (probes.py)
        body, content_type = metrics.exposition(request.headers.get("accept"))
        return Response(body, 200, {"Content-Type": content_type})

    @contextlib.asynccontextmanager
    async def lifespan(_: Starlette) -> Any:
        await gateway.coordinator.start()
        await gateway.read_tenants()
        if unserved := gateway.unserved():
            log.warning(
                "token(s) of %s, not tenants the bus serves: answered 401 until an operator "
                "runs hookbus tenants add NAME", ", ".join(unserved),
            )  # fmt: skip
        follower = asyncio.create_task(gateway.keep_current())
        try:
            yield
        finally:
            follower.cancel()
            await asyncio.gather(follower, return_exceptions=True)
            await gateway.coordinator.close()
            log.info("gateway stopped: %s", gateway.stats)

    return Starlette(
        routes=[
            Route("/v1/decisions", decisions, methods=["POST"]),
            Route("/claude-code", claude_code, methods=["POST"]),
            Route("/v1/sessions/{session_id:path}/cancel", cancel, methods=["POST"]),
            Route("/healthz", health, methods=["GET"]),
            Route("/livez", livez, methods=["GET"]),
            Route("/readyz", readyz, methods=["GET"]),
            Route("/metrics", prometheus, methods=["GET"]),
        ],
        lifespan=lifespan,
    )
