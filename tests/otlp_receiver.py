"""A real OTLP/HTTP receiver for tests: decodes the protobuf payloads exporters send."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import Span as PbSpan


def _value(v: Any) -> Any:
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind else None


class OTLPReceiver:
    """Collects spans and metric points sent to ``http://127.0.0.1:{port}/v1/...``."""

    def __init__(self, keep: bool = True) -> None:
        """``keep=False``: decode every request but only count its spans by service (for a
        benchmark, where building a dict per span would cost the measured processes CPU)."""
        self.keep = keep
        self.counts: dict[str, int] = {}
        self.spans: list[dict[str, Any]] = []
        self.metrics: list[dict[str, Any]] = []
        #: Every request body as it came (kept with ``keep``): what left the exporters, whole.
        self.bodies: list[bytes] = []
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if receiver.keep:
                    with receiver._lock:
                        receiver.bodies.append(body)
                if self.path == "/v1/traces":
                    receiver._traces(body)
                elif self.path == "/v1/metrics":
                    receiver._metrics(body)
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _traces(self, body: bytes) -> None:
        request = ExportTraceServiceRequest.FromString(body)
        for rs in request.resource_spans:
            service = {a.key: _value(a.value) for a in rs.resource.attributes}["service.name"]
            if not self.keep:
                with self._lock:
                    n = sum(len(ss.spans) for ss in rs.scope_spans)
                    self.counts[service] = self.counts.get(service, 0) + n
                continue
            for ss in rs.scope_spans:
                for s in ss.spans:
                    span = {
                        "service": service,
                        "name": s.name,
                        "kind": PbSpan.SpanKind.Name(s.kind).removeprefix("SPAN_KIND_"),
                        "trace_id": s.trace_id.hex(),
                        "span_id": s.span_id.hex(),
                        "parent_id": s.parent_span_id.hex(),
                        "attributes": {a.key: _value(a.value) for a in s.attributes},
                        "events": [e.name for e in s.events],
                        "event_attributes": [
                            {a.key: _value(a.value) for a in e.attributes} for e in s.events
                        ],
                        "status": s.status.code,  # 2 = ERROR
                        "links": [link.span_id.hex() for link in s.links],
                    }
                    with self._lock:
                        self.spans.append(span)

    def _metrics(self, body: bytes) -> None:
        request = ExportMetricsServiceRequest.FromString(body)
        for rm in request.resource_metrics:
            for sm in rm.scope_metrics:
                for m in sm.metrics:
                    kind = m.WhichOneof("data")
                    for p in getattr(m, kind).data_points:
                        attrs = {a.key: _value(a.value) for a in p.attributes}
                        value = (
                            getattr(p, "as_int", 0)
                            or getattr(p, "as_double", 0)
                            or getattr(p, "count", 0)
                        )
                        with self._lock:
                            self.metrics.append({"name": m.name, "attributes": attrs,
                                                 "value": value})  # fmt: skip

    def __enter__(self) -> OTLPReceiver:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
