"""docs/integrations.md's copy-paste starts run, and print what the page says they print; its
event tables for the OpenAI Agents SDK and LangChain match the frameworks and the adapters.

Each ```sh block runs with ``bash -euo pipefail`` in a fresh directory, in a process group of
its own (everything it starts in the background is stopped afterwards), with the virtualenv's
commands first on PATH, the test's Redis as ``HOOKBUS_REDIS_URL`` and a key prefix of its own.
The gateway's port 8787 becomes a free port: ``HOOKBUS_GATEWAY_PORT`` for the ``hookbus``
commands, and written over ``8787`` in the block's URLs. Its stdout must equal the ```text block
that follows it.
"""

from __future__ import annotations

import contextlib
import inspect
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from bus import HookEvent
from workers.local.redis_server import free_port

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "integrations.md"
MCP_BIN = ROOT / "tests" / "mcp_server" / "node_modules" / ".bin"
BLOCK = re.compile(r"^```sh\n(.*?)^```\n(?:\n```text\n(.*?)^```\n)?", re.S | re.M)


def starts() -> list[tuple[str, str, str]]:
    text = PAGE.read_text()
    found = []
    for match in BLOCK.finditer(text):
        heading = re.findall(r"^#+ (.*)$", text[: match.start()], re.M)[-1]
        found.append((heading, match.group(1), match.group(2) or ""))
    return found


def test_every_section_opens_with_a_start_that_shows_its_output() -> None:
    found = starts()
    headings = [h for h, _, _ in found]
    assert headings == [
        "HTTP entry point",
        "Claude Code: http hooks",
        "Claude Code: the command bridge",
        "Claude Code hook scripts as hook services",
        "OpenAI Agents SDK",
        "LangChain and LangGraph",
        "Policies without code",
        "MCP clients",
    ]
    assert all(expected for _, _, expected in found), "each start shows what it prints"


def _stop(group: int) -> None:
    for sig, grace in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(group, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            try:
                os.killpg(group, 0)
            except ProcessLookupError:
                return
            time.sleep(0.05)


@pytest.mark.parametrize(("heading", "script", "expected"), starts(), ids=[s[0] for s in starts()])
def test_copy_paste_start(
    heading: str, script: str, expected: str, redis_server: Any, tmp_path: Path
) -> None:
    for tool in ("curl", "jq"):
        if shutil.which(tool) is None:
            pytest.fail(f"{tool} is not on PATH: docs/integrations.md's starts use it")
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("HOOKBUS_")}
    env.update(
        # the virtualenv's commands; the MCP filesystem server (tests/mcp_server, node-deps)
        PATH=os.pathsep.join([str(Path(sys.executable).parent), str(MCP_BIN), env.get("PATH", "")]),
        HOOKBUS_REDIS_URL=redis_server.url,
        HOOKBUS_PREFIX=f"doc{uuid.uuid4().hex[:8]}",
        HOOKBUS_GATEWAY_PORT=str(port),
    )
    out, err = tmp_path / "stdout", tmp_path / "stderr"
    with out.open("wb") as stdout, err.open("wb") as stderr:
        proc = subprocess.Popen(
            ["bash", "-euo", "pipefail", "-c", script.replace("8787", str(port))],
            cwd=tmp_path, env=env, stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr,
            start_new_session=True,
        )  # fmt: skip
        try:
            status = proc.wait(timeout=120)
        finally:
            _stop(proc.pid)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(5)
    said = err.read_text(errors="replace")[-3000:]
    assert status == 0, f"{heading}: exit {status}\n{said}"
    assert out.read_text().strip() == expected.strip(), f"{heading}\n{said}"


# -- the frameworks' event tables ------------------------------------------------------------


def table(heading: str) -> list[list[str]]:
    """The cells of the rows of the first table after the ``### heading``."""
    text = PAGE.read_text()
    lines = text[text.index(f"\n### {heading}\n") :].splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("|"))
    rows = []
    for line in lines[first + 2 :]:  # past the header and its rule
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]])
    return rows


def named(cell: str) -> set[HookEvent]:
    """The HookBus events a table's HookBus cell names: ``none``, or `Event`, `Event`, …"""
    if cell == "none":
        return set()
    names = [n.strip() for n in cell.split(",")]
    assert all(len(n) > 2 and n[0] == n[-1] == "`" for n in names), f"not `Event`s: {cell}"
    return {HookEvent(n.strip("`")) for n in names}


def dispatched(*modules: Any) -> set[HookEvent]:
    """The events the modules' ``run_*`` calls dispatch (``run_pre_tool_use``: PreToolUse,
    ``run_on_permission_request``: PermissionRequest, …)."""
    events: set[HookEvent] = set()
    for module in modules:
        for call in re.findall(r"\.(run_[a-z_]+)\(", inspect.getsource(module)):
            camel = "".join(w.title() for w in call.removeprefix("run_").split("_"))
            (event,) = [e for e in HookEvent if camel in (e.value, f"On{e.value}")]
            events.add(event)
    return events


def check(heading: str, framework_events: list[str], adapter: Any) -> None:
    from agent_adapter.integrations import gate

    rows = table(heading)
    firsts = {row[0] for row in rows}
    missing = [e for e in framework_events if f"`{e}`" not in firsts]
    assert not missing, f"{heading}: not in the table: {missing}"
    in_table = set().union(*(named(row[1]) for row in rows))
    assert in_table == dispatched(adapter, gate), heading


def test_the_openai_agents_table_has_every_run_hook_and_every_event_the_adapter_dispatches() -> (
    None
):
    from agents import RunHooks

    from agent_adapter.integrations import openai_agents

    callbacks = [name for name in dir(RunHooks) if name.startswith("on_")]
    check("The SDK's events and HookBus's", callbacks, openai_agents)


def test_the_langchain_table_has_every_middleware_hook_and_every_event_it_dispatches() -> None:
    from langchain.agents.middleware import AgentMiddleware

    from agent_adapter.integrations import langchain

    own = {n: v for n, v in vars(AgentMiddleware).items() if inspect.isfunction(v)}
    hooks = [n for n in own if not n.startswith("_") and not (n[0] == "a" and n[1:] in own)]
    check("LangChain's and LangGraph's events and HookBus's", hooks, langchain)
