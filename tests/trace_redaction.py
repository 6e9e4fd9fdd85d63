"""A tool call whose input and output hold a secret, through an embedded ``HookRegistry`` whose
hooks rewrite both, exporting telemetry as configured by OTEL_* (for tests).

Run as ``python -m tests.trace_redaction``; prints the final input and output. In hook order:
``Formatter`` rewrites the input and output keeping the secret (as a hook that only reformats
would), ``Redactor`` rewrites them with the secret taken out: the agent gets Redactor's.
"""

from __future__ import annotations

import asyncio
import json

from bus import HookEvent, HookRegistry, HookSettings
from bus.actions import MutateInput, MutateOutput
from bus.events import PostToolUseContext, PreToolUseContext
from bus.telemetry import tracing as telemetry
from tests.hooks_for_tests import Recorder

SECRET = "sk-live-4f1c9e2b7a5d3c8e"
COMMAND = f"curl -H 'Authorization: Bearer {SECRET}' https://api.example"
OUTPUT = f"status 200\nAPI_KEY={SECRET}\ndone"
REDACTED_ARGS = {"command": "curl -H 'Authorization: Bearer [REDACTED]' https://api.example",
                 "timeout": 30}  # fmt: skip
REDACTED_OUTPUT = "status 200\nAPI_KEY=[REDACTED]\ndone"
BOTH = (HookEvent.PRE_TOOL_USE, HookEvent.POST_TOOL_USE)


class Formatter(Recorder):
    async def pre_tool_use(self, ctx: PreToolUseContext) -> MutateInput:
        return MutateInput(updated_args={**ctx.tool_args, "timeout": 30})

    async def post_tool_use(self, ctx: PostToolUseContext) -> MutateOutput:
        return MutateOutput(updated_content=ctx.output_content.strip() + "\n")


class Redactor(Recorder):
    async def pre_tool_use(self, ctx: PreToolUseContext) -> MutateInput:
        return MutateInput(updated_args=REDACTED_ARGS)

    async def post_tool_use(self, ctx: PostToolUseContext) -> MutateOutput:
        return MutateOutput(updated_content=REDACTED_OUTPUT)


async def main() -> None:
    registry = HookRegistry(HookSettings(hook_timeout_secs=5))
    telemetry.instrument(registry)  # as AgentRuntime does
    registry.add(Formatter("Formatter", events=BOTH, priority=0))
    registry.add(Redactor("Redactor", events=BOTH, priority=10))
    pre = await registry.run_pre_tool_use(
        PreToolUseContext(session_id="s1", tool_name="bash", tool_args={"command": COMMAND})
    )
    post = await registry.run_post_tool_use(
        PostToolUseContext(session_id="s1", tool_name="bash", output_content=OUTPUT)
    )
    print(json.dumps({"args": pre.final_args, "output": post.final_content}))


if __name__ == "__main__":
    telemetry.configure("agent")
    try:
        asyncio.run(main())
    finally:
        telemetry.shutdown()
