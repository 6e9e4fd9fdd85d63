"""Span export over OTLP/HTTP on a thread of its own, which holds the GIL as little as it can.

Why not the SDK's ``BatchSpanProcessor`` + ``OTLPSpanExporter``: profiled on the benchmark of
a 1-hook dispatch (docs/performance.md, "Tracing"), that exporter turns each span into protobuf
in Python (~18 µs a span here) and does a whole batch (up to 512 spans, ~10 ms) in one go. Its
thread then holds the GIL until the interpreter takes it away after ``sys.getswitchinterval()``
(5 ms), so the event loop that dispatches waits up to 5 ms: the tail of a traced dispatch.
Here HookBus's own spans are written directly as protobuf (~2 µs a span, see below) when they
end, so the queue holds bytes, and the thread only joins them and posts the batch (with
urllib3, the HTTP library under the SDK exporter's ``requests``: see ``_new_http``).

What goes in: HookBus's own spans (``telemetry.LightSpan``, a tuple's worth of fields, built
on the loop without the SDK's span machinery) and any SDK span of the application (its
``ReadableSpan``, through ``Forward``; encoded on the thread with the SDK's own encoder, a few
at a time between releases of the GIL). The queue is bounded (``OTEL_BSP_MAX_QUEUE_SIZE``): a
span that finds it full is dropped and counted, and so are the spans of a batch the receiver
refused or never answered, and a span that could not be encoded (``stats``).

Configuration: the SDK's variables for the OTLP/HTTP trace exporter (endpoint, headers,
timeout, compression, certificates) and for the batch processor (``OTEL_BSP_*``).
"""

from __future__ import annotations

import collections
import contextlib
import gzip
import logging
import math
import os
import socket
import struct
import threading
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from opentelemetry.context import Context
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, InstrumentationScope, KeyValue
from opentelemetry.proto.resource.v1.resource_pb2 import Resource as PbResource
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor
from opentelemetry.trace import SpanContext, SpanKind, TraceState
from opentelemetry.util.re import parse_env_headers


class LightSpan(Protocol):
    """What :func:`encode_span` reads of one of HookBus's own spans (``tracing.LightSpan``,
    which imports this module: a protocol here keeps the import one way)."""

    name: str
    trace_id: int
    span_id: int
    flags: int
    state: TraceState | None
    parent_id: int
    parent_remote: bool
    kind: SpanKind
    attributes: dict[str, Any]
    links: Sequence[SpanContext]
    start_ns: int
    end_ns: int
    events: list[tuple[str, int, Mapping[str, Any]]] | None
    status_code: int
    status_message: str


log = logging.getLogger("hookbus.telemetry")

#: The application's SDK spans encoded between two releases of the GIL: ~8 µs each here, so
#: the loop's thread waits at most ~0.1-0.3 ms for the GIL when it wants it back.
SLICE = 16
#: Seconds between two log lines about failed exports.
LOG_EVERY_SECS = 10.0


# -- OTLP protobuf, written directly ----------------------------------------------------------
#
# Why not ``opentelemetry-proto``'s message classes for HookBus's spans: building one span of 8
# attributes through them costs ~13 µs here (an object per attribute and per value, copied
# again into each enclosing message); the bytes below cost ~2 µs (fixed-size fields packed at
# once; the attribute pairs and names, which repeat, kept encoded). The format is protobuf's
# (https://protobuf.dev/programming-guides/encoding/) for the messages of
# opentelemetry/proto/trace/v1/trace.proto; tests/test_span_export.py decodes what this writes
# with the protobuf classes, field by field. The application's SDK spans still go through the
# SDK's encoder (``encode_spans``).


def _varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


_SMALL = [_varint(i) for i in range(1 << 14)]
_fixed64 = struct.Struct("<Q").pack
_fixed32 = struct.Struct("<I").pack
_double = struct.Struct("<d").pack


def _field(tag: bytes, payload: bytes) -> bytes:
    """A length-delimited field: its tag, the payload's length, the payload."""
    n = len(payload)
    return tag + (_SMALL[n] if n < 16384 else _varint(n)) + payload


