"""docs/integrations.md's copy-paste starts run, and print what the page says they print.

Each ```sh block runs with ``bash -euo pipefail`` in a fresh directory, in a process group of
its own (everything it starts in the background is stopped afterwards), with the virtualenv's
commands first on PATH, the test's Redis as ``HOOKBUS_REDIS_URL`` and a key prefix of its own.
The gateway's port 8787 becomes a free port: ``HOOKBUS_GATEWAY_PORT`` for the ``hookbus``
commands, and written over ``8787`` in the block's URLs. Its stdout must equal the ```text block
that follows it.
"""

from __future__ import annotations

import contextlib
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
