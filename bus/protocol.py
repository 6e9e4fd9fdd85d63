"""The wire protocol: plain JSON messages, produced and checked by msgspec.

Every message is one JSON object. On a Redis stream it is the value of the entry's single field
``data``; on a list (an inbox) it is the element itself. See ``docs/protocol.md`` for the keys,
sequences and examples. Rules: ``v`` is the protocol's major version (a message with another
``v`` is rejected); new fields get defaults and go last; unknown fields are ignored; a field is
never retyped. Every envelope carries an id, a timestamp (epoch milliseconds) and W3C trace
context (``traceparent``, ``tracestate``; empty when the sender does not trace).
"""

from __future__ import annotations

import os
import re
import time
from typing import Annotated, Any, Literal, TypeVar, Union

import msgspec

from bus import limits
from bus.actions import HookAction
from bus.breakglass import BreakGlass as BreakGlass  # the value of {p}:breakglass
from bus.errors import ProtocolError
from bus.events import CONTEXT_TYPES, HookContext, HookEvent
from bus.hooks import EnforcementMode, FailurePolicy, HookSpec
from bus.limits import MAX_CONTEXT_BYTES, MAX_CONTEXT_DEPTH
from bus.limits import MAX_MESSAGE_BYTES as MAX_MESSAGE_BYTES  # largest message accepted
from bus.limits import encode_context as encode_context
from bus.matcher import ToolMatchFilter

PROTOCOL_VERSION = 3
#: The stream entry field that holds the JSON message.
DATA_FIELD = "data"
#: The bounds of ``DecisionRequest.timeout_ms`` (docs/protocol.md 3.5): a request outside them
#: is answered with an error reply naming ``$.timeout_ms``. Under 1 ms it would expire before
#: any hook ran (it used to be dropped without a word); past an hour it is a unit mistake (µs, or
#: seconds × 10⁶), and an unanswered request would be taken over and answered long after its
#: agent gave up.
MIN_TIMEOUT_MS = 1
MAX_TIMEOUT_MS = 3_600_000
TimeoutMs = Annotated[int, msgspec.Meta(ge=MIN_TIMEOUT_MS, le=MAX_TIMEOUT_MS)]
#: A session id an agent cancels: never empty (it would name no session, or for a tenant the
#: bare ``TENANT/``).
CancelledSession = Annotated[str, msgspec.Meta(min_length=1)]

T = TypeVar("T")


class _Envelope(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=False):
    v: int = PROTOCOL_VERSION
    id: str
    ts: int
    traceparent: str = ""
    tracestate: str = ""


class EventMessage(_Envelope, frozen=True, kw_only=True):
    """One lifecycle event, as published to ``{p}:events``."""

    event: HookEvent
    session_id: str
    context: msgspec.Raw
    source: str = ""


class HookRequest(_Envelope, frozen=True, kw_only=True):
    """A coordinator asks one sync hook for its answer (``{p}:hook:{name}:requests``)."""

    hook: str
    event: HookEvent
    session_id: str
    context: msgspec.Raw
    deadline: int  # epoch ms; a worker drops the request once it has passed
    reply_to: str  # the list key to push the HookReply to
    event_id: str = ""
    # The largest HookReply (bytes of JSON) the coordinator reads for this request; 0: not
    # stated (a coordinator before it). A larger reply is dropped unread: the worker sends an
    # error reply instead (docs/protocol.md 3.2).
    reply_max: int = 0


class HookReply(_Envelope, frozen=True, kw_only=True):
    """A hook's answer, pushed to the requester's inbox."""

    request_id: str
    hook: str
    replica: str = ""
    status: Literal["ok", "error"] = "ok"
    action: HookAction | None = None
    error: str = ""
    elapsed_ms: float = 0.0


