"""``hookbus mcp`` end to end, with real parts only: the official MCP SDK's client, ``hookbus
mcp`` as a process, the reference MCP filesystem server (npm, tests/mcp_server, installed by
``make node-deps``) behind it, a real Redis and real hook workers (SecretGuard over MCP tool
names, the demo's Redactor)."""

from __future__ import annotations

import contextlib
import json
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import mcp_types as types
import pytest
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

from agent_adapter.client import HookClient
from agent_adapter.integrations.mcp_proxy import McpProxy, upstream_stdio
from bus import HookRegistry
from bus.settings import BusSettings
from bus.transport.keys import Keys
from tests.harness import ROOT, wait_for, wait_live, worker_env
from tests.mcp_hooks import TextOnlyRedactor
from tests.test_gateway import new_token
from workers.local.redis_server import RedisServer, free_port

pytestmark = pytest.mark.redis

SERVER = ROOT / "tests" / "mcp_server" / "node_modules" / ".bin" / "mcp-server-filesystem"
NOTES = "first line\nAPI_KEY=sk-live-0123456789\nlast line\n"


@pytest.fixture
def server_bin() -> Path:
    if not SERVER.exists():
        pytest.fail(f"{SERVER} is missing: run `make node-deps` (needs Node.js >= 20 and npm)")
    return SERVER


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    allowed = tmp_path / "allowed"
    allowed.mkdir()
    (allowed / "notes.txt").write_text(NOTES)
    (allowed / ".env").write_text("API_KEY=sk-live-0123456789\n")
    (allowed / "hello.txt").write_text("hello, world\n")
    return allowed


def _params(command: list[str], settings: BusSettings | None) -> StdioServerParameters:
    # stdio_client gives the server a minimal environment: HOOKBUS_* passed explicitly.
    env = worker_env(settings) if settings is not None else None
    return StdioServerParameters(command=command[0], args=command[1:], env=env, cwd=str(ROOT))


def proxy_command(server: Path, folder: Path) -> list[str]:
    proxy = [sys.executable, "-m", "workers.cli", "mcp", "--name", "filesystem"]
    return [*proxy, "--", str(server), str(folder)]


@contextlib.asynccontextmanager
async def session(
    command: list[str], settings: BusSettings | None = None
) -> AsyncIterator[ClientSession]:
    async with (
        stdio_client(_params(command, settings)) as (read, write),
        ClientSession(read, write) as client,
    ):
        await client.initialize()
        await client.list_tools()  # the client validates structuredContent with the schemas
        yield client


def wire(result: Any) -> str:
    return json.dumps(result.model_dump(mode="json", by_alias=True, exclude_none=True))


def text_of(result: Any) -> str:
    return "\n".join(block.text for block in result.content if block.type == "text")


async def start_hooks(procs: Any, settings: BusSettings) -> None:
    procs.worker(settings, "workers.builtins.mcp_guards:McpSecretGuard", "guard")
    procs.worker(settings, "workers.builtins.demo_hooks:Redactor", "redactor")
    async with HookClient(settings) as client:
        await wait_live(client, "McpSecretGuard", "Redactor")


async def test_hooks_decide_every_tool_call(
    bus_settings: BusSettings, procs: Any, server_bin: Path, folder: Path
) -> None:
    await start_hooks(procs, bus_settings)
    direct = [str(server_bin), str(folder)]
    async with (
        session(proxy_command(server_bin, folder), bus_settings) as proxied,
        session(direct) as plain,
    ):
        # tools/list passes through: names as the server gives them (the same JSON; the SDK's
        # models may write an input schema's keys in another order)
        listed = json.loads(wire(await proxied.list_tools()))
        assert listed == json.loads(wire(await plain.list_tools()))
        assert "read_text_file" in [tool["name"] for tool in listed["tools"]]

        # a read of .env: refused by SecretGuard (mcp__filesystem__read_text_file), with the
        # reason, as a tool result the model sees
        refused = await proxied.call_tool("read_text_file", {"path": str(folder / ".env")})
        assert refused.is_error
        assert "McpSecretGuard: .env files hold secrets" in text_of(refused)
        assert "mcp__filesystem__read_text_file" in text_of(refused)
        assert "sk-live" not in wire(refused)
        assert refused.structured_content is None

        # a secret in a file: redacted in the text block and in structuredContent, the other
        # lines intact
        redacted = await proxied.call_tool("read_text_file", {"path": str(folder / "notes.txt")})
        want = "first line\nAPI_KEY=[redacted]\nlast line\n"
        assert not redacted.is_error
        assert redacted.content[0].text == want
        assert redacted.structured_content == {"content": want}
        assert "sk-live" not in wire(redacted)

        # a write outside the allowed folder: refused by the server itself, passed through
        outside = folder.parent / "outside.txt"
        args = {"path": str(outside), "content": "x"}
        denied = await proxied.call_tool("write_file", args)
        assert denied.is_error
        assert "Access denied - path outside allowed directories" in text_of(denied)
        assert wire(denied) == wire(await plain.call_tool("write_file", args))
        assert not outside.exists()

        # benign calls: the result byte for byte as the server gives it
        for name, args in [
            ("read_text_file", {"path": str(folder / "hello.txt")}),
            ("list_directory", {"path": str(folder)}),
            ("list_allowed_directories", {}),
        ]:
            assert wire(await proxied.call_tool(name, args)) == wire(
                await plain.call_tool(name, args)
            )

    # the MCP session was OnSessionStart … OnSessionStop on the bus
    keys = Keys.of(bus_settings)

    async def session_events() -> bool:
        async with HookClient(bus_settings) as client:
            seen = b""
            for stream in keys.event_partitions:
                for _, fields in await client.redis.xrange(stream):
                    seen += b"".join(fields.values())
        return b"OnSessionStart" in seen and b"OnSessionStop" in seen

    await wait_for(session_events, what="OnSessionStart and OnSessionStop on the events streams")


