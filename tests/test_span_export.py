"""HookBus's span export (bus/telemetry/export.py): what it writes decodes as OTLP, the sampler
decides, the queue is bounded, every span lost is counted, and the event loop never waits
on the receiver."""

from __future__ import annotations

import gc
import json
import os
import ssl
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import Span as PbSpan
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.trace import SpanContext, SpanKind, StatusCode, TraceFlags, TraceState

from bus.telemetry import export as span_export
from bus.telemetry.export import SpanExport, encode_span
from bus.telemetry.tracing import LightSpan, _Deferred, context_from
from tests.harness import ROOT, until
from tests.otlp_receiver import OTLPReceiver


def scenario(name: str, n: int, **env: str) -> list[dict[str, Any]]:
    """Run tests/span_scenario.py NAME N with ``env``; its JSON lines."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    done = subprocess.run(
        [sys.executable, "-m", "tests.span_scenario", name, str(n)],
        cwd=ROOT, env={**base, "OTEL_SERVICE_NAME": "scenario", **env},
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def test_a_span_decodes_field_by_field_with_the_protobuf_classes() -> None:
    trace_id, span_id, parent_id = 0x0123456789ABCDEF0123456789ABCDEF, 0x1122334455667788, 0x99
    state = TraceState([("vendor", "value")])
    context = SpanContext(trace_id, span_id, False, TraceFlags(TraceFlags.SAMPLED), state)
    linked = SpanContext(0xABC, 0xDEF, True)
    attrs = {"s": "é text", "t": True, "f": False, "i": -5, "big": 2**40, "x": 0.25,
             "list": ["a", "b"], "other": object.__name__}  # fmt: skip
    span = LightSpan("dispatch PreToolUse", trace_id, span_id, 1, state, parent_id, True,
                     SpanKind.CLIENT, dict(attrs), [linked], 1_000, True, None)  # fmt: skip
    assert span.get_span_context() == context
    span.add_event("Block", {"reason": "no"})
    span.set_status(StatusCode.ERROR, "it failed")
    span.end(2_000)

    decoded = PbSpan.FromString(encode_span(span))

    assert decoded.trace_id == trace_id.to_bytes(16, "big")
    assert decoded.span_id == span_id.to_bytes(8, "big")
    assert decoded.parent_span_id == parent_id.to_bytes(8, "big")
    assert decoded.trace_state == "vendor=value"
    assert decoded.name == "dispatch PreToolUse" and decoded.kind == PbSpan.SPAN_KIND_CLIENT
    assert (decoded.start_time_unix_nano, decoded.end_time_unix_nano) == (1_000, 2_000)
    values = {a.key: getattr(a.value, a.value.WhichOneof("value")) for a in decoded.attributes}
    assert values["s"] == "é text" and values["t"] is True and values["f"] is False
    assert values["i"] == -5 and values["big"] == 2**40 and values["x"] == 0.25
    assert [v.string_value for v in values["list"].values] == ["a", "b"]
    assert values["other"] == "object"
    [event] = decoded.events
    assert event.name == "Block" and event.attributes[0].value.string_value == "no"
    [link] = decoded.links
    assert link.trace_id == (0xABC).to_bytes(16, "big") and link.span_id == (0xDEF).to_bytes(
        8, "big"
    )
    assert decoded.status.code == 2 and decoded.status.message == "it failed"
    assert decoded.flags == 0x301  # sampled, parent's remoteness known, parent remote


TRACE, SPAN = "1" * 32, "1" * 16


@pytest.mark.parametrize(
    "traceparent",
    ["", "garbage", f"00-{'0' * 32}-{SPAN}-01", f"ff-{TRACE}-{SPAN}-01",
     f"00-{'g' * 32}-{SPAN}-01", f"00-{TRACE}-{SPAN}-01-x", f"00-{TRACE}-{'0' * 16}-01",
     f"00-{'A' * 32}-{SPAN}-01", f"00-{'1_' * 16}-{SPAN}-01", f"00-{' 1' * 16}-{SPAN}-01",
     f"00-{'٣' * 32}-{SPAN}-01", f"0-{TRACE}-{SPAN}-01", f"00-{TRACE}-{SPAN}-1"],
)  # fmt: skip
def test_a_traceparent_that_is_not_valid_starts_no_trace(traceparent: str) -> None:
    from opentelemetry import trace

    assert not trace.get_current_span(context_from(traceparent)).get_span_context().is_valid


def test_a_valid_traceparent_is_read_whole() -> None:
    from opentelemetry import trace

    context = context_from(f"00-{'ab' * 16}-{'cd' * 8}-01", "k=v")
    sc = trace.get_current_span(context).get_span_context()
    assert (sc.trace_id, sc.span_id) == (int("ab" * 16, 16), int("cd" * 8, 16))
    assert sc.is_remote and sc.trace_flags.sampled and sc.trace_state.get("k") == "v"
    future = context_from(f"01-{'ab' * 16}-{'cd' * 8}-00-more")  # a later version may add fields
    assert trace.get_current_span(future).get_span_context().span_id == int("cd" * 8, 16)


def test_a_sender_s_long_tracestate_is_dropped_not_carried_into_every_message() -> None:
    """A tenant's tracestate of 32 entries of 256 quotes (16 kB, 24 kB as JSON) was carried into
    every hook's request, which then went over MAX_MESSAGE_BYTES with a context near its bound:
    every hook failed under its own policy. Past 512 characters it is dropped (W3C allows it);
    the trace itself continues."""
    from opentelemetry import trace

    from bus.telemetry.tracing import MAX_TRACESTATE

    parent = f"00-{'ab' * 16}-{'cd' * 8}-01"
    long = ",".join(f"k{i}=" + '"' * 256 for i in range(32))
    sc = trace.get_current_span(context_from(parent, long)).get_span_context()
    assert sc.is_valid and sc.trace_id == int("ab" * 16, 16)
    assert not sc.trace_state
    fits = f"a={'v' * 250},b={'w' * 250}"  # 505 characters; a value has at most 256
    assert len(fits) <= MAX_TRACESTATE
    sc = trace.get_current_span(context_from(parent, fits)).get_span_context()
    assert (sc.trace_state.get("a"), sc.trace_state.get("b")) == ("v" * 250, "w" * 250)
    sc = trace.get_current_span(context_from(parent, fits + ",c=x" * 3)).get_span_context()
    assert not sc.trace_state


def test_spans_reach_a_receiver_with_their_parents_from_one_process_to_the_next() -> None:
    with OTLPReceiver() as receiver:
        [made, final] = scenario("traces", 20, OTEL_EXPORTER_OTLP_ENDPOINT=receiver.endpoint,
                                 OTEL_METRICS_EXPORTER="none")  # fmt: skip
        spans = list(receiver.spans)
    assert final["stats"] == {"exported": 60}
    by_id = {s["span_id"]: s for s in spans}
    for t in made["traces"]:
        mine = [s for s in spans if s["trace_id"] == t["trace_id"]]
        assert sorted(s["name"] for s in mine) == ["child", "hook remote", "root"]
        hook = next(s for s in mine if s["name"] == "hook remote")
        assert by_id[hook["parent_id"]]["name"] == "child"
        assert by_id[by_id[hook["parent_id"]]["parent_id"]]["name"] == "root"
        assert t["traceparent"].endswith("-01")


def test_the_sampler_decides_and_a_continued_trace_follows_its_parent() -> None:
    with OTLPReceiver() as receiver:
        [made, final] = scenario(
            "traces", 200, OTEL_EXPORTER_OTLP_ENDPOINT=receiver.endpoint,
            OTEL_METRICS_EXPORTER="none", OTEL_TRACES_SAMPLER="parentbased_traceidratio",
            OTEL_TRACES_SAMPLER_ARG="0.5",
        )  # fmt: skip
        spans = list(receiver.spans)
    sampled = {t["trace_id"] for t in made["traces"] if t["traceparent"].endswith("-01")}
    assert 0 < len(sampled) < 200  # the ratio sampler kept some traces, not all
    exported = {s["trace_id"] for s in spans}
    assert exported == sampled  # no span of an unsampled trace, in either "process"
    assert final["stats"] == {"exported": 3 * len(sampled)}
    assert all(sum(s["trace_id"] == t for s in spans) == 3 for t in sampled)


def test_sampling_off_exports_nothing_but_still_propagates() -> None:
    with OTLPReceiver() as receiver:
        [made, final] = scenario(
            "traces", 5, OTEL_EXPORTER_OTLP_ENDPOINT=receiver.endpoint,
            OTEL_METRICS_EXPORTER="none", OTEL_TRACES_SAMPLER="always_off",
        )  # fmt: skip
        assert receiver.spans == []
    assert all(t["traceparent"].endswith("-00") for t in made["traces"])
    assert final["stats"] == {}


class _Receiver:
    """An OTLP endpoint that keeps each request's target (a path, or, when it serves as an HTTP
    proxy, the absolute URL the client asked it for) and answers ``status``; with ``hold``, not
    before it is released (on the way out). ``tls``: an SSL context to serve HTTPS with."""

    def __init__(
        self, tls: ssl.SSLContext | None = None, status: int = 200, hold: bool = False
    ) -> None:
        self.targets: list[str] = []
        self.release = threading.Event()
        targets, release = self.targets, self.release

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                targets.append(self.path)
                if hold:
                    release.wait(60)
                self.send_response(status)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        if tls is not None:
            self.server.socket = tls.wrap_socket(self.server.socket, server_side=True)
        port = self.server.server_address[1]
        self.endpoint = f"{'https' if tls else 'http'}://127.0.0.1:{port}"

    def __enter__(self) -> _Receiver:
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def stuck() -> Iterator[_Receiver]:
    with _Receiver(hold=True) as endpoint:
        yield endpoint


def test_a_silent_receiver_neither_blocks_the_loop_nor_grows_the_queue(stuck: _Receiver) -> None:
    [made, final] = scenario(
        "stuck", 500, OTEL_EXPORTER_OTLP_ENDPOINT=stuck.endpoint, OTEL_METRICS_EXPORTER="none",
        OTEL_BSP_MAX_QUEUE_SIZE="20", OTEL_BSP_MAX_EXPORT_BATCH_SIZE="10",
        OTEL_EXPORTER_OTLP_TIMEOUT="1",
    )  # fmt: skip
    assert made["made"] == 500  # the loop made every span while the receiver said nothing
    assert stuck.targets
    stats = final["stats"]
    assert stats["dropped"] > 0  # the queue stayed within 20 spans: the rest were dropped
    assert stats.get("exported", 0) == 0
    assert stats["dropped"] + stats["failed"] == 500  # every span accounted for


def test_shutdown_ends_a_request_the_receiver_never_answers(stuck: _Receiver) -> None:
    """With the OTLP timeout at 60 s and a request out to a receiver that says nothing,
    shutdown still stops the export thread (before: it went on waiting for the request's
    timeout after shutdown returned), and the spans it held are counted failed."""
    [made, final] = scenario(
        "in_flight", 12, OTEL_EXPORTER_OTLP_ENDPOINT=stuck.endpoint, OTEL_METRICS_EXPORTER="none",
        OTEL_EXPORTER_OTLP_TIMEOUT="60", OTEL_BSP_SCHEDULE_DELAY="50",
        OTEL_BSP_MAX_EXPORT_BATCH_SIZE="5",
    )  # fmt: skip
    assert made["made"] == 12 and stuck.targets
    assert final["export_alive"] is False
    assert final["stats"] == {"failed": 12}


def test_a_receiver_that_refuses_is_counted_and_the_loss_is_a_metric() -> None:
    with _Receiver(status=503) as refusing, OTLPReceiver() as metrics:
        [_, final] = scenario(
            "traces", 10, OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=f"{refusing.endpoint}/v1/traces",
            OTEL_EXPORTER_OTLP_METRICS_ENDPOINT=f"{metrics.endpoint}/v1/metrics",
        )  # fmt: skip
        lost = [m for m in metrics.metrics if m["name"] == "hookbus.spans.lost"]
    assert final["stats"] == {"failed": 30}
    assert lost and lost[-1]["attributes"] == {"reason": "failed"} and lost[-1]["value"] == 30


def test_exported_request_is_one_otlp_message() -> None:
    """What the receiver decodes is an ExportTraceServiceRequest (the bytes of HookBus's spans
    and of the SDK's encoder concatenate into one)."""
    bodies: list[bytes] = []

    class Keep(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            bodies.append(self.rfile.read(int(self.headers.get("Content-Length", 0))))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Keep)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        scenario("traces", 3, OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{server.server_address[1]}",
                 OTEL_METRICS_EXPORTER="none")  # fmt: skip
    finally:
        server.shutdown()
        server.server_close()
    spans = [s for b in bodies for rs in ExportTraceServiceRequest.FromString(b).resource_spans
             for ss in rs.scope_spans for s in ss.spans]  # fmt: skip
    assert len(spans) == 9


def _ended(i: int, attrs: dict[str, Any]) -> LightSpan:
    span = LightSpan(f"dispatch {i % 3}", i + 1, i + 1, 1, None, i + 1, False, SpanKind.INTERNAL,
                     attrs, (), 1, True, None)  # fmt: skip
    span.end(2)
    return span


def test_a_cached_attribute_keeps_its_type_and_a_long_one_is_whole() -> None:
    """Encoded pairs are kept by key, value and type: ``True == 1``, yet one is a bool and the
    other an int on the wire; a value too long to keep is still written whole."""
    long = "x" * 5000
    attrs = [{"a": True}, {"a": 1}, {"a": True}, {"a": long}]
    decoded = [PbSpan.FromString(encode_span(_ended(i, a))) for i, a in enumerate(attrs)]
    values = [d.attributes[0].value for d in decoded]
    assert [v.WhichOneof("value") for v in values] == [
        "bool_value", "int_value", "bool_value", "string_value"
    ]  # fmt: skip
    assert values[1].int_value == 1 and values[3].string_value == long


def test_spans_and_metric_records_waiting_for_export_hold_nothing_the_collector_tracks() -> None:
    """Between two exports a process queues thousands of spans and histogram records. Kept as
    objects (a span, its attributes and context; a tuple and a dict per record) they made the
    garbage collector run every few dozen dispatches on the event loop (docs/performance.md,
    "Tracing"): now what waits is bytes and floats. gen-0's count is the number of tracked
    objects allocated and still alive since the last collection."""
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9",
           "OTEL_BSP_MAX_QUEUE_SIZE": "4096", "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "4096",
           "OTEL_BSP_SCHEDULE_DELAY": "600000"}  # fmt: skip
    export = SpanExport(Resource.create({}), env)
    histogram = (
        MeterProvider(metric_readers=[InMemoryMetricReader()]).get_meter("t").create_histogram("h")
    )
    deferred = _Deferred()
    try:
        gc.disable()
        gc.collect()
        before = gc.get_count()[0]
        for i in range(1000):
            export.add(_ended(i, {"hook.event": "PreToolUse", "session.id": f"s{i % 7}"}))
            deferred.record(histogram, i / 1000, (("hook.name", f"h{i % 3}"),))
        grown = gc.get_count()[0] - before
        assert len(export._queue) == 1000 and deferred.count == 1000
        assert grown < 50, f"{grown} tracked objects kept for 1,000 spans and records"
    finally:
        gc.enable()
        export.shutdown(0)


