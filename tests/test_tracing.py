"""One agent turn is one trace: agent, coordinator and two worker processes, exported over
OTLP/HTTP to a real receiver that decodes the protobuf payloads."""

from __future__ import annotations

import itertools
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bus import Block, HookEvent
from bus.settings import BusSettings
from tests.harness import ROOT, Processes, wait_for, worker_env
from tests.otlp_receiver import OTLPReceiver
from tests.remote_hooks import HookConfig

PRE = HookEvent.PRE_TOOL_USE.value


def span_table() -> dict[tuple[str, str], set[str]]:
    """docs/protocol.md's table of spans: (a pattern of the name, the kind) → the attribute
    names its row lists (every lowercase name in backticks)."""
    text = (ROOT / "docs" / "protocol.md").read_text()
    rows = text[text.index("| span | kind | recorded by | attributes |") :].splitlines()[2:]
    table: dict[tuple[str, str], set[str]] = {}
    for row in itertools.takewhile(lambda line: line.startswith("|"), rows):
        name, kind, _, attributes = (cell.strip() for cell in row.strip("|").split(" | "))
        pattern = re.sub(r"\\\{\w+\\\}", ".+", re.escape(name.strip("`")))
        listed = set(re.findall(r"`([a-z_][a-z_.]*)`", attributes))
        table.setdefault((pattern, kind), set()).update(listed)
    return table


def check_span_table(spans: list[dict[str, Any]]) -> None:
    """Each span has a row of docs/protocol.md's table for its name and kind, which lists each
    of its attributes."""
    table = span_table()
    assert len(table) >= 7, table
    for s in spans:
        listed = [keys for (pattern, kind), keys in table.items()
                  if kind == s["kind"] and re.fullmatch(pattern, s["name"])]  # fmt: skip
        assert listed, f"{s['name']} ({s['kind']}) has no row in docs/protocol.md's span table"
        unlisted = set(s["attributes"]) - set().union(*listed)
        assert not unlisted, f"{s['name']} ({s['kind']}): {unlisted} not in the span table"


def otel_env(receiver: OTLPReceiver, service: str) -> dict[str, str]:
    return {
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
        "OTEL_SERVICE_NAME": service,
        "OTEL_BSP_SCHEDULE_DELAY": "100",
        "OTEL_METRIC_EXPORT_INTERVAL": "500",
    }