async def test_redis_stopped_mid_session_leaves_each_call_to_its_hooks_policies(
    procs: Any, server_bin: Path, folder: Path
) -> None:
    """Redis stops: every hook a call selects is unreachable and its failure policy decides,
    as for any unreachable hook (the proxy does not ask Redis first). A read of .env, which
    McpSecretGuard ("fail") would see, is refused; a read it would not see goes to the server,
    and its output is withheld (the Redactor did not answer on it); a write no PreToolUse hook
    matches is not held back by one."""
    with RedisServer() as redis:
        settings = BusSettings(
            redis_url=redis.url,
            prefix="mcpdown",
            heartbeat_secs=0.2,
            liveness_secs=1.0,
            claim_idle_secs=0.5,
            refresh_secs=0.2,
        )
        await start_hooks(procs, settings)
        async with session(proxy_command(server_bin, folder), settings) as proxied:
            hello = {"path": str(folder / "hello.txt")}
            assert text_of(await proxied.call_tool("read_text_file", hello)) == "hello, world\n"
            redis.stop()
            refused = await proxied.call_tool("read_text_file", {"path": str(folder / ".env")})
            assert refused.is_error and "McpSecretGuard" in text_of(refused), wire(refused)
            assert "unreachable" in text_of(refused)
            for name, args in [
                ("read_text_file", hello),
                ("read_text_file", {"path": str(folder / "notes.txt")}),
                ("write_file", {"path": str(folder / "new.txt"), "content": "x"}),
            ]:
                result = await proxied.call_tool(name, args)
                assert result.is_error, (name, wire(result))
                assert "[output withheld by HookBus" in text_of(result), wire(result)
                assert "Redactor" in text_of(result)
                assert "hello, world" not in wire(result)
                assert "sk-live" not in wire(result)
            assert (folder / "new.txt").read_text() == "x"  # no "fail" hook for it


async def test_unreachable_hooks_refuse(
    bus_settings: BusSettings, procs: Any, server_bin: Path, folder: Path
) -> None:
    """A guard whose policy is "fail" gone: its call refused. A PostToolUse hook gone (the
    Redactor, policy "ignore"): the output withheld, not shown unredacted."""
    await start_hooks(procs, bus_settings)
    guard, redactor = procs.procs
    command = proxy_command(server_bin, folder)
    env = {**worker_env(bus_settings), "HOOK_TIMEOUT_SECS": "2"}  # a bound, not a sync point
    params = StdioServerParameters(command=command[0], args=command[1:], env=env, cwd=str(ROOT))
    async with (
        HookClient(bus_settings) as watcher,
        stdio_client(params) as (read, write),
        ClientSession(read, write) as proxied,
    ):
        await proxied.initialize()
        await proxied.list_tools()
        for proc in (guard, redactor):
            proc.kill()
            proc.wait()

        def gone() -> bool:
            by_name = watcher.directory.by_name
            return all(
                by_name.get(n) is None or by_name[n].replicas == 0
                for n in ("McpSecretGuard", "Redactor")
            )

        await wait_for(gone, what="the killed hooks to leave the directory")
        refused = await proxied.call_tool("read_text_file", {"path": str(folder / ".env")})
        assert refused.is_error
        assert "McpSecretGuard" in text_of(refused)
        assert "sk-live" not in wire(refused)
        withheld = await proxied.call_tool("read_text_file", {"path": str(folder / "notes.txt")})
        assert withheld.is_error
        assert "[output withheld by HookBus" in text_of(withheld)
        assert "Redactor" in text_of(withheld)
        assert "sk-live" not in wire(withheld)