def _value(value: Any) -> bytes:
    """An ``AnyValue``."""
    if isinstance(value, str):
        return _field(b"\x0a", value.encode())
    if isinstance(value, bool):
        return b"\x10\x01" if value else b"\x10\x00"
    if isinstance(value, int):
        return b"\x18" + _varint(value & 0xFFFFFFFFFFFFFFFF)  # int64: two's complement
    if isinstance(value, float):
        return b"\x21" + _double(value)
    if isinstance(value, (list, tuple)):
        return _field(b"\x2a", b"".join(_field(b"\x0a", _value(v)) for v in value))
    return _field(b"\x0a", str(value).encode())


#: Encoded ``KeyValue`` fields by (tag, key, value, type): HookBus's spans repeat the same few
#: pairs (event, tool, hook names) dispatch after dispatch. Bounded: cleared when full, and a
#: long value is never kept.
_PAIRS: dict[tuple[bytes, str, Any, type], bytes] = {}
_PAIRS_MAX = 4096
_PAIR_VALUE_MAX = 256
_CACHED = (str, bool, int)


def _pair(tag: bytes, key: str, value: Any) -> bytes:
    kind = type(value)
    if kind not in _CACHED or (kind is str and len(value) > _PAIR_VALUE_MAX):
        return _field(tag, _field(b"\x0a", key.encode()) + _field(b"\x12", _value(value)))
    cache_key = (tag, key, value, kind)  # the type: True == 1, and both hash alike
    encoded = _PAIRS.get(cache_key)
    if encoded is None:
        encoded = _field(tag, _field(b"\x0a", key.encode()) + _field(b"\x12", _value(value)))
        _keep(_PAIRS, cache_key, encoded)
    return encoded


def _keep(cache: dict[Any, bytes], key: Any, encoded: bytes) -> None:
    """Keep ``encoded`` in ``cache`` (``_PAIRS`` or ``_NAMES``), emptied first when full."""
    if len(cache) >= _PAIRS_MAX:
        cache.clear()
    cache[key] = encoded


def _attributes(tag: bytes, attrs: Mapping[str, Any]) -> list[bytes]:
    """Repeated ``KeyValue`` fields."""
    return [_pair(tag, k, v) for k, v in attrs.items()]


#: The start of a ``Span``: trace id (field 1, 16 bytes) and span id (2, 8), tags and lengths
#: included, packed at once. (Protobuf reads fields in any order.)
_IDS = struct.Struct(">2s16s2s8s").pack
#: Kind (field 6: OTLP's SpanKind, the API's + 1, one byte) and the two times (7 and 8, fixed64).
_KIND_TIMES = struct.Struct("<cBcQcQ").pack


def encode_span(span: LightSpan) -> bytes:
    """The ``Span`` message of one of HookBus's spans."""
    parts = [
        _IDS(b"\x0a\x10", span.trace_id.to_bytes(16, "big"), b"\x12\x08",
             span.span_id.to_bytes(8, "big")),
        _name(span.name),
        _KIND_TIMES(b"\x30", span.kind._value_ + 1, b"\x39", span.start_ns, b"\x41", span.end_ns),
    ]  # fmt: skip
    if span.state:
        parts.append(_field(b"\x1a", span.state.to_header().encode()))
    if span.parent_id:
        parts.append(b"\x22\x08" + span.parent_id.to_bytes(8, "big"))
    for k, v in span.attributes.items():
        parts.append(_pair(b"\x4a", k, v))
    for name, ts, attrs in span.events or ():
        event = [b"\x09" + _fixed64(ts), _field(b"\x12", name.encode())]
        parts.append(_field(b"\x5a", b"".join(event + _attributes(b"\x1a", attrs))))
    for link in span.links:
        parts.append(
            b"\x6a\x1c"
            + _IDS(b"\x0a\x10", link.trace_id.to_bytes(16, "big"), b"\x12\x08",
                   link.span_id.to_bytes(8, "big"))
        )  # fmt: skip
    if span.status_code:
        status = _field(b"\x12", span.status_message.encode()) if span.status_message else b""
        parts.append(_field(b"\x7a", status + b"\x18" + _SMALL[span.status_code]))
    # flags: the trace flags, and "whether the parent is remote is known" (0x100) + remote (0x200)
    flags = span.flags | 0x100 | (0x200 if span.parent_remote else 0)
    parts.append(b"\x85\x01" + _fixed32(flags))
    return b"".join(parts)


#: Encoded name fields (field 5), kept as ``_PAIRS`` are: span names repeat.
_NAMES: dict[str, bytes] = {}