class HookManifest(msgspec.Struct, frozen=True, kw_only=True):
    """What a hook service declares about itself (``{p}:hooks``)."""

    name: str
    kind: Literal["sync", "async"] = "sync"
    events: list[HookEvent] = msgspec.field(default_factory=list)  # empty = every event
    tool_names: list[str] = msgspec.field(default_factory=list)  # ToolNamePattern strings
    tool_content: list[str] = msgspec.field(default_factory=list)  # content patterns
    timeout: float | None = None
    failure_policy: FailurePolicy = "ignore"
    priority: int = 0
    protocol_version: int = PROTOCOL_VERSION
    registered_at: int = 0  # epoch ms of first registration: the tie-break of hook order
    # "session": called only for sessions that attach it by name, never globally.
    scope: Literal["global", "session"] = "global"
    # enforce | warn | dryrun; an operator's `hookbus hooks mode` ({p}:modes) overrides it.
    mode: EnforcementMode = "enforce"
    # How many request streams the hook reads ({p}:hook:{NAME}:requests, {p}:hook:{NAME#k.j}:…):
    # a hot hook's requests spread over the cluster, a session's in order in one.
    shards: int = 1

    def spec(self) -> HookSpec:
        """The dispatcher's view of this hook (raises PatternError on bad patterns)."""
        return HookSpec(
            name=self.name,
            events=frozenset(self.events),
            timeout=self.timeout,
            match_filter=ToolMatchFilter.parse(self.tool_names, self.tool_content),
            priority=self.priority,
            failure_policy=self.failure_policy,
            mode=self.mode,
        )

    @classmethod
    def of(
        cls,
        spec: HookSpec,
        kind: Literal["sync", "async"],
        registered_at: int,
        scope: Literal["global", "session"] = "global",
    ) -> HookManifest:
        names, content = spec.match_filter.to_strings()
        return cls(
            name=spec.name,
            kind=kind,
            events=sorted(spec.events),
            tool_names=names,
            tool_content=content,
            timeout=spec.timeout,
            failure_policy=spec.failure_policy,
            priority=spec.priority,
            registered_at=registered_at,
            scope=scope,
            mode=spec.mode,
        )


class RetiredHook(msgspec.Struct, frozen=True, kw_only=True):
    """What ``hookbus hooks remove`` leaves in ``{p}:hooks`` in place of a hook's manifest.

    Deliberately not a ``HookManifest`` (it has no ``name``): every coordinator ignores it like
    any malformed manifest, so the hook is no longer selected; and since the field stays
    present, a running replica's heartbeat (``HSETNX``) cannot write the manifest back.
    Replicas that see it stop; a replica that starts refuses to serve the hook until an
    operator runs ``hookbus hooks restore``.
    """

    retired: str  # the hook's name
    at: int  # epoch ms
    by: str = ""


def retired_hook(data: bytes | str | None) -> RetiredHook | None:
    """The tombstone in ``data`` (a value of ``{p}:hooks``), or None if it is anything else."""
    if not data:
        return None
    try:
        return msgspec.json.decode(data, type=RetiredHook)
    except msgspec.DecodeError:
        return None


class DecisionRequest(_Envelope, frozen=True, kw_only=True):
    """An agent (any language) asks the coordinator service to dispatch one event."""

    event: HookEvent
    context: msgspec.Raw
    reply_to: str  # list key for the DecisionReply
    timeout_ms: TimeoutMs = 30_000  # how long the agent will wait; the dispatch stays within it


class CancelRequest(_Envelope, frozen=True, kw_only=True):
    """An agent cancels one of its own sessions through the coordinator service (``"op":
    "cancel"`` on its decision stream): every later PreToolUse of the session is blocked until
    the cancellation's TTL ends. Nothing lifts it early but an operator."""

    op: Literal["cancel"]
    session_id: CancelledSession
    reply_to: str


class DecisionReply(_Envelope, frozen=True, kw_only=True):
    """The coordinator service's answer: the aggregated result, or an error naming the field."""

    request_id: str
    event: HookEvent | None = None
    status: Literal["ok", "error"] = "ok"
    result: Any = None  # PreToolUseResult | PostToolUseResult | PermissionRequestResult | …
    error: str = ""
    field: str = ""


