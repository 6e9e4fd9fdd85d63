"""Prometheus metrics: what every long-running process serves at ``/metrics``.

The hook services and the coordinator service serve them on their probe port
(``HOOKBUS_HEALTH_PORT``, workers/services/probes.py), the gateway on its own port; in
Prometheus's text format, or OpenMetrics when the scraper asks for it (``Accept``). They are
kept with prometheus-client whether or not OpenTelemetry exports anything (``OTEL_*``): tracing
off, the metrics are still there.

What is counted, and where (``METRICS`` lists every family; README.md, "Metrics for Prometheus",
shows the same list, and tests/test_metrics.py checks both against a real scrape):

* in a process that decides (the coordinator service, the gateway): each decision by event and
  outcome, each hook's part in it by event, hook and outcome (its answer, or why there is none),
  a hook's latency as the coordinator saw it and the dispatch's, timeouts, skips by failure kind
  and policy, refusals (a context no hook could be shown), and the coordinator's own counters
  (late, malformed, forged or oversized replies dropped…);
* in a hook service: the answers it gave and how long its hook took, and the backlog of its
  request stream's group (lag + pending), read every ``BACKLOG_SECS`` (10 s: one XINFO GROUPS);
* in an async hook service: its group's backlog, refreshed by the service's retention pass
  every 10 s (one XINFO GROUPS per events partition, which it ran anyway);
* everywhere: what the service's own counters say (handled, expired, malformed, claimed,
  dead-lettered…), entries lost to the hard cap per group and stream, dead letters, spans the
  export dropped or could not send, and prometheus-client's process metrics (CPU, memory).

Cost: the counters of one dispatch are a dictionary look-up and an increment each (a hook
adds a histogram observation); the services' own counters and the span export's are read only
when scraped. Labels are event names, hook names, outcomes and reasons: never tool names,
sessions or tenants, so the series stay few.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

from prometheus_client import REGISTRY, Counter, Histogram, disable_created_metrics
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import Collector

from bus.aggregation import Outcome
from bus.events import HookContext, HookEvent
from bus.telemetry import tracing

#: How often a service reads its consumer group's backlog (one XINFO GROUPS per stream).
BACKLOG_SECS = 10.0
#: Latency buckets in seconds: a hook answers in a millisecond or so on a local network; its
#: timeout is at most a few seconds.
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
                   5.0, 10.0, 30.0)  # fmt: skip

#: Every metric family HookBus serves (the name as scraped, without ``_total`` / ``_bucket``
#: suffixes), what it counts, and its labels.
METRICS: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "hookbus_decisions": (
        "counter", "decisions sent back, by event and outcome (the combined action's wire "
        "name; none for an event without one; error: no decision within timeout_ms)",
        ("event", "outcome")),
    "hookbus_dispatch_duration_seconds": (
        "histogram", "time to decide one event", ("event",)),
    "hookbus_hook_outcomes": (
        "counter", "each hook's part in a decision, by event, hook and outcome (its answer's "
        "wire name, none, or the failure: timeout, error, unreachable)",
        ("event", "hook", "outcome")),
    "hookbus_hook_duration_seconds": (
        "histogram", "time one hook took to answer, as the deciding process saw it",
        ("event", "hook")),
    "hookbus_hook_timeouts": ("counter", "hooks that did not answer in time", ("hook",)),
    "hookbus_hook_skips": (
        "counter", "hooks that did not answer, by failure kind and what their policy made of "
        "it (fail_open: skipped; fail_closed: turned into Block/Deny)",
        ("hook", "failure", "policy")),
    "hookbus_refusals": (
        "counter", "requests refused because no hook could be shown their context (too large, "
        "too deep): Block, Deny or output withheld, by the process that refused (dispatch: the "
        "coordinator; request: the service or gateway, before dispatching)", ("stage",)),
    "hookbus_hook_answers": (
        "counter", "answers a hook service sent, by event, hook and outcome (the action's wire "
        "name, none, or error)", ("event", "hook", "outcome")),
    "hookbus_hook_run_duration_seconds": (
        "histogram", "time a hook service's hook took to answer one request", ("event", "hook")),
    "hookbus_service_entries": (
        "counter", "what a service did with the entries it read, from its own counters (role: "
        "worker, async-worker, coordinator, coordinator-service, gateway)",
        ("role", "name", "result")),
    "hookbus_group_backlog": (
        "gauge", "entries a hook's consumer group has not handled yet (lag + pending): an async "
        "hook's events, a sync hook's requests; refreshed every 10 s", ("group",)),
    "hookbus_entries_lost": (
        "counter", "stream entries a hard cap cut before a consumer group handled them",
        ("group", "stream")),
    "hookbus_dead_letters": (
        "counter", "messages moved to a dead-letter stream, by source", ("source",)),
    "hookbus_spans_lost": (
        "counter", "spans not exported: dropped (the export queue was full) or failed (the "
        "receiver refused them or did not answer); 0 with tracing off", ("reason",)),
}  # fmt: skip


#: No ``_created`` series beside each counter and histogram: they would double the series, and
#: Prometheus's rate() does not need them.
disable_created_metrics()  # type: ignore[no-untyped-call]


def _counter(name: str) -> Counter:
    _, doc, labels = METRICS[name]
    return Counter(name, doc, labels)


def _histogram(name: str) -> Histogram:
    _, doc, labels = METRICS[name]
    return Histogram(name, doc, labels, buckets=LATENCY_BUCKETS)


decisions = _counter("hookbus_decisions")
dispatch_seconds = _histogram("hookbus_dispatch_duration_seconds")
hook_outcomes = _counter("hookbus_hook_outcomes")
hook_seconds = _histogram("hookbus_hook_duration_seconds")
timeouts = _counter("hookbus_hook_timeouts")
skips = _counter("hookbus_hook_skips")
hook_answers = _counter("hookbus_hook_answers")
run_seconds = _histogram("hookbus_hook_run_duration_seconds")
entries_lost = _counter("hookbus_entries_lost")
dead_letters = _counter("hookbus_dead_letters")

#: Label children by their values: a dictionary look-up instead of ``labels()``'s lock.
_children: dict[tuple[Any, ...], Any] = {}


def _child(metric: Any, *values: str) -> Any:
    key = (metric, *values)
    child = _children.get(key)
    if child is None:
        child = _children[key] = metric.labels(*values)
    return child


_ENFORCED = (HookEvent.PRE_TOOL_USE, HookEvent.PERMISSION_REQUEST)


def observe_dispatch(
    event: HookEvent, ctx: HookContext, outcomes: Sequence[Outcome], seconds: float
) -> None:
    """A runner's dispatch observer (``EventRunner.observers``): each hook's part."""
    name = event._value_
    _child(dispatch_seconds, name).observe(seconds)
    for o in outcomes:
        hook = o.spec.name
        if o.failure is None:
            _child(hook_outcomes, name, hook, tracing.action_tag(o.action)).inc()
        else:
            _child(hook_outcomes, name, hook, o.failure).inc()
            enforced = o.spec.failure_policy == "fail" and event in _ENFORCED
            policy = "fail_closed" if enforced else "fail_open"
            _child(skips, hook, o.failure, policy).inc()
            if o.failure == "timeout":
                _child(timeouts, hook).inc()
        _child(hook_seconds, name, hook).observe(o.elapsed)


def decided(event: HookEvent, result: Any, error: bool = False) -> None:
    """One decision sent back: its combined action (``error``: none was reached in time)."""
    outcome = "error" if error else tracing.action_tag(getattr(result, "action", None))
    _child(decisions, event._value_, outcome).inc()


def answered(hook: str, event: HookEvent, action: Any, error: bool, seconds: float) -> None:
    """One answer a hook service sent."""
    name = event._value_
    _child(hook_answers, name, hook, "error" if error else tracing.action_tag(action)).inc()
    _child(run_seconds, name, hook).observe(seconds)


def _counted(what: str, labels: tuple[str, ...], n: int) -> None:
    """Dead letters and lost entries, as ``tracing.count_dead_letters`` / ``count_lost``
    are told of them."""
    _child(dead_letters if what == "dead_letters" else entries_lost, *labels).inc(n)


tracing.listeners.append(_counted)


# -- read when scraped ------------------------------------------------------------------------

#: What is read of a tracked object at scrape time, by the object (weakly: a service that is
#: gone is no longer served): [(family, labels, read)], ``read`` taking the object.
_tracked: weakref.WeakKeyDictionary[Any, list[tuple[str, tuple[str, ...], Callable[[Any], Any]]]]
_tracked = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def _track(owner: Any, family: str, labels: tuple[str, ...], read: Callable[[Any], Any]) -> None:
    with _lock:
        _tracked.setdefault(owner, []).append((family, labels, read))


def track(owner: Any, role: str, name: str) -> None:
    """Serve ``owner.stats`` (a service's own counters, which only grow) as
    ``hookbus_service_entries_total{role, name, result}`` for as long as ``owner`` lives."""
    _track(owner, "hookbus_service_entries", (role, name), lambda o: o.stats)


def track_backlog(owner: Any, group: str) -> None:
    """Serve ``owner.backlog`` (entries its consumer group has not handled yet) as
    ``hookbus_group_backlog{group}``; the service refreshes it every ``BACKLOG_SECS``."""
    _track(owner, "hookbus_group_backlog", (group,), lambda o: o.backlog)


def track_group(owner: Any, group: str, streams: Iterable[str]) -> None:
    """An async hook service: its group's backlog; its lost entries and dead letters are
    served at 0 from the start (a series that appears only with the first loss is one an alert
    on its rate never sees rise)."""
    track_backlog(owner, group)
    for stream in streams:
        _child(entries_lost, group, stream)
    _child(dead_letters, group)


def track_refusals(owner: Any, stage: str, read: Callable[[Any], int]) -> None:
    _track(owner, "hookbus_refusals", (stage,), read)


def watch(runner: Any, role: str) -> None:
    """Count a deciding runner's dispatches (its observer), its refusals and its own counters."""
    if observe_dispatch not in runner.observers:
        runner.observers.append(observe_dispatch)
    track_refusals(runner, "dispatch", lambda r: r.refusals)
    if isinstance(getattr(runner, "stats", None), dict):
        track(runner, role, getattr(runner, "source", role))


#: The families read from tracked objects at scrape time.
_SCRAPED = ("hookbus_service_entries", "hookbus_group_backlog", "hookbus_refusals")


class _Scraped(Collector):
    """The families read at scrape time. Objects with the same labels (the lanes of a hook
    service with shards, a gateway's and a service's refusals) are added up."""

    def collect(self) -> Iterable[Metric]:
        with _lock:
            tracked = [(owner, list(reads)) for owner, reads in _tracked.items()]
        sums: dict[str, dict[tuple[str, ...], float]] = {name: {} for name in _SCRAPED}
        sums["hookbus_refusals"] = {("dispatch",): 0, ("request",): 0}
        for owner, reads in tracked:
            for family, labels, read in reads:
                found = read(owner)
                rows = (
                    [((*labels, key), count) for key, count in found.items()]
                    if isinstance(found, Mapping)
                    else [(labels, found)]
                )
                table = sums[family]
                for key, value in rows:
                    table[key] = table.get(key, 0) + value
        for name, table in sums.items():
            kind, doc, labels = METRICS[name]
            metric = (CounterMetricFamily if kind == "counter" else GaugeMetricFamily)(
                name, doc, labels=list(labels)
            )
            for key, value in table.items():
                metric.add_metric(list(key), value)
            yield metric
        yield from _spans()


def _spans() -> Iterator[Metric]:
    stats = tracing.span_stats()
    lost = CounterMetricFamily(
        "hookbus_spans_lost", METRICS["hookbus_spans_lost"][1], labels=["reason"]
    )
    for reason in ("dropped", "failed"):
        lost.add_metric([reason], stats.get(reason, 0))
    yield lost


REGISTRY.register(_Scraped())


#: A scrape within this many seconds of the last one (of the same format) gets the same body.
#: Encoding every series takes tens of milliseconds on the event loop, and the gateway serves
#: /metrics without a token on the port tenants reach: a flood of scrapes must not hold up
#: their decisions. Prometheus scrapes every 15 s or so; a second's staleness costs it nothing.
SCRAPE_CACHE_SECS = 1.0
_scraped: dict[str, tuple[float, bytes]] = {}


def exposition(accept: str | None, now: float | None = None) -> tuple[bytes, str]:
    """The body and content type of a scrape: OpenMetrics when ``accept`` asks for it; the
    last body of that format again if it is younger than ``SCRAPE_CACHE_SECS``."""
    encode, content_type = choose_encoder(accept or "")
    at = time.monotonic() if now is None else now
    last = _scraped.get(content_type)
    if last is not None and 0 <= at - last[0] < SCRAPE_CACHE_SECS:
        return last[1], content_type
    body = encode(REGISTRY)
    _scraped[content_type] = (at, body)
    return body, content_type