def _name(name: str) -> bytes:
    encoded = _NAMES.get(name)
    if encoded is None:
        encoded = _field(b"\x2a", name.encode())
        if len(name) <= _PAIR_VALUE_MAX:
            _keep(_NAMES, name, encoded)
    return encoded


def _pb_value(value: Any) -> AnyValue:
    """The resource's attribute values (once per process: the protobuf classes)."""
    out = AnyValue()
    out.ParseFromString(_value(value))
    return out


def _otlp(env: Mapping[str, str], name: str, default: str = "") -> str:
    """``OTEL_EXPORTER_OTLP_TRACES_<name>``, else ``OTEL_EXPORTER_OTLP_<name>``."""
    return (
        env.get(f"OTEL_EXPORTER_OTLP_TRACES_{name}")
        or env.get(f"OTEL_EXPORTER_OTLP_{name}")
        or default
    )


def _int_env(env: Mapping[str, str], name: str, default: int) -> int:
    raw = env.get(name, "")
    try:
        return int(raw) if raw.strip() else default
    except ValueError:
        log.warning("%s=%r is not a whole number; using %d", name, raw, default)
        return default


class SpanExport:
    """A bounded queue of finished spans and the thread that sends them."""

    def __init__(self, resource: Resource, env: Mapping[str, str] | None = None) -> None:
        env = os.environ if env is None else env
        self.max_queue = max(1, _int_env(env, "OTEL_BSP_MAX_QUEUE_SIZE", 2048))
        batch = _int_env(env, "OTEL_BSP_MAX_EXPORT_BATCH_SIZE", 512)
        self.batch = max(1, min(self.max_queue, batch))
        self.delay = _int_env(env, "OTEL_BSP_SCHEDULE_DELAY", 5000) / 1000
        traces = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        base = env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or "http://localhost:4318"
        self.endpoint = traces or f"{base.removesuffix('/')}/v1/traces"
        self.headers = {
            "Content-Type": "application/x-protobuf",
            **parse_env_headers(_otlp(env, "HEADERS"), liberal=True),
        }
        self.gzip = _otlp(env, "COMPRESSION", "none").strip().lower() == "gzip"
        if self.gzip:
            self.headers["Content-Encoding"] = "gzip"
        try:
            self.timeout = float(_otlp(env, "TIMEOUT", "10"))
        except ValueError:
            log.warning("OTLP timeout %r is not a number; using 10 s", _otlp(env, "TIMEOUT"))
            self.timeout = 10.0
        self.verify: str | bool = _otlp(env, "CERTIFICATE") or True
        cert, key = _otlp(env, "CLIENT_CERTIFICATE"), _otlp(env, "CLIENT_KEY")
        self.cert = (cert, key) if cert and key else (cert or None)
        # ResourceSpans.resource and ScopeSpans.scope, serialized once
        pb_resource = PbResource(
            attributes=[KeyValue(key=k, value=_pb_value(v)) for k, v in resource.attributes.items()]
        )
        self.resource = _field(b"\x0a", pb_resource.SerializeToString())
        scope = InstrumentationScope(name="hookbus")
        self.scope = _field(b"\x0a", scope.SerializeToString())
        #: spans queued, exported (the receiver said 2xx), dropped (queue full), failed (the
        #: receiver refused their batch or did not answer in time)
        self.stats = collections.Counter[str]()
        self._queue: collections.deque[bytes | ReadableSpan] = collections.deque()
        self._wake = threading.Event()
        self._idle = threading.Event()
        self._idle.set()
        self._stopping = False
        self._flushing = False
        self._logged = 0.0
        self._http: Any = None
        #: the connections the session opened, so that shutdown can cut one a request holds
        self._connections: weakref.WeakSet[Any] = weakref.WeakSet()
        #: past it (set by ``shutdown``) nothing more is sent; the spans not sent are counted
        #: failed once, by this thread or by ``shutdown`` if this thread is still in a request
        self._deadline = math.inf
        self._abandoned = False
        self._in_flight = 0
        self._lock = threading.Lock()
        #: work for this thread at each wake, before the spans (telemetry's deferred records)
        self.chores: list[Callable[[], None]] = []
        self._thread = threading.Thread(target=self._run, name="hookbus-span-export", daemon=True)
        self._thread.start()

    # -- on the application's threads: O(1), no I/O --------------------------------------------

    def add(self, span: LightSpan | ReadableSpan) -> None:
        """Queue a finished span. HookBus's own are encoded here, on the caller's thread
        (~2 µs): the queue then holds bytes, which the garbage collector does not track.
        Why: queued spans are objects that live until the next export, and thousands of
        them made the collector run every few dozen dispatches on the loop (profiled:
        docs/performance.md, "Tracing")."""
        queue = self._queue
        if len(queue) >= self.max_queue or self._stopping:
            self.stats["dropped"] += 1
            return
        if isinstance(span, ReadableSpan):
            queue.append(span)
        else:
            try:
                queue.append(_field(b"\x12", encode_span(span)))
            except Exception as exc:  # a value protobuf cannot carry: count it, go on
                self._failed(1, f"could not encode span {span.name!r}: {exc!r}")
                return
        if len(queue) >= self.batch and not self._wake.is_set():
            self._wake.set()

    # -- the export thread --------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stopping:
            woken = self._wake.wait(self.delay)
            self._wake.clear()
            self._chores()
            # Woken because a batch is full: send full batches only (a request costs the
            # receiver and this process more than its spans do); the timer sends the rest.
            self._drain(full_only=woken and not self._flushing)
        self._chores()
        self._drain()

    def _chores(self) -> None:
        for chore in self.chores:
            try:
                chore()
            except Exception:
                log.exception("telemetry chore %r failed", chore)

    def _drain(self, full_only: bool = False) -> None:
        self._idle.clear()
        try:
            while self._queue and (len(self._queue) >= self.batch or not full_only):
                with self._lock:
                    if self._abandoned:
                        return
                    if time.monotonic() >= self._deadline:  # shutting down, out of time
                        self._lose_queued()
                        return
                    count = min(self.batch, len(self._queue))
                    batch = [self._queue.popleft() for _ in range(count)]
                    self._in_flight = count
                self._send(batch)
        finally:
            self._idle.set()

    def _encode(self, batch: Sequence[bytes | ReadableSpan]) -> bytes:
        """One ``ExportTraceServiceRequest``: HookBus's spans (encoded when queued) in one
        ``ResourceSpans``, the application's as the SDK encodes them (serialized messages
        concatenate into one)."""
        ours: list[bytes] = []
        theirs: list[ReadableSpan] = []
        sdk: list[bytes] = []
        for span in batch:
            if isinstance(span, bytes):
                ours.append(span)
                continue
            theirs.append(span)
            if len(theirs) >= SLICE:
                sdk.append(encode_spans(theirs).SerializeToString())
                theirs = []
                time.sleep(0)  # gives the GIL back: the event loop's thread takes it if it waits
        if theirs:
            sdk.append(encode_spans(theirs).SerializeToString())
        body = b"".join(sdk)
        if ours:
            scope_spans = _field(b"\x12", self.scope + b"".join(ours))
            body = _field(b"\x0a", self.resource + scope_spans) + body
        return gzip.compress(body) if self.gzip else body

    def _send(self, batch: Sequence[bytes | ReadableSpan]) -> None:
        import urllib3

        try:
            body = self._encode(batch)
        except Exception as exc:  # a span attribute protobuf cannot carry: count it, go on
            self._failed(len(batch), f"could not encode {len(batch)} spans: {exc!r}")
            return
        if self._http is None:
            self._http = self._new_http()
        # at shutdown, a request ends by the deadline (this bounds the connection and each
        # read, which is what a silent receiver holds)
        timeout = min(self.timeout, max(0.05, self._deadline - time.monotonic()))
        try:
            response = self._http.urlopen(
                "POST", self.endpoint, body=body, headers=self.headers,
                timeout=urllib3.Timeout(connect=timeout, read=timeout), retries=False,
                redirect=False,
            )  # fmt: skip
        except Exception as exc:  # whatever the client raises: the batch is lost and counted,
            # and this thread, which every later span needs, goes on
            self._failed(len(batch), f"{len(batch)} spans not exported to {self.endpoint}: {exc}")
            return
        if 200 <= response.status < 300:
            self._tally("exported", len(batch))
        else:
            why = f"HTTP {response.status} {response.data[:200]!r}"
            self._failed(len(batch), f"{len(batch)} spans refused by {self.endpoint}: {why}")

    def _new_http(self) -> Any:
        """The HTTP client: urllib3, the library under ``requests`` (which the SDK's exporter
        uses), called directly. Why: a request through ``requests`` costs ~1.1 ms of Python
        here, through urllib3 ~0.45 ms, and this thread holds the GIL for most of it while the
        event loop may be waiting for it. What ``requests`` added is kept: the proxy the
        environment names (``HTTPS_PROXY``, ``HTTP_PROXY``, ``NO_PROXY``), certifi's CA bundle
        unless ``OTEL_EXPORTER_OTLP_CERTIFICATE`` names one, the client certificate.

        Its connections are remembered: a receiver that says nothing would keep this thread
        for the whole OTLP timeout after ``shutdown``; closing the request's socket ends it at
        once."""
        import urllib.parse
        import urllib.request

        import certifi
        import urllib3

        connections = self._connections

        class Http(urllib3.HTTPConnectionPool):
            def _new_conn(self) -> Any:
                conn = super()._new_conn()
                connections.add(conn)
                return conn

        class Https(urllib3.HTTPSConnectionPool):
            def _new_conn(self) -> Any:
                conn = super()._new_conn()
                connections.add(conn)
                return conn

        cert, key = self.cert if isinstance(self.cert, tuple) else (self.cert, None)
        tls: dict[str, Any] = {
            "cert_reqs": "CERT_REQUIRED",
            "ca_certs": self.verify if isinstance(self.verify, str) else certifi.where(),
            "cert_file": cert,
            "key_file": key,
        }
        url = urllib.parse.urlsplit(self.endpoint)
        proxy = urllib.request.getproxies().get(url.scheme)
        manager: Any
        if proxy and not urllib.request.proxy_bypass(url.hostname or ""):
            manager = urllib3.ProxyManager(proxy, **tls)
        else:
            manager = urllib3.PoolManager(**tls)
        manager.pool_classes_by_scheme = {"http": Http, "https": Https}
        return manager

    def _cut_connections(self) -> None:
        for conn in list(self._connections):
            sock = getattr(conn, "sock", None)
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

    def _tally(self, key: str, count: int) -> None:
        with self._lock:
            self._in_flight = 0
            if not self._abandoned:  # else shutdown has counted them
                self.stats[key] += count

    def _lose_queued(self) -> None:
        """Count what is queued or in flight as failed and send no more (lock held)."""
        lost = len(self._queue) + self._in_flight
        self._queue.clear()
        self._in_flight = 0
        if lost:
            self.stats["failed"] += lost
            log.warning("%d spans not exported before shutdown", lost)

    def _failed(self, count: int, why: str) -> None:
        self._tally("failed", count)
        if self._abandoned:  # shutdown has counted and logged them
            return
        now = time.monotonic()
        if now - self._logged >= LOG_EVERY_SECS:
            self._logged = now
            log.warning("%s (%d spans lost so far)", why, self.stats["failed"])

    def flush(self, timeout: float = 30.0) -> bool:
        """Send what is queued now; True if the queue emptied within ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        self._flushing = True
        try:
            while self._queue or not self._idle.is_set():
                if time.monotonic() > deadline:
                    return False
                self._wake.set()
                time.sleep(0.005)
            return True
        finally:
            self._flushing = False

    def shutdown(self, timeout: float = 30.0) -> None:
        """Send what is queued within ``timeout`` seconds, then stop the thread. What is not
        sent by then is counted failed and never sent; a later call only shortens the time.
        The thread is a daemon: a request still running when this returns does not hold up
        the exit, and its spans are already counted."""
        with self._lock:
            self._deadline = min(self._deadline, time.monotonic() + timeout)
            self._stopping = True
        self._wake.set()
        self._thread.join(max(0.0, self._deadline - time.monotonic()))
        if self._thread.is_alive():
            with self._lock:
                if not self._abandoned:
                    self._abandoned = True
                    self._lose_queued()
            self._cut_connections()  # ends the request it waits on: then it stops
            self._thread.join(0.5)
        elif self._http is not None:
            self._http.clear()


class Forward(SpanProcessor):
    """The application's own SDK spans go out through the same queue and thread."""

    def __init__(self, export: SpanExport) -> None:
        self.export = export

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        pass

    def on_end(self, span: ReadableSpan) -> None:
        if span.context is not None and span.context.trace_flags.sampled:
            self.export.add(span)

    def shutdown(self) -> None:
        self.export.shutdown()  # telemetry.shutdown has given it its deadline already

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.export.flush(timeout_millis / 1000)