def test_deferred_records_reach_their_histograms_whole_when_two_threads_drain() -> None:
    """Records taken on the loop reach the SDK once each, per series, whichever of the two
    draining threads (span export, metric reader) takes them; past the limit a record is made
    at once."""
    reader = InMemoryMetricReader()
    histogram = MeterProvider(metric_readers=[reader]).get_meter("t").create_histogram("h")
    deferred = _Deferred()
    deferred.LIMIT = 5_000
    stop = threading.Event()

    def drain() -> None:
        while not stop.is_set():
            deferred.drain()

    drainers = [threading.Thread(target=drain) for _ in range(2)]
    for t in drainers:
        t.start()
    try:
        for i in range(20_000):
            deferred.record(histogram, 1.0, (("series", f"s{i % 4}"),))
    finally:
        stop.set()
        for t in drainers:
            t.join()
    deferred.drain()
    data = reader.get_metrics_data()
    [points] = [m.data.data_points for rm in data.resource_metrics for sm in rm.scope_metrics
                for m in sm.metrics]  # fmt: skip
    assert {p.attributes["series"]: p.count for p in points} == {f"s{k}": 5_000 for k in range(4)}


def test_spans_go_through_the_proxy_the_environment_names() -> None:
    """As the SDK's exporter (through requests) does: HTTP_PROXY is honoured, NO_PROXY too."""
    far = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector.invalid:4318",
           "OTEL_METRICS_EXPORTER": "none", "OTEL_EXPORTER_OTLP_TIMEOUT": "2"}  # fmt: skip
    with _Receiver() as proxy:
        via = {"HTTP_PROXY": proxy.endpoint, "http_proxy": proxy.endpoint}
        [_, final] = scenario("traces", 3, **far, **via, NO_PROXY="", no_proxy="")
        assert final["stats"] == {"exported": 9}
        assert proxy.targets and all(
            t == "http://collector.invalid:4318/v1/traces" for t in proxy.targets
        )
        [_, bypassed] = scenario("traces", 1, **far, **via, NO_PROXY="collector.invalid",
                                 no_proxy="collector.invalid")  # fmt: skip
        assert bypassed["stats"] == {"failed": 3}  # straight to a host that does not exist