class AuditRecord(_Envelope, frozen=True, kw_only=True):
    """One entry of the audit trail ``{p}:audit`` (the audit log hook stores each once).

    ``kind`` "shadowed": a hook's answer a coordinator did not apply as given, because the hook
    is in ``warn`` or ``dryrun`` mode or a break-glass bypass is on (``mode``, ``action``: the
    answer's tag, ``detail``: "would have blocked: …", ``breakglass``: the bypass's reason).
    ``kind`` "breakglass": an operator switched the bypass on or off (``mode`` "on" / "off",
    ``detail``: the reason, ``by``: who, ``until_ms``: when it ends by itself).
    ``kind`` "tenant": an operator added or removed a tenant (``mode`` "add" / "remove",
    ``detail``: the tenant, ``by``: who). ``kind`` "repair": an operator repaired a stream
    poisoned with ids beyond Redis's clock (``detail``: the stream and what was done).
    """

    kind: Literal["shadowed", "breakglass", "tenant", "repair"]
    event: HookEvent | None = None
    session_id: str = ""
    tool_name: str = ""
    hook: str = ""
    mode: str = ""
    action: str = ""
    detail: str = ""
    by: str = ""
    until_ms: int = 0
    breakglass: str = ""


class ControlMessage(msgspec.Struct, frozen=True, kw_only=True):
    """Announcements on ``{p}:control`` that make coordinators refresh at once."""

    type: Literal["manifest", "deregister", "session", "breakglass"]
    name: str = ""
    replica: str = ""
    session_id: str = ""


_decoders: dict[type, msgspec.json.Decoder[Any]] = {}


def _decoder(kind: type) -> msgspec.json.Decoder[Any]:
    """One Decoder per type: msgspec.json.decode(type=) looks the type up at every call."""
    decoder = _decoders.get(kind)
    if decoder is None:
        decoder = _decoders[kind] = msgspec.json.Decoder(kind)
    return decoder


_PATH = re.compile(r" - at `([^`]*)`$")


def encode(message: Any) -> bytes:
    """One message as JSON bytes; LimitError (a ProtocolError) if it is over a bound of
    ``bus/limits.py`` or cannot be encoded."""
    return limits.encode(message, type(message).__name__)


def decode(data: bytes | str, kind: type[T]) -> T:
    """Parse and check one message; raise ProtocolError naming the field on any problem.

    The size, nesting depth and number of containers are checked before msgspec parses it
    (LimitError); whatever else the parser raises becomes a ProtocolError too."""
    if isinstance(data, str):
        data = data.encode("utf-8", "surrogatepass")
    if len(data) > MAX_MESSAGE_BYTES or limits.openers(data) > limits.MAX_DEPTH:
        limits.check(data, kind.__name__)  # (its fast path inlined above: the usual case)
    try:
        message: T = _decoder(kind).decode(data)
    except msgspec.DecodeError as exc:
        limits.check_text(data, kind.__name__)
        raise _protocol_error(kind.__name__, exc) from exc
    except Exception as exc:  # RecursionError, MemoryError, …: still the protocol's error
        raise ProtocolError(f"malformed {kind.__name__}: {type(exc).__name__}: {exc}") from exc
    version = getattr(message, "v", PROTOCOL_VERSION)
    if version != PROTOCOL_VERSION:
        raise ProtocolError(
            f"{kind.__name__} has protocol version {version}; this side speaks {PROTOCOL_VERSION}",
            "$.v",
        )
    return message


def _protocol_error(what: str, exc: msgspec.DecodeError) -> ProtocolError:
    text = str(exc)
    match = _PATH.search(text)
    return ProtocolError(f"malformed {what}: {text}", match.group(1) if match else "")


def decode_context(event: HookEvent, raw: msgspec.Raw | bytes) -> HookContext:
    """The context of ``event`` from its raw JSON; errors name ``$.context.<field>``.

    A context over ``MAX_CONTEXT_BYTES`` or ``MAX_CONTEXT_DEPTH`` raises LimitError."""
    kind = CONTEXT_TYPES[event]
    data = bytes(raw)
    limits.check_context(data, f"{event.value} context")
    try:
        ctx: HookContext = _decoder(kind).decode(data)
    except msgspec.DecodeError as exc:
        limits.check_text(data, f"{event.value} context", "$.context")
        text = str(exc).replace("`$", "`$.context", 1)
        match = _PATH.search(text)
        raise ProtocolError(
            f"malformed {event.value} context: {text}", match.group(1) if match else "$.context"
        ) from exc
    except Exception as exc:  # whatever the parser raises: the protocol's error
        raise ProtocolError(
            f"malformed {event.value} context: {type(exc).__name__}: {exc}", "$.context"
        ) from exc
    return ctx


