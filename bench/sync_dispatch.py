"""Synchronous dispatch over Redis: one PreToolUse decision with N hook services, end to end.

One agent makes one call at a time. Each figure is the latency of one call, timed with
``time.perf_counter_ns`` in the agent's asyncio loop after a warm-up, with every process on one
private ``redis-server`` that the benchmark starts and stops. Two topologies:

agent
    The coordinator runs in the agent: ``await HookClient.run_pre_tool_use(ctx)``, N hook
    services each in its own ``hookbus worker`` process (a no-op hook answering Continue).
service
    The agent is "foreign": raw redis-py ``XADD`` of a ``DecisionRequest`` to a decisions
    partition ``{p}:decisions:{d0.0}`` and ``BLPOP`` of its inbox (a trusted agent); the
    ``hookbus coordinator`` service process dispatches to the same N ``hookbus worker``
    processes. In the same alternating batches, an **untrusted** agent of a tenant does the same
    through its tenant's keys, connected as the tenant's own Redis user (``tenant-NAME``: XADD
    to ``{p}:t:{NAME}:decisions``, BLPOP from ``{p}:t:{NAME}:inbox:*``, nothing else): what the
    tenant scoping costs, beside the trusted figure.

Beside each, the floor: the same topology hand-written on raw redis-py (``bench/floor_worker.py``)
— N floor hook processes doing ``XREADGROUP BLOCK`` → pipelined ``RPUSH`` + ``XACK``; a floor
agent doing one pipelined ``XADD`` of N requests then ``BLMPOP`` until N replies are in; and for
the service topology a floor service that does exactly what the floor agent does. Messages are
JSON of HookBus's size. The ratio says what HookBus's protocol checks, deadlines, selection,
aggregation and bookkeeping cost over the least the same round trips can cost. (HookBus also
publishes every event to ``{p}:events`` in the same pipelined round trip, for async hooks; the
floor does not, so that cost counts on HookBus's side.)

HookBus and its floor are sampled in alternating batches in the same run, so that a noisy moment
spreads over both. Each scenario has its own key prefix. A reference row times FastStream 0.7's
``RedisBroker.request()`` to a FastStream stream subscriber (1 hook): the reason the hot path
talks to redis-py directly.

Usage: ``python -m bench.sync_dispatch [--quick]``; results go to
``bench/results/sync_dispatch.json``. It starts worker processes and kills them all on exit.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import signal
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any

import msgspec
import redis as redis_py
from redis.asyncio import Redis

from agent_adapter.client import HookClient
from bench.common import (
    Children,
    Plan,
    header,
    hookbus_env,
    percentiles,
    progress,
    terminated,
    write_results,
)
from bench.floor_worker import fan_out, hook_reply, hook_request, requests_key
from bus.actions import CONTINUE, Continue, PreToolUseAction
from bus.events import HookEvent, PreToolUseContext
from bus.hooks import AgentHook
from bus.protocol import DecisionRequest, HookReply, HookRequest, encode, new_id, now_ms, raw
from bus.settings import BusSettings, HookSettings
from bus.transport.keys import Keys
from workers.cli.common import freeze_start_up_heap
from workers.local.redis_server import RedisServer

HOOK_COUNTS = (1, 3, 8)
TARGET_HOOKS = (1, 3)
TARGET_RATIOS = {"agent": 1.3, "service": 1.2}  # p50 at most this times the floor's, per topology
MODULE = "bench.sync_dispatch"  # what worker processes import the hooks from (not __main__)
RESULTS = Path(__file__).resolve().parent / "results" / "sync_dispatch.json"
START_TIMEOUT = 30.0  # seconds for worker processes to come up
CALL_TIMEOUT = 5  # seconds an agent waits for one answer before the run fails


FULL = Plan(warmup=300, rounds=10, batch=200)
QUICK = Plan(warmup=20, rounds=2, batch=50)


# -- the hooks: one class per worker process, each with its own name ------------------------


class NoopHook(AgentHook):
    """Answers Continue to PreToolUse without awaiting anything."""

    name = "bench-noop"
    subscribed_events = (HookEvent.PRE_TOOL_USE,)

    async def pre_tool_use(self, ctx: PreToolUseContext) -> PreToolUseAction:
        return CONTINUE


def _numbered(i: int) -> type[NoopHook]:
    return type(f"Noop{i}", (NoopHook,), {"name": f"bench-noop-{i}", "__module__": MODULE})


Noop1 = _numbered(1)
Noop2 = _numbered(2)
Noop3 = _numbered(3)
Noop4 = _numbered(4)
Noop5 = _numbered(5)
Noop6 = _numbered(6)
Noop7 = _numbered(7)
Noop8 = _numbered(8)
NOOPS = (Noop1, Noop2, Noop3, Noop4, Noop5, Noop6, Noop7, Noop8)


def context() -> PreToolUseContext:
    """A PreToolUse context with a small tool_args, as an agent would send."""
    return PreToolUseContext(
        session_id="bench-session-0001",
        tool_name="file_read",
        tool_args={"path": "src/app/main.py", "limit": 200},
        step=3,
    )


# -- child processes -------------------------------------------------------------------------


def _dying_with_us(binary: str, where: Path) -> str:
    """A wrapper that execs ``binary`` after the same PR_SET_PDEATHSIG request as BOOT's."""
    if sys.platform != "linux":
        return binary
    wrapper = where / "redis-server"
    wrapper.write_text(
        f"#!{sys.executable}\n"
        "import ctypes, os, signal, sys\n"
        "try:\n"
        "    ctypes.CDLL(None).prctl(1, signal.SIGKILL)\n"
        "except Exception:\n"
        "    pass\n"
        f"os.execv({binary!r}, [{binary!r}, *sys.argv[1:]])\n"
    )
    wrapper.chmod(0o755)
    return str(wrapper)