def test_a_receiver_over_tls_is_verified_and_may_ask_for_a_client_certificate(
    tmp_path: Path,
) -> None:
    """Spans go over TLS only to a receiver whose certificate the configured CA signed (by
    default certifi's bundle, as requests does), with the client certificate when it asks."""
    from tests.test_tls import make_ca, make_cert

    make_ca(tmp_path, "ca")
    make_cert(tmp_path, "server", "ca", "subjectAltName=IP:127.0.0.1,DNS:localhost")
    make_cert(tmp_path, "client", "ca", "extendedKeyUsage=clientAuth")
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(tmp_path / "server.crt", tmp_path / "server.key")
    tls.load_verify_locations(tmp_path / "ca.crt")
    tls.verify_mode = ssl.CERT_REQUIRED
    client = {"OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE": str(tmp_path / "client.crt"),
              "OTEL_EXPORTER_OTLP_CLIENT_KEY": str(tmp_path / "client.key")}  # fmt: skip
    with _Receiver(tls) as receiver:
        base = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint, "OTEL_METRICS_EXPORTER": "none"}
        ca = {"OTEL_EXPORTER_OTLP_CERTIFICATE": str(tmp_path / "ca.crt")}
        [_, trusted] = scenario("traces", 3, **base, **ca, **client)
        [_, unknown_ca] = scenario("traces", 3, **base, **client)
        [_, no_client_cert] = scenario("traces", 3, **base, **ca)
        assert receiver.targets == ["/v1/traces"]  # the first run's one request, no other
    assert trusted["stats"] == {"exported": 9}
    assert unknown_ca["stats"] == {"failed": 9}
    assert no_client_cert["stats"] == {"failed": 9}