async def test_rewrite_permission_and_cancel(
    bus_settings: BusSettings, procs: Any, server_bin: Path, folder: Path
) -> None:
    """MutateInput: the server gets the rewritten arguments; PermissionRequired that nobody
    allows: denied with the reason; ``hookbus cancel``: that call and every later one refused,
    OnSessionStop ``Cancelled``."""
    procs.worker(bus_settings, "tests.mcp_hooks:McpNotesFolder", "notes")
    procs.worker(bus_settings, "workers.builtins.cancellation:RedisCancellationHook", "cancel")
    (folder / "notes").mkdir()
    sid = f"mcp-test-{uuid.uuid4().hex[:8]}"
    command = proxy_command(server_bin, folder)
    command[command.index("--") : command.index("--")] = ["--session", sid]
    async with HookClient(bus_settings) as watcher:
        await wait_live(watcher, "McpNotesFolder", "CancellationHook")
        async with session(command, bus_settings) as proxied:
            wrote = await proxied.call_tool(
                "write_file", {"path": str(folder / "a.txt"), "content": "hi"}
            )
            assert not wrote.is_error, wire(wrote)
            assert (folder / "notes" / "a.txt").read_text() == "hi"
            assert not (folder / "a.txt").exists()
            assert "file writes are kept under notes/" in text_of(wrote)

            moved = await proxied.call_tool(
                "move_file",
                {"source": str(folder / "hello.txt"), "destination": str(folder / "b.txt")},
            )
            assert moved.is_error
            assert "Permission denied" in text_of(moved)
            assert (folder / "hello.txt").exists()

            await watcher.cancel(sid)
            hello = {"path": str(folder / "hello.txt")}
            first = await proxied.call_tool("read_text_file", hello)
            assert first.is_error
            assert "CancellationHook" in text_of(first)
            later = await proxied.call_tool("list_allowed_directories", {})
            assert later.is_error
            assert f"session {sid} was cancelled" in text_of(later)

    keys = Keys.of(bus_settings)

    async def stopped_cancelled() -> bool:
        async with HookClient(bus_settings) as client:
            for _, fields in await client.redis.xrange(keys.events(sid)):
                blob = b"".join(fields.values())
                if b"OnSessionStop" in blob and b"Cancelled" in blob:
                    return True
        return False

    await wait_for(stopped_cancelled, what="OnSessionStop Cancelled on the session's stream")


async def test_a_rewrite_that_loses_the_shape_is_withheld(server_bin: Path, folder: Path) -> None:
    """The hooks in-process (HookRegistry), the real server behind the proxy's own upstream
    client: a hook that rewrites a structured result as text cannot be applied to
    structuredContent, which the client shows the model: the output is withheld."""
    registry = HookRegistry()
    registry.add(TextOnlyRedactor())
    async with upstream_stdio([str(server_bin), str(folder)]) as (upstream, _):
        await upstream.list_tools()
        proxy = McpProxy(registry, upstream, "filesystem")
        notes = {"path": str(folder / "notes.txt")}
        result = await proxy.call_tool(
            types.CallToolRequestParams(name="read_text_file", arguments=notes)
        )
    assert result.is_error
    assert result.structured_content is None
    assert "[output withheld by HookBus" in text_of(result)
    assert "sk-live" not in wire(result)


@contextlib.asynccontextmanager
async def http_session(url: str, token: str | None) -> AsyncIterator[ClientSession]:
    import httpx2
    from mcp.client.streamable_http import streamable_http_client

    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=30) as http,
        streamable_http_client(url, http_client=http) as (read, write),
        ClientSession(read, write) as client,
    ):
        await client.initialize()
        await client.list_tools()
        yield client


