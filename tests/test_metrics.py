"""Metrics that Prometheus scrapes (issue 35, item 8): every long-running process serves
``/metrics`` (the services on their probe port, the gateway on its own), and the Grafana
dashboard in deploy/grafana asks only for what they serve.

Real processes on a real redis-server: a hook service that blocks, one that always times out,
an async hook service, the coordinator service and the gateway; real decisions through the
coordinator service (Redis) and the gateway (HTTP); then each process is scraped over HTTP and
what it serves is parsed with prometheus-client's own parsers. Tracing is off (no ``OTEL_*``):
the metrics do not need it.
"""

from __future__ import annotations

import http.client
import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
import yaml
from prometheus_client.metrics_core import Metric
from prometheus_client.openmetrics.parser import text_string_to_metric_families as openmetrics
from prometheus_client.parser import text_string_to_metric_families
from redis import Redis

from bus import HookEvent
from bus.limits import MAX_CONTEXT_DEPTH
from bus.protocol import DecisionReply, DecisionRequest, encode, new_id, now_ms, raw
from bus.settings import BusSettings
from bus.telemetry.metrics import METRICS
from bus.transport.keys import Keys
from tests.harness import ROOT, Processes, until, worker_env
from tests.remote_hooks import HookConfig
from tests.test_gateway import decision_request, live, start_gateway
from tests.test_probes import get
from workers.local.redis_server import free_port
from workers.testing import context

DASHBOARD = ROOT / "deploy" / "grafana" / "hookbus.json"
OPENMETRICS = "application/openmetrics-text; version=1.0.0"