# -- timing ----------------------------------------------------------------------------------

Call = Callable[[], Awaitable[Any]]


async def time_calls(call: Call, n: int) -> list[int]:
    """Nanoseconds of each of ``n`` calls ``await call()``."""
    clock = time.perf_counter_ns
    samples: list[int] = []
    append = samples.append
    for _ in range(n):
        t0 = clock()
        await call()
        append(clock() - t0)
    return samples


async def alternate(plan: Plan, calls: dict[str, Call]) -> dict[str, list[int]]:
    """Warm every call up, then time them in alternating batches."""
    for call in calls.values():
        await time_calls(call, plan.warmup)
    freeze_start_up_heap()  # as a long-running agent host should (docs/performance.md)
    samples: dict[str, list[int]] = {label: [] for label in calls}
    for _ in range(plan.rounds):
        for label, call in calls.items():
            samples[label] += await time_calls(call, plan.batch)
    return samples


def quantiles(samples: list[int], points: int = 100) -> list[float]:
    """Microseconds at quantiles 0, 1/points, …, 1 (nearest rank): a CDF to plot, compactly."""
    ordered = sorted(samples)
    n = len(ordered)
    if not n:
        return []
    return [
        round(ordered[min(n - 1, max(0, math.ceil(q / points * n) - 1))] / 1000, 1)
        for q in range(points + 1)
    ]