def test_the_encoding_caches_stay_bounded_whatever_the_values() -> None:
    """Attribute values and span names come from the wire (session ids, tool names): the kept
    encodings are emptied when full and a long value is written whole but never kept."""
    for i in range(span_export._PAIRS_MAX + 100):
        encode_span(_ended(i, {"session.id": f"s{i}", "tool.name": "x" * 300 + str(i)}))
        assert len(span_export._PAIRS) <= span_export._PAIRS_MAX
        assert len(span_export._NAMES) <= span_export._PAIRS_MAX
    assert not any(len(str(k[2])) > span_export._PAIR_VALUE_MAX for k in span_export._PAIRS)


def test_a_client_that_fails_unexpectedly_loses_its_batch_counted_and_the_thread_goes_on() -> None:
    """Whatever the HTTP client raises, the batch is counted failed and the export thread, which
    every later span needs, keeps running."""

    class Broken:
        def urlopen(self, *args: Any, **kwargs: Any) -> Any:
            raise RuntimeError("a client bug")

        def clear(self) -> None:
            pass

    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9",
           "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "5", "OTEL_BSP_SCHEDULE_DELAY": "600000"}  # fmt: skip
    export = SpanExport(Resource.create({}), env)
    export._http = Broken()
    try:
        for round_ in (1, 2):
            for i in range(5):
                export.add(_ended(i, {}))
            until(lambda r=round_: export.stats["failed"] == 5 * r, f"round {round_} counted")
            assert export._thread.is_alive()
    finally:
        export.shutdown(0)