async def test_one_turn_is_one_trace_with_hook_spans_from_the_workers(
    bus_settings: BusSettings, procs: Processes, tmp_path: Path
) -> None:
    with OTLPReceiver() as receiver:
        guard = HookConfig(name="Guard", events=[HookEvent.PRE_TOOL_USE], content=["path:.env"],
                           answers={PRE: Block(reason="no secrets")})  # fmt: skip
        slow = HookConfig(name="Slow", events=[HookEvent.PRE_TOOL_USE], delay=5, timeout=0.3)
        workers = [
            procs.scripted(bus_settings, c, **otel_env(receiver, f"hookbus-worker-{c.name}"))
            for c in (guard, slow)
        ]
        agent = subprocess.run(
            [sys.executable, "-m", "tests.trace_agent", str(tmp_path / "sandbox")],
            cwd=ROOT, env={**worker_env(bus_settings), **otel_env(receiver, "hookbus-agent")},
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert agent.returncode == 0, agent.stderr
        for w in workers:  # a clean stop flushes the workers' spans
            w.send_signal(signal.SIGTERM)
            w.wait(30)
        await wait_for(lambda: any(s["name"] == "hook Guard" and s["service"] != "hookbus-agent"
                                   for s in receiver.spans), what="the worker's span")  # fmt: skip
        spans = list(receiver.spans)
    check_span_table(spans)

    by_id = {s["span_id"]: s for s in spans}
    [turn] = [s for s in spans if s["name"] == "turn"]
    trace_id = turn["trace_id"]
    assert turn["parent_id"] == "" and turn["attributes"]["session.id"] == "traced-session"

    def chain(span: dict[str, Any]) -> list[str]:
        names = [span["name"]]
        while span["parent_id"]:
            span = by_id[span["parent_id"]]
            names.append(span["name"])
        return names

    # the worker's execution span hangs under the agent's dispatch span, in the same trace
    [guard_span] = [s for s in spans if s["name"] == "hook Guard" and s["service"] ==
                    "hookbus-worker-Guard"]  # fmt: skip
    assert guard_span["trace_id"] == trace_id
    assert chain(guard_span) == ["hook Guard", "dispatch PreToolUse", "execute_tool file_read",
                                 "step 1", "turn"]  # fmt: skip
    attrs = guard_span["attributes"]
    assert attrs["hook.name"] == "Guard" and attrs["hook.event"] == "PreToolUse"
    assert attrs["gen_ai.tool.name"] == "file_read" and attrs["session.id"] == "traced-session"
    assert attrs["hook.action"] == "Block" and attrs["hook.failure_policy"] == "ignore"
    assert attrs["hook.replica"] and attrs["hook.timed_out"] is False
    # the time the coordinator gave it: the client's default (5 s), on Redis's clock
    assert 4000 <= attrs["hook.timeout_ms"] <= 6000
    assert "Block" in guard_span["events"]

    # Jaeger's service graph pairs a CLIENT span with its SERVER children in other services
    dispatch = by_id[guard_span["parent_id"]]
    assert (dispatch["kind"], guard_span["kind"]) == ("CLIENT", "SERVER")
    assert dispatch["attributes"]["hookbus.decision"] == "Block"  # the combined decision
    assert dispatch["attributes"]["gen_ai.tool.name"] == "file_read"
    [call] = [by_id[dispatch["parent_id"]]]
    assert call["attributes"]["gen_ai.operation.name"] == "execute_tool"
    assert call["attributes"]["gen_ai.tool.name"] == "file_read"
    assert call["attributes"]["gen_ai.tool.call.id"]
    decisions = [s["attributes"]["hookbus.decision"] for s in spans
                 if s["name"] == "dispatch PreToolUse"]  # fmt: skip
    assert sorted(decisions) == ["Block", "Continue"]  # .env blocked; a.txt: Slow skipped

    # the hook the agent runs in its own process: a span like the others, under the dispatch
    in_process = [s for s in spans if s["name"] == "hook InProcess"]
    assert len(in_process) == 2
    for s in in_process:
        assert s["service"] == "hookbus-agent" and s["kind"] == "INTERNAL"
        assert by_id[s["parent_id"]]["name"] == "dispatch PreToolUse"
        assert s["attributes"]["hook.action"] == "none"
        assert s["attributes"]["hook.timeout_ms"] == 5000
    # every span of the turn is in that one trace
    agent_spans = [s for s in spans if s["service"] == "hookbus-agent"]
    assert {s["trace_id"] for s in agent_spans} == {trace_id}

    # the timeout: an error span with hook.timed_out = true, under the dispatch
    timed_out = [s for s in spans if s["name"] == "hook Slow" and s["attributes"].get(
        "hook.timed_out") is True]  # fmt: skip
    assert timed_out and all(s["status"] == 2 for s in timed_out)
    seen_by_agent = [s for s in timed_out if s["service"] == "hookbus-agent"]
    assert seen_by_agent and all(s["kind"] == "INTERNAL" for s in seen_by_agent)
    # its own timeout, in the agent and in its worker alike
    assert {s["attributes"]["hook.timeout_ms"] for s in timed_out} == {300}
    assert any(s["service"] == "hookbus-worker-Slow" for s in timed_out)
    assert any(chain(s)[1] == "dispatch PreToolUse" for s in timed_out)

    # the fail-open skip is counted in the agent's metrics
    skips = [m for m in receiver.metrics if m["name"] == "hookbus.hook.skips"]
    assert any(m["attributes"] == {"hook.name": "Slow", "outcome": "fail_open"} and m["value"] >= 1
               for m in skips), skips  # fmt: skip
    assert any(m["name"] == "hookbus.dispatch.duration" for m in receiver.metrics)


def test_no_exporter_configured_installs_nothing() -> None:
    from bus.telemetry import tracing as telemetry

    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    assert telemetry.configure("agent", env) is False
    assert telemetry.enabled() is False


# -- issue 17, item 13: batch hooks' spans, exporters refused, a silent collector ----------------


def traceparent(trace_id: str, span_id: str) -> str:
    return f"00-{trace_id}-{span_id}-01"


async def test_batch_hooks_record_a_span_per_batch_linked_to_each_publisher(
    bus_settings: BusSettings, procs: Processes, tmp_path: Path
) -> None:
    """The built-in audit log hook works in batches (on_batch, on_audit): each batch is one
    span, in a trace of its own, linked to the span that published each entry."""
    import redis

    from bus.events import PostToolUseContext
    from bus.protocol import AuditRecord, EventMessage, encode, new_id, now_ms, raw
    from bus.transport.keys import Keys

    keys = Keys(bus_settings.prefix)
    with OTLPReceiver() as receiver:
        worker = procs.worker(
            bus_settings, "workers.builtins.audit:AsyncAuditLogHook", "audit", "--from", "0",
            HOOKBUS_AUDIT_DB=str(tmp_path / "audit.db"), **otel_env(receiver, "hookbus-audit"),
        )  # fmt: skip
        r = redis.Redis.from_url(bus_settings.redis_url)
        published = []
        try:
            for i in range(3):
                span_id = f"{i + 1:016x}"
                published.append(span_id)
                ctx = PostToolUseContext(session_id="s1", tool_name="search", output_content="x")
                message = EventMessage(
                    id=new_id(), ts=now_ms(), event=HookEvent.POST_TOOL_USE, session_id="s1",
                    context=raw(ctx), traceparent=traceparent("ab" * 16, span_id),
                )  # fmt: skip
                r.xadd(keys.events("s1"), {"data": encode(message)})
            record = AuditRecord(
                id=new_id(), ts=now_ms(), kind="shadowed", event=HookEvent.PRE_TOOL_USE,
                hook="Guard", mode="dryrun", detail="would have blocked",
                traceparent=traceparent("cd" * 16, "00000000000000aa"),
            )  # fmt: skip
            r.xadd(keys.audit, {"data": encode(record)})
        finally:
            r.close()

        def batches() -> list[dict[str, Any]]:
            return [s for s in receiver.spans if s["name"] == "hook AsyncAuditLogHook"]

        def linked() -> bool:
            links = {link for s in batches() for link in s["links"]}
            return set(published) <= links and "00000000000000aa" in links

        await wait_for(linked, 60, "batch spans linked to every publisher")
        worker.send_signal(signal.SIGTERM)
        worker.wait(30)
    check_span_table(list(receiver.spans))
    spans = batches()
    events = [s for s in spans if s["attributes"]["hook.method"] == "on_batch"]
    audits = [s for s in spans if s["attributes"]["hook.method"] == "on_audit"]
    assert sum(s["attributes"]["hook.batch_size"] for s in events) == 3
    assert {s["attributes"]["hook.events"] for s in events} == {"PostToolUse"}
    assert [s["attributes"]["hook.batch_size"] for s in audits] == [1]
    for s in spans:  # a trace of its own, never the publisher's
        assert s["parent_id"] == "" and s["trace_id"] not in ("ab" * 16, "cd" * 16)
        assert s["attributes"]["hook.replica"] and s["attributes"]["hook.timed_out"] is False


def hookbus_run(
    args: list[str], env: dict[str, str], timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    return subprocess.run(
        [sys.executable, "-m", "workers.cli", *args], env={**clean, **env}, cwd=ROOT,
        capture_output=True, text=True, timeout=timeout, check=False,
    )  # fmt: skip


def test_exporters_and_protocols_hookbus_cannot_send_are_refused() -> None:
    """Before: OTEL_TRACES_EXPORTER=jaeger or the gRPC protocol were sent as OTLP/HTTP."""
    cases = [
        ({"OTEL_TRACES_EXPORTER": "jaeger"}, "OTEL_TRACES_EXPORTER=jaeger: HookBus exports "
         "otlp, console, none (Jaeger takes OTLP: otlp, with its port 4318)"),
        ({"OTEL_METRICS_EXPORTER": "prometheus"}, "OTEL_METRICS_EXPORTER=prometheus"),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x:4317", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"},
         "needs the package opentelemetry-exporter-otlp-proto-grpc"),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x:4318",
          "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/json"}, "OTLP protocol 'http/json'"),
    ]  # fmt: skip
    for env, said in cases:
        result = hookbus_run(["demo", "--embedded"], env)
        assert result.returncode == 2, (env, result.stderr)
        assert said in result.stderr and "Traceback" not in result.stderr, result.stderr