def _union(types: Any) -> Any:
    return Union[tuple(types)]  # noqa: UP007  (a run-time union of classes made at run time)


class _TypedEvent(_Envelope, frozen=True, kw_only=True, tag_field="event"):
    """An EventMessage whose ``event`` picks its context's type: one class per event."""

    session_id: str
    source: str = ""


# One tagged union of the 12 kinds of event: a message and its context in one parse.
_TYPED_EVENTS = {
    msgspec.defstruct(
        f"_{event.value}Message", [("context", kind)], bases=(_TypedEvent,), tag=event.value,
        frozen=True, kw_only=True,
    ): event
    for event, kind in CONTEXT_TYPES.items()
}  # fmt: skip
_typed_event = msgspec.json.Decoder(_union(_TYPED_EVENTS)).decode


def decode_event(data: bytes) -> tuple[EventMessage | _TypedEvent, HookEvent, HookContext]:
    """A published event, its kind and its context (what an async hook reads), in one parse
    when the message is well within every bound; anything else (a message near a bound, one
    that does not parse) goes through :func:`decode` and :func:`decode_context`, which say
    what is wrong. Read the context from the third item: the message's own ``context`` is the
    parsed one on the fast path and the raw JSON on the slow one."""
    # limits.openers(data) inlined: this runs for every event every async hook reads.
    n = len(data)
    if n <= MAX_CONTEXT_BYTES and n - len(data.translate(None, b"[{")) <= MAX_CONTEXT_DEPTH:
        try:
            message = _typed_event(data)
        except Exception:  # the slow path below names the problem
            pass
        else:
            if message.v == PROTOCOL_VERSION:
                return message, _TYPED_EVENTS[type(message)], message.context
    plain = decode(data, EventMessage)
    return plain, plain.event, decode_context(plain.event, plain.context)


def decode_head(data: bytes, kind: type[T]) -> T | None:
    """The top-level scalar fields of a message that may be malformed, too deep or too large
    (``kind`` is a small Struct of them: an ``id`` and a ``reply_to``, say), or None if they
    cannot be read. Never raises, never recurses deeply.

    msgspec reads them first, skipping in C whatever ``kind`` does not name (a few ms for a
    megabyte of a million containers), with surrogate escapes made U+FFFD when it refuses a
    lone one. Only a message nested past what it skips (about 1 000 levels) is walked in Python
    (``limits.top_level``: about 0.3 µs a token, up to 1 s for the worst megabyte): callers on an
    event loop run this in a thread when the message is over a bound."""
    if len(data) > limits.MAX_HEAD_BYTES:
        return None
    decoder = _decoder(kind)
    try:
        head: T = decoder.decode(data)
        return head
    except RecursionError:  # nested past what msgspec skips: walked below
        pass
    except msgspec.ValidationError:  # a field of the wrong type: no head to answer with
        return None
    except msgspec.DecodeError:
        if not limits.lone_surrogate(data):
            return None
        # Once: no surrogate escape is left to refuse.
        return decode_head(limits.without_surrogates(data), kind)
    pruned = limits.top_level(data)
    if pruned is None:
        return None
    try:
        head = decoder.decode(pruned)
    except Exception:  # whatever the parser raises: no head
        return None
    return head


def raw(ctx: HookContext) -> msgspec.Raw:
    """A context ready to embed in an envelope (LimitError if it is over a bound)."""
    return msgspec.Raw(encode_context(ctx))


def new_id() -> str:
    """A random 128-bit id, hex."""
    return os.urandom(16).hex()


def now_ms() -> int:
    return time.time_ns() // 1_000_000