def scrape(port: int, accept: str = "") -> tuple[int, str, str]:
    """Status, content type and body of ``GET /metrics`` on ``port`` (0 when nothing answers)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", "/metrics", headers={"Accept": accept} if accept else {})
        response = conn.getresponse()
        return response.status, response.getheader("Content-Type", ""), response.read().decode()
    except OSError as exc:
        return 0, "", str(exc)
    finally:
        conn.close()


def families(port: int) -> dict[str, Metric]:
    status, content_type, body = scrape(port)
    assert status == 200, body
    assert content_type.startswith("text/plain; version=0.0.4"), content_type
    return {f.name: f for f in text_string_to_metric_families(body)}


def value(found: dict[str, Metric], sample: str, **labels: str) -> float:
    """The sum of the samples named ``sample`` (``x_total``, ``x_count``, a gauge's ``x``)
    whose labels include ``labels``."""
    family = re.sub(r"_(total|count|sum|bucket)$", "", sample)
    return sum(
        s.value
        for s in found[family].samples
        if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items())
    )


def over_http(tool_args: dict[str, Any]) -> dict[str, Any]:
    """A gateway decision request for ``file_read`` with ``tool_args``."""
    return decision_request(
        context={"session_id": "s-http", "tool_name": "file_read", "tool_args": tool_args}
    )


def expect(found: dict[str, Metric], rows: list[tuple[str, dict[str, str], float]]) -> None:
    """Each (sample, labels, value) of ``rows`` is what ``found`` has."""
    assert [(name, labels, value(found, name, **labels)) for name, labels, _ in rows] == rows


def decide_over_redis(settings: BusSettings, path: str) -> DecisionReply:
    """One PreToolUse decision asked of the coordinator service, as a foreign agent asks it."""
    keys = Keys(settings.prefix)
    ctx = context(
        "PreToolUse", session_id="s-metrics", tool_name="file_read", tool_args={"path": path}
    )
    inbox = keys.inbox(f"metrics-{new_id()[:6]}")
    request = DecisionRequest(
        id=new_id(),
        ts=now_ms(),
        event=HookEvent.PRE_TOOL_USE,
        context=raw(ctx),
        timeout_ms=10_000,
        reply_to=inbox,
    )
    with Redis.from_url(settings.redis_url) as redis:
        redis.xadd(keys.decisions("s-metrics"), {"data": encode(request)})
        popped = redis.blpop([inbox], timeout=20)
    assert popped is not None, "the coordinator service did not answer"
    return msgspec.json.decode(popped[1], type=DecisionReply)


def dashboard_metrics() -> set[str]:
    """Every metric name the dashboard's queries use."""
    doc = json.loads(DASHBOARD.read_text())

    def exprs(node: object) -> Iterator[str]:
        if isinstance(node, dict):
            for key, item in node.items():
                if key in ("expr", "query") and isinstance(item, str):
                    yield item
                else:
                    yield from exprs(item)
        elif isinstance(node, list):
            for item in node:
                yield from exprs(item)

    found = {m for e in exprs(doc) for m in re.findall(r"\b(hookbus_[a-z_]+|process_[a-z_]+)", e)}
    assert found, "the dashboard has no query"
    return found


def serves(name: str, found: dict[str, Metric]) -> bool:
    """Whether ``found`` (one scrape) has samples named ``name``, of a family of the kind the
    suffix implies (``x_bucket``: a histogram ``x``; ``x_total``: a counter ``x``)."""
    for suffix, kinds in (
        ("_bucket", ("histogram",)),
        ("_count", ("histogram",)),
        ("_sum", ("histogram",)),
        ("_total", ("counter",)),
        ("", ("gauge", "unknown")),
    ):
        metric = found.get(name.removesuffix(suffix)) if name.endswith(suffix) else None
        if metric is not None and metric.type in kinds:
            return any(s.name == name for s in metric.samples)
    return False


@pytest.mark.redis
def test_every_service_serves_its_metrics_and_the_dashboard_asks_only_for_them(
    bus_settings: BusSettings, procs: Processes, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in [k for k in os.environ if k.startswith("OTEL_")]:  # tracing off
        monkeypatch.delenv(name)
    settings = bus_settings
    ports = {name: free_port() for name in ("guard", "sluggish", "async", "coordinator")}

    def health(name: str) -> str:
        return str(ports[name])

    procs.worker(
        settings,
        "workers.builtins.demo_hooks:SecretGuard",
        "guard",
        HOOKBUS_HEALTH_PORT=health("guard"),
    )
    sluggish = HookConfig(name="Sluggish", events=[HookEvent.PRE_TOOL_USE], delay=5.0, timeout=0.2)
    procs.scripted(settings, sluggish, HOOKBUS_HEALTH_PORT=health("sluggish"))
    procs.worker(
        settings,
        "workers.builtins.metrics:AsyncMetricsHook",
        "async",
        HOOKBUS_HEALTH_PORT=health("async"),
    )
    procs.start(
        ["coordinator"],
        worker_env(settings, HOOKBUS_HEALTH_PORT=health("coordinator")),
        "coordinator",
    )
    live(settings, "SecretGuard", "Sluggish", "AsyncMetricsHook")
    gateway = start_gateway(procs, settings, tmp_path)
    until(lambda: get(ports["coordinator"], "/readyz")[0] == 200, "the coordinator ready",
          explain=procs.logs)  # fmt: skip

    # Three decisions through the coordinator service (two blocked), two through the gateway
    # (one blocked), then a refusal; the sluggish hook times out in each decision and is
    # skipped (failure_policy ignore). SecretGuard is asked only about .env files (its filter):
    # three times.
    replies = [decide_over_redis(settings, p) for p in ("app/.env", "README.md", "prod/.env")]
    assert [r.result["action"]["type"] for r in replies] == ["Block", "Continue", "Block"], replies
    for path in ("app/.env", "README.md"):
        status, _, _ = gateway.post("/v1/decisions", over_http({"path": path}))
        assert status == 200
    # And one the gateway refuses before dispatching: its arguments nest deeper than any hook
    # may be shown (bus/limits.py). A refusal, not a decision.
    deep: dict[str, Any] = {"path": "notes.txt"}
    for _ in range(MAX_CONTEXT_DEPTH + 8):
        deep = {"inner": deep}
    status, reply, _ = gateway.post("/v1/decisions", over_http(deep))
    assert status == 200 and reply["result"]["action"]["type"] == "Block", reply

    coordinator = families(ports["coordinator"])
    expect(coordinator, [
        ("hookbus_decisions_total", {"event": "PreToolUse"}, 3),
        ("hookbus_decisions_total", {"outcome": "Block"}, 2),
        ("hookbus_decisions_total", {"outcome": "Continue"}, 1),
        ("hookbus_hook_outcomes_total", {"hook": "SecretGuard", "outcome": "Block"}, 2),
        ("hookbus_hook_outcomes_total", {"hook": "Sluggish", "outcome": "timeout"}, 3),
        ("hookbus_hook_timeouts_total", {"hook": "Sluggish"}, 3),
        ("hookbus_hook_skips_total",
         {"hook": "Sluggish", "failure": "timeout", "policy": "fail_open"}, 3),
        ("hookbus_hook_duration_seconds_count", {"hook": "SecretGuard", "event": "PreToolUse"}, 2),
        ("hookbus_dispatch_duration_seconds_count", {"event": "PreToolUse"}, 3),
        ("hookbus_service_entries_total", {"role": "coordinator-service", "result": "answered"}, 3),
        ("hookbus_refusals_total", {}, 0),
    ])  # fmt: skip
    served = families(gateway.port)
    expect(served, [
        ("hookbus_decisions_total", {"event": "PreToolUse"}, 2),
        ("hookbus_decisions_total", {"outcome": "Block"}, 1),
        ("hookbus_hook_timeouts_total", {"hook": "Sluggish"}, 2),
        ("hookbus_service_entries_total", {"role": "gateway", "result": "refused"}, 1),
        ("hookbus_refusals_total", {"stage": "request"}, 1),
        ("hookbus_refusals_total", {"stage": "dispatch"}, 0),
    ])  # fmt: skip
    # The hook service counted each answer it sent before sending it: all three are there.
    guard = families(ports["guard"])
    expect(guard, [
        ("hookbus_group_backlog", {"group": "SecretGuard"}, 0),  # all answered
        ("hookbus_hook_answers_total", {"hook": "SecretGuard"}, 3),
        ("hookbus_hook_answers_total", {"hook": "SecretGuard", "outcome": "Block"}, 3),
        ("hookbus_hook_run_duration_seconds_count", {"hook": "SecretGuard"}, 3),
        ("hookbus_service_entries_total",
         {"role": "worker", "name": "SecretGuard", "result": "handled"}, 3),
    ])  # fmt: skip

    # The async hook service handles the five published events in its own time.
    def handled_all() -> dict[str, Metric] | None:
        found = families(ports["async"])
        done = value(found, "hookbus_service_entries_total", role="async-worker", result="handled")
        return found if done >= 5 else None

    async_hook = until(handled_all, "the async hook to handle the five events", 30, procs.logs)
    assert "hookbus_group_backlog" in async_hook
    assert any(
        s.labels == {"group": "AsyncMetricsHook"}
        for s in async_hook["hookbus_group_backlog"].samples
    )
    assert value(async_hook, "hookbus_entries_lost_total", group="AsyncMetricsHook") == 0
    assert value(async_hook, "hookbus_dead_letters_total", source="AsyncMetricsHook") == 0

    scraped = {
        "coordinator": coordinator,
        "gateway": served,
        "guard": guard,
        "async": async_hook,
        "sluggish": families(ports["sluggish"]),
    }
    for name, found in scraped.items():
        # Tracing is off: no span is lost, and the series says so.
        assert value(found, "hookbus_spans_lost_total") == 0, name
        assert set(METRICS) <= set(found), (name, set(METRICS) - set(found))
        # Labels name events, hooks, outcomes: never a tool, a session or a tenant.
        values = {v for m in found.values() for s in m.samples for v in s.labels.values()}
        assert not values & {"file_read", "s-metrics", "s-http", "laptop"}, name

    # OpenMetrics for a scraper that asks for it.
    status, content_type, body = scrape(ports["coordinator"], OPENMETRICS)
    assert status == 200 and content_type.startswith("application/openmetrics-text"), body
    assert "hookbus_decisions" in {f.name for f in openmetrics(body)}

    # Every metric the dashboard asks for is served, with samples, by some process.
    for name in sorted(dashboard_metrics()):
        assert any(serves(name, found) for found in scraped.values()), (
            f"the dashboard asks for {name}, which no HookBus process serves"
        )


def readme_metrics() -> dict[str, tuple[str, tuple[str, ...]]]:
    """The table of README's "Metrics for Prometheus": metric → (type, labels)."""
    text = (ROOT / "README.md").read_text()
    section = text.split("## Metrics for Prometheus", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `(hookbus_[a-z_]+)` \| (\w+) \| ([^|]*) \|", section, re.M)
    return {name: (kind, tuple(re.findall(r"`(\w+)`", labels))) for name, kind, labels in rows}


def test_the_readme_lists_every_metric_as_served() -> None:
    listed = readme_metrics()
    served = {
        name + ("_total" if kind == "counter" else ""): (kind, labels)
        for name, (kind, _, labels) in METRICS.items()
    }
    assert listed == served


def pods(doc: dict[str, Any]) -> dict[str, Any]:
    return doc["spec"]["template"]


def test_prometheus_finds_every_process_that_serves_metrics() -> None:
    """Kubernetes: each Deployment's pods are annotated with the port of their probes (the
    gateway's own), which the scrape job keeps; Compose: the job names each service that has a
    probe port, at that port."""
    config = yaml.safe_load((ROOT / "deploy" / "prometheus" / "prometheus.yml").read_text())
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    keep = {
        tuple(r["source_labels"]): r["regex"]
        for r in jobs["hookbus"]["relabel_configs"]
        if r.get("action") == "keep"
    }
    assert keep == {
        ("__meta_kubernetes_pod_label_app_kubernetes_io_name",): "hookbus",
        ("__meta_kubernetes_pod_annotation_prometheus_io_scrape",): "true",
    }
    deployments = [
        doc
        for path in sorted((ROOT / "deploy" / "k8s").glob("*.yaml"))
        for doc in yaml.safe_load_all(path.read_text())
        if doc and doc.get("kind") == "Deployment"
    ]
    assert deployments
    for doc in deployments:
        template = pods(doc)
        assert template["metadata"]["labels"]["app.kubernetes.io/name"] == "hookbus"
        notes = template["metadata"]["annotations"]
        (container,) = template["spec"]["containers"]
        probe_port = container["readinessProbe"]["httpGet"]["port"]
        port = next(p["containerPort"] for p in container["ports"] if p["name"] == probe_port)
        name = doc["metadata"]["name"]
        assert notes == {"prometheus.io/scrape": "true", "prometheus.io/port": str(port),
                         "prometheus.io/path": "/metrics"}, name  # fmt: skip

    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    probed: dict[str, int] = {}
    for name, service in compose["services"].items():
        test = " ".join((service.get("healthcheck") or {}).get("test") or [])
        if found := re.search(r"127\.0\.0\.1:(\d+)/readyz", test):
            probed[name] = int(found[1])
    scraped = {
        name: target["port"]
        for target in jobs["hookbus-compose"]["dns_sd_configs"]
        for name in target["names"]
    }
    assert probed and scraped == probed


def test_dead_letters_and_lost_entries_the_transport_counts_reach_the_metrics() -> None:
    """The transport counts them through ``tracing.count_dead_letters`` / ``count_lost``,
    which exports them only when OpenTelemetry is configured; /metrics has them always."""
    from prometheus_client import REGISTRY

    from bus.telemetry import metrics, tracing

    assert metrics._counted in tracing.listeners

    def sample(name: str, **labels: str) -> float:
        return REGISTRY.get_sample_value(name, labels) or 0.0

    dead, lost = (
        sample("hookbus_dead_letters_total", source="g"),
        sample("hookbus_entries_lost_total", group="g", stream="s"),
    )
    tracing.count_dead_letters("g", 2)
    tracing.count_lost("g", "s", 3)
    assert sample("hookbus_dead_letters_total", source="g") == dead + 2
    assert sample("hookbus_entries_lost_total", group="g", stream="s") == lost + 3


def test_a_scrape_within_a_second_of_the_last_gets_the_same_body() -> None:
    """Encoding every series costs tens of milliseconds on the serving event loop, and the
    gateway's /metrics takes no token: scrapes within ``SCRAPE_CACHE_SECS`` share one body, so
    a flood of them encodes once a second (per format) however many arrive."""
    from bus.telemetry import metrics, tracing

    first, kind = metrics.exposition(None, now=10_000.0)
    tracing.count_dead_letters("cached", 1)
    assert metrics.exposition(None, now=10_000.5) == (first, kind)  # the same bytes
    assert b'source="cached"' not in first
    fresh, _ = metrics.exposition(None, now=10_000.0 + metrics.SCRAPE_CACHE_SECS)
    assert b'hookbus_dead_letters_total{source="cached"} 1.0' in fresh
    openmetrics, other = metrics.exposition("application/openmetrics-text", now=10_000.5)
    assert other != kind and b'source="cached"' in openmetrics  # each format its own
