"""One agent turn with hook services, exporting telemetry as configured by OTEL_* (for tests).

Run as ``python -m tests.trace_agent SANDBOX``; prints the session id.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from agent_adapter.client import HookClient
from agent_adapter.llm import ScriptedLLM, answer, call, tools
from agent_adapter.runtime import AgentRuntime
from agent_adapter.tools import sandbox_tools
from bus import HookEvent, HookSettings
from bus.settings import BusSettings
from bus.telemetry import tracing as telemetry
from tests.hooks_for_tests import Recorder


async def main(sandbox: Path) -> None:
    client = HookClient(BusSettings.from_env(), HookSettings(hook_timeout_secs=5))
    # a hook in the agent's process, beside the services: its spans are the agent's
    client.add(Recorder("InProcess", events=(HookEvent.PRE_TOOL_USE,)))
    await client.start()
    try:
        deadline = asyncio.get_running_loop().time() + 30
        while not (client.directory.live("Guard") and client.directory.live("Slow")):
            if asyncio.get_running_loop().time() > deadline:
                raise SystemExit("hook services did not come up")
            await asyncio.sleep(0.05)
        (sandbox / "a.txt").parent.mkdir(parents=True, exist_ok=True)
        (sandbox / "a.txt").write_text("hello")
        llm = ScriptedLLM(
            [tools(call("file_read", path=".env")), tools(call("file_read", path="a.txt")),
             answer("done")]
        )  # fmt: skip
        runtime = AgentRuntime(client, llm, sandbox_tools(sandbox), session_id="traced-session")
        result = await runtime.run_turn("read the files")
        print(result.session_id, result.terminal.value)
    finally:
        await client.close()


if __name__ == "__main__":
    telemetry.configure("agent")
    try:
        asyncio.run(main(Path(sys.argv[1])))
    finally:
        telemetry.shutdown()