def round_ratios(ours: list[int], floor: list[int], batch: int) -> dict[str, float]:
    """Min, median and max over the alternating batches of (our p50 / the floor's p50)."""
    ratios = []
    for start in range(0, min(len(ours), len(floor)), batch):
        p50, _ = percentiles(ours[start : start + batch])
        f50, _ = percentiles(floor[start : start + batch])
        ratios.append(p50 / f50 if f50 > 0 else math.inf)
    ratios.sort()
    if not ratios:
        return {}
    return {
        "min": round(ratios[0], 2),
        "median": round(ratios[len(ratios) // 2], 2),
        "max": round(ratios[-1], 2),
    }


def _ratio(a: float, b: float) -> float:
    return round(a / b, 2) if b > 0 else math.inf


def _check(condition: bool, what: str) -> None:
    if not condition:
        raise RuntimeError(f"benchmark set-up is wrong: {what}")


async def wait_until(
    condition: Callable[[], Awaitable[bool]], children: Children, what: str
) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        children.check()
        if await condition():
            return
        await asyncio.sleep(0.02)
    raise RuntimeError(f"timed out after {START_TIMEOUT:g}s waiting for {what}")


async def wait_ready(redis: Redis, prefix: str, count: int, children: Children) -> None:
    """Wait for ``count`` floor processes to push their name to ``{prefix}:ready``."""
    seen = 0

    async def more() -> bool:
        nonlocal seen
        while await redis.lpop(f"{prefix}:ready"):
            seen += 1
        return seen >= count

    await wait_until(more, children, f"{count} floor processes under {prefix!r}")


# -- the agents ------------------------------------------------------------------------------


class Answer(msgspec.Struct):
    """What an agent reads of any reply."""

    request_id: str
    status: str = "ok"
    result: Any = None


_answer = msgspec.json.Decoder(Answer).decode


class FloorAgent:
    """Raw redis-py, coordinator in the agent: one pipelined XADD of N requests, then BLMPOP."""

    def __init__(self, redis: Redis, prefix: str, names: list[str]) -> None:
        self.redis = redis
        self.names = names
        self.streams = [requests_key(prefix, n) for n in names]
        self.inbox = f"{prefix}:inbox:floor-agent-{os.getpid()}"
        self.session = context().session_id
        self.context = raw(context())

    async def __call__(self) -> int:
        ids: list[str] = []
        payloads: list[bytes] = []
        for name in self.names:
            request_id, payload = hook_request(name, self.session, self.context, self.inbox)
            ids.append(request_id)
            payloads.append(payload)
        return await fan_out(self.redis, self.inbox, self.streams, payloads, ids)


class ForeignAgent:
    """An agent in any language: XADD one decision request, BLPOP the reply from its inbox."""

    def __init__(
        self,
        redis: Redis,
        prefix: str,
        make: Callable[[str], tuple[str, bytes]],
        decisions: str | None = None,
        inbox: str | None = None,
    ):
        self.redis = redis
        self.decisions = decisions or f"{prefix}:decisions"
        self.inbox = inbox or f"{prefix}:inbox:agent-{os.getpid()}"
        self.make = make

    async def __call__(self) -> Answer:
        request_id, payload = self.make(self.inbox)
        await self.redis.xadd(self.decisions, {"data": payload})
        popped: Any = await self.redis.blpop([self.inbox], timeout=CALL_TIMEOUT)
        if popped is None:
            raise TimeoutError(f"no decision within {CALL_TIMEOUT}s on {self.inbox}")
        answer = _answer(popped[1])
        if answer.request_id != request_id or answer.status != "ok":
            raise RuntimeError(f"unexpected decision reply {popped[1]!r}")
        return answer


def hookbus_decision(ctx: msgspec.Raw) -> Callable[[str], tuple[str, bytes]]:
    def make(inbox: str) -> tuple[str, bytes]:
        request = DecisionRequest(
            id=new_id(),
            ts=now_ms(),
            event=HookEvent.PRE_TOOL_USE,
            context=ctx,
            reply_to=inbox,
            timeout_ms=CALL_TIMEOUT * 1000,
        )
        return request.id, encode(request)

    return make


def floor_decision(ctx: msgspec.Raw) -> Callable[[str], tuple[str, bytes]]:
    encoder = msgspec.json.Encoder()

    def make(inbox: str) -> tuple[str, bytes]:
        request_id = os.urandom(16).hex()
        return request_id, encoder.encode(
            {
                "v": 1,
                "id": request_id,
                "ts": 0,
                "traceparent": "",
                "tracestate": "",
                "event": "PreToolUse",
                "context": ctx,
                "reply_to": inbox,
                "timeout_ms": CALL_TIMEOUT * 1000,
            }
        )

    return make


def payload_sizes() -> dict[str, int]:
    """Bytes on the wire of each message, HookBus's and the floor's, for one hook."""
    ctx, name, inbox = context(), NOOPS[0].name, "bench-hb1:inbox:host-12345-abcdef"
    request = HookRequest(
        id=new_id(),
        ts=now_ms(),
        hook=name,
        event=HookEvent.PRE_TOOL_USE,
        session_id=ctx.session_id,
        context=raw(ctx),
        deadline=now_ms(),
        reply_to=inbox,
    )
    reply = HookReply(
        id=new_id(), ts=now_ms(), request_id=request.id, hook=name, replica="host-123-abcd"
    )
    return {
        "hookbus_request": len(encode(request)),
        "hookbus_reply": len(encode(msgspec.structs.replace(reply, action=CONTINUE))),
        "hookbus_decision_request": len(hookbus_decision(raw(ctx))(inbox)[1]),
        "floor_request": len(hook_request(name, ctx.session_id, raw(ctx), inbox)[1]),
        "floor_reply": len(hook_reply(request.id, name, "floor-12345")),
        "floor_decision_request": len(floor_decision(raw(ctx))(inbox)[1]),
    }


# -- one hook count --------------------------------------------------------------------------


def summary(
    hooks: int, ours: list[int], floor: list[int], batch: int, tenant: list[int] | None = None
) -> dict[str, Any]:
    """One row: percentiles and ratio, the spread of the ratio over the alternating batches,
    and 101 quantiles of each series (for CDF plots: ``bench.plots``); with ``tenant`` (the
    service topology), the untrusted agent's figures beside the trusted ones."""
    p50, p99 = percentiles(ours)
    f50, f99 = percentiles(floor)
    row = {
        "hooks": hooks,
        "hookbus_p50_us": round(p50, 1),
        "hookbus_p99_us": round(p99, 1),
        "floor_p50_us": round(f50, 1),
        "floor_p99_us": round(f99, 1),
        "ratio_p50": _ratio(p50, f50),
        "ratio_p50_per_batch": round_ratios(ours, floor, batch),
        "quantiles_us": {"hookbus": quantiles(ours), "floor": quantiles(floor)},
    }
    if tenant:
        t50, t99 = percentiles(tenant)
        row |= {
            "tenant_p50_us": round(t50, 1),
            "tenant_p99_us": round(t99, 1),
            "tenant_vs_trusted_p50": _ratio(t50, p50),
            "tenant_vs_trusted_p50_per_batch": round_ratios(tenant, ours, batch),
            "tenant_ratio_p50": _ratio(t50, f50),
        }
        row["quantiles_us"]["tenant"] = quantiles(tenant)
    return row


class Scenario:
    """One hook count: N hookbus workers and N floor workers on their own prefixes."""

    def __init__(self, n: int, url: str, redis: Redis, children: Children) -> None:
        self.n = n
        self.url = url
        self.redis = redis
        self.children = children
        self.hb_prefix = f"bench-hb{n}"
        self.hb_keys = Keys(self.hb_prefix)
        self.tenant = f"bench-tenant{n}"
        self.floor_prefix = f"bench-floor{n}"
        self.hooks = NOOPS[:n]
        self.names = [h.name for h in self.hooks]
        self.labels: list[str] = []

    def _spawn(
        self, label: str, module: str, args: list[str], env: dict[str, str] | None = None
    ) -> None:
        self.children.start(label, module, args, env)
        self.labels.append(label)

    def start_workers(self) -> None:
        env = hookbus_env(self.url, self.hb_prefix)
        for hook in self.hooks:
            target = f"{MODULE}:{hook.__name__}"
            self._spawn(f"hb{self.n}-{hook.name}", "workers.cli", ["worker", target], env)
        for name in self.names:
            self._spawn(
                f"floor{self.n}-{name}",
                "bench.floor_worker",
                ["worker", self.url, self.floor_prefix, name],
            )

    def stop(self, labels: list[str] | None = None) -> None:
        chosen = self.labels if labels is None else labels
        self.children.stop([label for label in chosen if label in self.children.procs])
        self.labels = [label for label in self.labels if label not in chosen]

    async def agent_topology(self, plan: Plan, faststream: bool) -> tuple[dict[str, Any], Any]:
        settings = BusSettings(redis_url=self.url, prefix=self.hb_prefix)
        client = await HookClient(settings, HookSettings(hook_timeout_secs=10)).start()
        reference = None
        broker: Any = None
        try:

            async def live() -> bool:
                by_name = client.directory.by_name
                return all(n in by_name and by_name[n].replicas >= 1 for n in self.names)

            await wait_until(live, self.children, f"{self.n} hookbus workers to be live")
            await wait_ready(self.redis, self.floor_prefix, self.n, self.children)
            progress(f"{self.n} hook(s): workers up; validating the agent topology")

            ctx = context()
            result = await client.run_pre_tool_use(ctx)
            _check(
                isinstance(result.action, Continue) and not result.skipped,
                f"HookClient answered {result}",
            )
            outcomes = await client.gather(HookEvent.PRE_TOOL_USE, ctx)
            _check(len(outcomes) == self.n, f"{len(outcomes)} hooks answered, not {self.n}")
            floor = FloorAgent(self.redis, self.floor_prefix, self.names)
            _check(await floor() == self.n, "the floor agent did not collect every reply")

            async def hookbus() -> Any:
                return await client.run_pre_tool_use(ctx)

            calls: dict[str, Call] = {"hookbus": hookbus, "floor": floor}
            if faststream:
                broker, request = await self._faststream(ctx)
                calls["faststream"] = request

            progress(
                f"{self.n} hook(s), agent topology: timing "
                f"{plan.warmup} warm-up + {plan.samples} calls each of {', '.join(calls)}"
            )
            samples = await alternate(plan, calls)
        finally:
            await client.close()
            if broker is not None:
                await broker.stop()
            self.stop([label for label in self.labels if label.startswith("fs")])
        row = summary(self.n, samples["hookbus"], samples["floor"], plan.batch)
        progress(self._line(row))
        if "faststream" in samples:
            p50, p99 = percentiles(samples["faststream"])
            reference = {
                "what": "FastStream 0.7 RedisBroker.request() to a FastStream stream subscriber",
                "hooks": self.n,
                "p50_us": round(p50, 1),
                "p99_us": round(p99, 1),
                "floor_p50_us": row["floor_p50_us"],
                "ratio_p50": _ratio(p50, row["floor_p50_us"]),
                "quantiles_us": quantiles(samples["faststream"]),
            }
            progress(f"FastStream request(), 1 hook: p50 {p50:.0f} µs, p99 {p99:.0f} µs")
        return row, reference

    async def _faststream(self, ctx: PreToolUseContext) -> tuple[Any, Call]:
        """A FastStream subscriber process and the broker that requests it (reference row)."""
        from faststream.redis import RedisBroker

        prefix = f"bench-fs{self.n}"
        name = self.names[0]
        label = f"fs{self.n}-{name}"
        self._spawn(label, "bench.floor_worker", ["faststream", self.url, prefix, name])
        await wait_ready(self.redis, prefix, 1, self.children)
        broker = RedisBroker(self.url)
        await broker.connect()
        stream = requests_key(prefix, name)
        template = msgspec.json.decode(hook_request(name, ctx.session_id, raw(ctx), "")[1])

        async def request() -> Any:
            body = {**template, "id": new_id(), "ts": now_ms()}
            return await broker.request(body, stream=stream, timeout=CALL_TIMEOUT)

        reply = await request()
        _check(b"Continue" in bytes(reply.body), f"FastStream answered {reply.body!r}")
        return broker, request

    async def tenant_client(self) -> Redis:
        """A connection as the tenant's own Redis user, which the operator registered: it may
        only XADD to the tenant's decisions stream and pop the tenant's inboxes (the rules of
        ``tenant-NAME`` in docs/security.md)."""
        password = new_id()
        own = f"{self.hb_prefix}:t:{{{self.tenant}}}"
        await self.redis.sadd(self.hb_keys.tenants, self.tenant)
        await self.redis.execute_command(
            "ACL", "SETUSER", f"tenant-{self.tenant}", "reset", f">{password}", "on",
            "resetchannels", "-@all", "+ping", f"(%W~{own}:decisions +xadd)",
            f"(~{own}:inbox:* +blpop +blmpop)",
        )  # fmt: skip
        kwargs = self.redis.connection_pool.connection_kwargs
        return Redis(
            host=kwargs.get("host", "127.0.0.1"),
            port=kwargs.get("port", 6379),
            username=f"tenant-{self.tenant}",
            password=password,
            socket_connect_timeout=2,
        )

    async def service_topology(self, plan: Plan) -> dict[str, Any]:
        hb_label = f"hb{self.n}-coordinator"
        floor_label = f"floor{self.n}-service"
        as_tenant = await self.tenant_client()  # registered before the service starts
        self._spawn(hb_label, "workers.cli", ["coordinator"], hookbus_env(self.url, self.hb_prefix))
        self._spawn(
            floor_label,
            "bench.floor_worker",
            ["service", self.url, self.floor_prefix, *self.names],
        )
        decisions = self.hb_keys.decision_partitions[0]

        async def group_exists() -> bool:
            try:
                groups = await self.redis.xinfo_groups(decisions)
            except redis_py.ResponseError:
                return False
            return any(g["name"] in (b"coordinators", "coordinators") for g in groups)

        await wait_until(group_exists, self.children, "the hookbus coordinator service")
        await wait_ready(self.redis, self.floor_prefix, 1, self.children)
        progress(f"{self.n} hook(s): services up; validating the service topology")

        ctx_raw = raw(context())
        hookbus = ForeignAgent(
            self.redis,
            self.hb_prefix,
            hookbus_decision(ctx_raw),
            self.hb_keys.decision_partitions[0],
        )
        floor = ForeignAgent(self.redis, self.floor_prefix, floor_decision(ctx_raw))
        tenant = ForeignAgent(
            as_tenant,
            self.hb_prefix,
            hookbus_decision(ctx_raw),
            self.hb_keys.tenant_decisions(self.tenant),
            self.hb_keys.tenant_inbox(self.tenant, f"agent-{os.getpid()}"),
        )
        streams = [self.hb_keys.requests(n) for n in self.names]
        try:
            for agent in (hookbus, tenant):
                before = [await self.redis.xlen(s) for s in streams]
                answer = await agent()
                after = [await self.redis.xlen(s) for s in streams]
                result = answer.result or {}
                _check(
                    result.get("action", {}).get("type") == "Continue"
                    and not result.get("skipped"),
                    f"the coordinator service answered {result} on {agent.decisions}",
                )
                _check(
                    [b - a for a, b in zip(before, after, strict=True)] == [1] * self.n,
                    f"the coordinator service did not ask every hook for {agent.decisions}",
                )
            answer = await floor()
            _check(answer.result["hooks"] == self.n, f"the floor service answered {answer}")

            progress(
                f"{self.n} hook(s), service topology: timing "
                f"{plan.warmup} warm-up + {plan.samples} calls each of hookbus, floor, tenant"
            )
            samples = await alternate(plan, {"hookbus": hookbus, "floor": floor, "tenant": tenant})
        finally:
            await as_tenant.aclose()
        self.stop([hb_label, floor_label])
        row = summary(self.n, samples["hookbus"], samples["floor"], plan.batch, samples["tenant"])
        progress(self._line(row))
        return row

    @staticmethod
    def _line(row: dict[str, Any]) -> str:
        line = (
            f"  -> hookbus p50 {row['hookbus_p50_us']:.0f} µs p99 {row['hookbus_p99_us']:.0f} µs;"
            f" floor p50 {row['floor_p50_us']:.0f} µs p99 {row['floor_p99_us']:.0f} µs;"
            f" {row['ratio_p50']:.2f}x"
        )
        if "tenant_p50_us" in row:
            line += (
                f"; untrusted tenant p50 {row['tenant_p50_us']:.0f} µs p99"
                f" {row['tenant_p99_us']:.0f} µs, {row['tenant_vs_trusted_p50']:.2f}x trusted"
            )
        return line


# -- the run ---------------------------------------------------------------------------------

TOPOLOGIES = {
    "agent": "coordinator in the agent: await HookClient.run_pre_tool_use(ctx); floor: one "
    "pipelined XADD of N requests, BLMPOP until N replies",
    "service": "foreign agent: XADD a DecisionRequest to {p}:decisions:{d0.0}, BLPOP its inbox; "
    "hookbus coordinator service vs a floor service that fans out like the floor agent; beside "
    "it, an untrusted agent of a tenant through {p}:t:{NAME}:decisions and its tenant's inbox, "
    "as the tenant's own Redis user",
}


def _target(rows: list[dict[str, Any]], max_ratio: float) -> dict[str, Any]:
    ratios = {r["hooks"]: r["ratio_p50"] for r in rows if r["hooks"] in TARGET_HOOKS}
    return {
        "hooks": list(TARGET_HOOKS),
        "max_ratio_p50": max_ratio,
        "ratios": {str(k): v for k, v in ratios.items()},
        "met": all(v <= max_ratio for v in ratios.values()),
    }


async def run(plan: Plan, url: str, children: Children, reference: bool) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    # No socket timeout: the floor agent uses raw redis-py at its cheapest (see floor_worker.py).
    redis = Redis.from_url(url, socket_connect_timeout=2)
    try:
        info = await redis.info("server")
        rows: dict[str, list[dict[str, Any]]] = {"agent": [], "service": []}
        ref = None
        for n in HOOK_COUNTS:
            scenario = Scenario(n, url, redis, children)
            progress(f"{n} hook(s): starting {n} hookbus worker(s) and {n} floor worker(s)")
            scenario.start_workers()
            try:
                row, found = await scenario.agent_topology(plan, reference and n == 1)
                rows["agent"].append(row)
                ref = ref or found
                rows["service"].append(await scenario.service_topology(plan))
            finally:
                scenario.stop()
    finally:
        await redis.aclose()
    return {
        **header("sync_dispatch", plan is QUICK),
        "event_loop": f"{type(loop).__module__}.{type(loop).__name__}",
        "redis_server": str(info.get("redis_version", "?")),
        "redis_py": redis_py.__version__,
        "hiredis": _hiredis(),
        "warmup_calls": plan.warmup,
        "samples_per_point": plan.samples,
        "payload_bytes": payload_sizes(),
        "topologies": {
            name: {
                "description": TOPOLOGIES[name],
                "results": rows[name],
                "target": _target(rows[name], TARGET_RATIOS[name]),
            }
            for name in ("agent", "service")
        },
        "reference": ref,
    }


def _hiredis() -> str | None:
    """The hiredis version redis-py parses replies with, or None (pure-Python parser)."""
    from redis.utils import HIREDIS_AVAILABLE

    if not HIREDIS_AVAILABLE:
        return None
    import hiredis

    return str(getattr(hiredis, "__version__", "?"))


def render(report: dict[str, Any]) -> str:
    lines = [
        f"sync dispatch over Redis: one agent, sequential PreToolUse calls, no-op hooks "
        f"(Python {report['python']}, redis-server {report['redis_server']}, redis-py "
        f"{report['redis_py']}, hiredis {report['hiredis'] or 'no'}, {report['cpus']} CPUs, "
        f"{report['samples_per_point']} samples per point{', QUICK' if report['quick'] else ''})",
        "per batch: the range over the alternating batches of hookbus p50 / floor p50",
    ]
    for name, topo in report["topologies"].items():
        lines += [
            "",
            f"topology {name}: {topo['description']}",
            f"{'hooks':>5}  {'hookbus p50 µs':>14}  {'p99 µs':>8}  {'floor p50 µs':>12}  "
            f"{'p99 µs':>8}  {'ratio p50':>9}  {'per batch':>11}",
        ]
        for r in topo["results"]:
            spread = r.get("ratio_p50_per_batch") or {}
            lines.append(
                f"{r['hooks']:>5}  {r['hookbus_p50_us']:>14.1f}  {r['hookbus_p99_us']:>8.1f}  "
                f"{r['floor_p50_us']:>12.1f}  {r['floor_p99_us']:>8.1f}  {r['ratio_p50']:>8.2f}x"
                + (f"  {spread['min']:.2f}-{spread['max']:.2f}x" if spread else "")
            )
        tenants = [r for r in topo["results"] if "tenant_p50_us" in r]
        if tenants:
            lines.append(
                f"{'hooks':>5}  {'untrusted p50 µs':>16}  {'p99 µs':>8}  {'vs trusted p50':>14}  "
                f"{'per batch':>11}  {'vs floor p50':>12}"
            )
        for r in tenants:
            spread = r.get("tenant_vs_trusted_p50_per_batch") or {}
            lines.append(
                f"{r['hooks']:>5}  {r['tenant_p50_us']:>16.1f}  {r['tenant_p99_us']:>8.1f}  "
                f"{r['tenant_vs_trusted_p50']:>13.2f}x  "
                + (f"{spread['min']:.2f}-{spread['max']:.2f}x" if spread else "")
                + f"  {r['tenant_ratio_p50']:>11.2f}x"
            )
        t = topo["target"]
        verdict = "HOLDS" if t["met"] else "DOES NOT HOLD"
        detail = ", ".join(f"{k} hook(s): {v:.2f}x" for k, v in t["ratios"].items())
        lines.append(
            f"target: p50 at most {t['max_ratio_p50']:g}x the floor for "
            f"{' and '.join(map(str, t['hooks']))} hooks -> {verdict} ({detail})"
        )
    ref = report.get("reference")
    if ref:
        lines += [
            "",
            f"reference: {ref['what']}, {ref['hooks']} hook: p50 {ref['p50_us']:.1f} µs, "
            f"p99 {ref['p99_us']:.1f} µs ({ref['ratio_p50']:.2f}x the raw floor)",
        ]
    return "\n".join(lines)


def run_benchmark(
    results: Path,
    render: Callable[[dict[str, Any]], str],
    run: Callable[[str, Children], Coroutine[Any, Any, dict[str, Any]]],
) -> int:
    """Start a private redis-server, ``run(url, children)``, stop everything, report."""
    previous = signal.signal(signal.SIGTERM, terminated)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="hookbus-bench-") as logdir:
        children = Children(Path(logdir))
        server = RedisServer()
        server.binary = _dying_with_us(server.binary, Path(logdir))
        try:
            server.start()
            progress(f"redis-server on port {server.port}; logs of the workers in {logdir}")
            report = asyncio.run(run(server.url, children))
        finally:
            children.stop()
            server.close()
            signal.signal(signal.SIGTERM, previous)
    progress(f"done in {time.monotonic() - started:.0f} s")
    print(render(report), flush=True)
    write_results(results, report)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.sync_dispatch", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="few iterations (smoke test)")
    parser.add_argument(
        "--no-faststream", action="store_true", help="skip the FastStream reference row"
    )
    args = parser.parse_args(argv)
    plan = QUICK if args.quick else FULL
    return run_benchmark(
        RESULTS, render, lambda url, children: run(plan, url, children, not args.no_faststream)
    )


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