async def test_streamable_http_per_tenant(
    bus_settings: BusSettings, procs: Any, server_bin: Path, folder: Path, tmp_path: Path
) -> None:
    """``hookbus mcp --http``: a tenant's bearer token opens a session, whose calls the hooks
    decide as over stdio, as the tenant's session (``<tenant>/mcp-…``); no token, a forged
    one, or one of a tenant the bus does not serve: 401."""
    import httpx2

    await start_hooks(procs, bus_settings)
    tokens = tmp_path / "tokens"
    token = new_token(tokens, "team-a", bus_settings)
    unserved = new_token(tokens, "team-b")  # a token, but not a tenant the bus serves
    port = free_port()
    env = worker_env(bus_settings)
    command = proxy_command(server_bin, folder)[3:]  # mcp --name filesystem -- …
    cut = command.index("--")
    command[cut:cut] = ["--http", "--port", str(port), "--tokens", str(tokens)]
    procs.start(command, env, "mcp-http")
    url = f"http://127.0.0.1:{port}/mcp"

    async def up() -> bool:
        try:
            async with httpx2.AsyncClient() as http:
                return (await http.post(url, json={})).status_code == 401
        except httpx2.TransportError:
            return False

    await wait_for(up, timeout=60, what=f"hookbus mcp --http to answer on {url}")
    async with http_session(url, token) as proxied:
        refused = await proxied.call_tool("read_text_file", {"path": str(folder / ".env")})
        assert refused.is_error
        assert "McpSecretGuard: .env files hold secrets" in text_of(refused)
        redacted = await proxied.call_tool("read_text_file", {"path": str(folder / "notes.txt")})
        want = "first line\nAPI_KEY=[redacted]\nlast line\n"
        assert redacted.content[0].text == want
        assert redacted.structured_content == {"content": want}
    async with httpx2.AsyncClient() as http:
        answer = await http.post(url, json={"jsonrpc": "2.0", "id": 1, "method": "ping"})
        assert answer.status_code == 401
        for bearer in ("not-a-token", unserved):
            answer = await http.post(url, json={}, headers={"Authorization": f"Bearer {bearer}"})
            assert answer.status_code == 401, bearer

    keys = Keys.of(bus_settings)

    async def tenant_session_stopped() -> bool:
        async with HookClient(bus_settings) as client:
            seen = b""
            for stream in keys.event_partitions:
                for _, fields in await client.redis.xrange(stream):
                    seen += b"".join(fields.values())
        return b"team-a/mcp-" in seen and b"OnSessionStop" in seen

    await wait_for(tenant_session_stopped, what="OnSessionStop of team-a/mcp-… on the bus")


async def test_permission_asked_of_the_user_by_elicitation(
    bus_settings: BusSettings, procs: Any, server_bin: Path, folder: Path
) -> None:
    """PermissionRequired, with a client that supports elicitation: the user is asked (an MCP
    form elicitation naming the tool and its arguments); accept runs the call, decline refuses
    it."""
    procs.worker(bus_settings, "tests.mcp_hooks:McpNotesFolder", "notes")
    async with HookClient(bus_settings) as watcher:
        await wait_live(watcher, "McpNotesFolder")
    answers = ["decline", "accept"]
    asked: list[str] = []

    async def user(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        asked.append(params.message)
        return types.ElicitResult(action=answers.pop(0), content={})

    command = proxy_command(server_bin, folder)
    async with (
        stdio_client(_params(command, bus_settings)) as (read, write),
        ClientSession(read, write, elicitation_callback=user) as proxied,
    ):
        await proxied.initialize()
        await proxied.list_tools()
        move = {"source": str(folder / "hello.txt"), "destination": str(folder / "moved.txt")}
        declined = await proxied.call_tool("move_file", move)
        assert declined.is_error
        assert "the user said no" in text_of(declined)
        assert (folder / "hello.txt").exists()
        accepted = await proxied.call_tool("move_file", move)
        assert not accepted.is_error, wire(accepted)
        assert (folder / "moved.txt").read_text() == "hello, world\n"
    assert len(asked) == 2
    assert "mcp__filesystem__move_file needs your permission (move files" in asked[0]
    assert "hello.txt" in asked[0]


async def test_started_without_redis_lists_tools_and_refuses_calls(
    server_bin: Path, folder: Path
) -> None:
    """Redis never reachable: the client still gets the server's tools (tools/list passes
    through), and every tools/call is refused with the reason, the server never called."""
    settings = BusSettings(redis_url=f"redis://127.0.0.1:{free_port()}/0", prefix="mcpnone")
    async with (
        session(proxy_command(server_bin, folder), settings) as proxied,
        session([str(server_bin), str(folder)]) as plain,
    ):
        listed = json.loads(wire(await proxied.list_tools()))
        assert listed == json.loads(wire(await plain.list_tools()))
        write = {"path": str(folder / "new.txt"), "content": "x"}
        for name, args in [
            ("read_text_file", {"path": str(folder / "hello.txt")}),
            ("write_file", write),
        ]:
            result = await proxied.call_tool(name, args)
            assert result.is_error
            assert "HookBus has not read the hook directory yet (Redis unreachable" in (
                text_of(result)
            )
        assert not (folder / "new.txt").exists()