def test_a_silent_collector_does_not_hold_up_the_exit(tmp_path: Path) -> None:
    """A collector that accepts connections and never answers, with the exporters' timeout at
    60 s: the demo still exits on its own, its last spans dropped (before: the exporters'
    retries and the span processor's 30 s shutdown held it, about 35 s; with the collector
    down, 13 s). The subprocess timeout is only there to catch a hang."""
    import socket

    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(100)  # connections complete in the backlog; nothing is ever read
        port = silent.getsockname()[1]
        result = hookbus_run(
            ["demo", "--embedded"],
            {"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port}",
             "OTEL_EXPORTER_OTLP_TIMEOUT": "60"},
            timeout=30,
        )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "turn ended" in result.stdout


# -- issue 30, item 7: nothing a guard hides leaves through telemetry ---------------------------


@pytest.mark.parametrize("capture", [False, True], ids=["default", "opt-in"])
async def test_a_secret_the_hooks_redacted_never_reaches_the_exporter(capture: bool) -> None:
    """A tool's input and output hold a secret; one hook rewrites both keeping it, a later one
    redacts it. By default no span carries either; with the opt-in, the tool call's dispatch
    span carries the final (redacted) input and output. Either way every byte the exporter sent
    is free of the secret."""
    import json

    from tests.trace_redaction import REDACTED_ARGS, REDACTED_OUTPUT, SECRET

    with OTLPReceiver() as receiver:
        env = {**os.environ, **otel_env(receiver, "hookbus-agent")}
        env.pop("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", None)
        if capture:
            env["OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"] = "true"
        agent = subprocess.run(
            [sys.executable, "-m", "tests.trace_redaction"], cwd=ROOT, env=env,
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert agent.returncode == 0, agent.stderr
        assert json.loads(agent.stdout) == {"args": REDACTED_ARGS, "output": REDACTED_OUTPUT}
        names = {"dispatch PreToolUse", "dispatch PostToolUse", "hook Formatter"}
        await wait_for(lambda: names <= {s["name"] for s in receiver.spans}, what="the spans")
        spans = list(receiver.spans)
        sent = b"".join(receiver.bodies)
    check_span_table(spans)

    assert SECRET.encode() not in sent
    assert SECRET not in json.dumps(spans)
    # The hooks' rewrites are still events on their spans, without the content.
    formatter = [s for s in spans if s["name"] == "hook Formatter"]
    assert {"MutateInput", "MutateOutput"} <= {e for s in formatter for e in s["events"]}
    for s in formatter:
        for attrs in s["event_attributes"]:
            assert not {"updated_args", "updated_content"} & set(attrs), attrs
    [pre] = [s["attributes"] for s in spans if s["name"] == "dispatch PreToolUse"]
    [post] = [s["attributes"] for s in spans if s["name"] == "dispatch PostToolUse"]
    if capture:
        assert json.loads(pre["gen_ai.tool.call.arguments"]) == REDACTED_ARGS
        assert post["gen_ai.tool.call.result"] == REDACTED_OUTPUT
    else:
        assert "gen_ai.tool.call.arguments" not in pre and "gen_ai.tool.call.result" not in post


# -- issue 35, item 9: the gateway continues the caller's trace ---------------------------------


async def test_the_gateway_continues_a_traceparent_header_and_names_the_tenant(
    bus_settings: BusSettings, procs: Processes, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A decision posted with a W3C ``traceparent`` header (as an HTTP client's OpenTelemetry
    instrumentation sends it): the gateway's request span is its child, in its trace, the
    dispatch span the request's, and the hook service's span the dispatch's. Before, the header
    was ignored: a new trace."""
    from tests.test_gateway import live, start_gateway

    caller_trace, caller_span = "ab" * 16, "cd" * 8
    with OTLPReceiver() as receiver:
        for key, value in otel_env(receiver, "hookbus-gateway").items():
            monkeypatch.setenv(key, value)
        guard = procs.worker(bus_settings, "workers.builtins.demo_hooks:SecretGuard", "guard",
                             OTEL_SERVICE_NAME="hookbus-secret-guard")  # fmt: skip
        live(bus_settings, "SecretGuard")
        gateway = start_gateway(procs, bus_settings, tmp_path, tenant="acme")
        body = {"event": PRE, "context": {"session_id": "s1", "tool_name": "file_read",
                                          "tool_args": {"path": ".env"}}}  # fmt: skip
        status, reply, _ = gateway.post(
            "/v1/decisions", body, traceparent=traceparent(caller_trace, caller_span)
        )
        assert status == 200 and reply["result"]["action"]["type"] == "Block", reply
        dispatch, spans = await dispatch_continues(
            receiver, (gateway.proc, guard), "hookbus-gateway", caller_trace
        )
    [served] = [s for s in spans if s["name"] == "POST /v1/decisions"]
    assert dispatch["parent_id"] == served["span_id"]
    # the request's SERVER span (as OpenTelemetry's ASGI instrumentation makes) is the caller's
    # span's child, and the dispatch's parent
    assert served["kind"] == "SERVER" and served["service"] == "hookbus-gateway"
    assert (served["trace_id"], served["parent_id"]) == (caller_trace, caller_span)
    assert served["attributes"] == {"http.request.method": "POST", "http.route": "/v1/decisions",
                                    "http.response.status_code": 200}  # fmt: skip
    assert dispatch["attributes"]["hookbus.tenant"] == "acme"


async def dispatch_continues(
    receiver: OTLPReceiver, procs: Any, service: str, caller_trace: str
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Stop ``procs`` (a clean stop flushes their spans); then ``service``'s dispatch span
    (CLIENT, the guard's Block as its decision) is in the caller's trace, and SecretGuard's
    span (SERVER) is its child. Returns the dispatch span and every span received."""
    for proc in procs:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
    await wait_for(lambda: {"dispatch PreToolUse", "hook SecretGuard"}
                   <= {s["name"] for s in receiver.spans}, what="the spans")  # fmt: skip
    spans = list(receiver.spans)
    check_span_table(spans)
    [dispatch] = [s for s in spans if s["name"] == "dispatch PreToolUse"]
    assert dispatch["service"] == service and dispatch["kind"] == "CLIENT"
    assert dispatch["trace_id"] == caller_trace
    assert dispatch["attributes"]["hookbus.decision"] == "Block"
    [hook] = [s for s in spans if s["name"] == "hook SecretGuard"]
    assert hook["service"] == "hookbus-secret-guard" and hook["kind"] == "SERVER"
    assert (hook["trace_id"], hook["parent_id"]) == (caller_trace, dispatch["span_id"])
    return dispatch, spans


def test_the_console_shows_every_demo_hook_service_s_spans_under_its_own_name() -> None:
    """``OTEL_TRACES_EXPORTER=console make demo``: the hook services' spans are printed beside
    the agent's, each service under its own name, and the hook the agent runs in its process
    (MetricsHook) has spans too. Before, the services' output was discarded, all of them were
    ``hookbus-worker``, and a HookClient's in-process hooks had no span."""
    import re

    from agent_adapter.demo import HOOK_SERVICES

    result = hookbus_run(["demo"], {"OTEL_TRACES_EXPORTER": "console",
                                    "OTEL_METRICS_EXPORTER": "none"}, timeout=120)  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "distributed" in result.stdout or "hook services" in result.stdout, result.stdout[:500]
    services = set(re.findall(r'"service\.name": "([^"]+)"', result.stdout))
    expected = {f"hookbus-{target[0].rpartition(':')[2]}" for target in HOOK_SERVICES}
    assert {*expected, "hookbus-agent"} <= services, services
    assert '"name": "hook MetricsHook"' in result.stdout
    assert '"kind": "SpanKind.SERVER"' in result.stdout


async def test_the_coordinator_service_records_its_dispatch_span_under_the_request_s_trace(
    bus_settings: BusSettings, procs: Processes
) -> None:
    """``hookbus coordinator``: its dispatch span (CLIENT) continues the ``DecisionRequest``'s
    ``traceparent``, and the hook service's span hangs under it. Before, the service built its
    coordinator before telemetry was configured: no dispatch span, the hook's span straight
    under the agent's."""
    from redis import Redis

    from bus.events import PreToolUseContext
    from bus.protocol import DecisionRequest, encode, new_id, now_ms, raw
    from bus.transport.keys import Keys
    from tests.test_gateway import live

    caller_trace, caller_span = "ef" * 16, "12" * 8
    keys = Keys(bus_settings.prefix)
    with OTLPReceiver() as receiver:
        guard = procs.worker(bus_settings, "workers.builtins.demo_hooks:SecretGuard", "guard",
                             **otel_env(receiver, "hookbus-secret-guard"))  # fmt: skip
        live(bus_settings, "SecretGuard")
        env = worker_env(bus_settings, **otel_env(receiver, "hookbus-coordinator"))
        coordinator = procs.start(["coordinator"], env, "coordinator")
        ctx = PreToolUseContext(session_id="s1", tool_name="file_read", tool_args={"path": ".env"})
        inbox = keys.inbox(f"trace-{new_id()[:8]}")
        request = DecisionRequest(
            id=new_id(), ts=now_ms(), event=HookEvent.PRE_TOOL_USE, context=raw(ctx),
            reply_to=inbox, timeout_ms=5000, traceparent=traceparent(caller_trace, caller_span),
        )  # fmt: skip
        with Redis.from_url(bus_settings.redis_url) as r:
            r.xadd(keys.decisions(ctx.session_id), {"data": encode(request)})
            assert r.blpop([inbox], 4) is not None, "no DecisionReply"
        dispatch, _ = await dispatch_continues(
            receiver, (coordinator, guard), "hookbus-coordinator", caller_trace
        )
    assert dispatch["parent_id"] == caller_span
