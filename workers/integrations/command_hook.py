"""An existing Claude Code command-hook script, run unchanged as a HookBus hook service.

``hookbus worker workers.integrations.command_hook:CommandHook``, configured by the environment
(read once, when the service starts):

``HOOKBUS_COMMAND`` (required)
    the command, run with ``/bin/sh -c`` as Claude Code runs it, once per call.
``HOOKBUS_COMMAND_NAME``
    the hook's name on the bus (default ``command-hook``; one name per command).
``HOOKBUS_COMMAND_EVENTS``
    Claude Code event names it runs for, comma-separated (default ``PreToolUse``); each must
    have a HookBus counterpart (docs/integrations.md).
``HOOKBUS_COMMAND_MATCHER``
    Claude Code's ``matcher``: a tool name, ``Edit|Write``, a regular expression matched against
    the whole tool name, or ``*``/empty for every tool (the default).
``HOOKBUS_COMMAND_TIMEOUT``
    seconds the command may run (default 60); it is killed after that, with everything it
    started, and the hook fails. (The hook's own timeout is a second longer.)
``HOOKBUS_COMMAND_FAILURE_POLICY``
    ``ignore`` (the default: like Claude Code, a failing command does not block) or ``fail``.
``HOOKBUS_COMMAND_CWD``
    the directory it runs in and is told as ``cwd`` (and ``CLAUDE_PROJECT_DIR``); default: the
    service's own.

The command gets the service's environment without its ``HOOKBUS_*`` variables (the Redis URL
may hold a password).

The command reads Claude Code's hook input on stdin: for a call that came from Claude Code (the
gateway's ``/claude-code``, the bridge), the input Claude Code sent, unchanged (the context's
``agent_input``, with ``tool_input`` and a structured ``tool_response`` put back); for other
agents, one made from the context (``workers.integrations.claude_code.hook_input``). Exit
status 2 blocks with stderr as the reason, and on exit 0 its JSON stdout is read as Claude Code
reads it (``workers.integrations.claude_code.from_command``). Any other exit status, invalid JSON,
more than 1 MiB of output or a timeout is a failure of the hook, decided by its failure policy.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import signal
from typing import Any, cast

from bus import AgentHook
from bus.errors import ConfigError
from bus.events import HookContext, HookEvent
from bus.hooks import FailurePolicy
from bus.matcher import MATCH_ALL, ToolMatchFilter
from bus.protocol import MAX_MESSAGE_BYTES, new_id
from workers.integrations.claude_code import EVENTS, CommandFailed, from_command, hook_input

log = logging.getLogger("hookbus.command_hook")

#: The most a command may print on stdout or stderr.
OUTPUT_LIMIT = MAX_MESSAGE_BYTES
#: How much longer than its command the hook itself may take (killing and reaping it).
KILL_MARGIN_SECS = 1.0
_PLAIN_NAME = re.compile(r"^[A-Za-z0-9_-]+$")
_PREFIX = re.compile(r"^([A-Za-z0-9_-]+)\.\*$")


def manifest_filter(matcher: str) -> ToolMatchFilter:
    """The narrowest filter a manifest can say for Claude Code's ``matcher``: exact names and
    ``Name.*`` prefixes; anything else selects every tool (the hook then checks itself)."""
    if matcher in ("", "*"):
        return MATCH_ALL
    names = []
    for part in matcher.split("|"):
        if _PLAIN_NAME.match(part):
            names.append(part)
        elif prefix := _PREFIX.match(part):
            names.append(f"{prefix.group(1)}*")
        else:
            return MATCH_ALL
    return ToolMatchFilter.parse(names)


class CommandHook(AgentHook):
    """Runs a Claude Code hook command for each event it subscribes to."""

    def __init__(self, env: dict[str, str] | None = None) -> None:
        env = dict(os.environ if env is None else env)
        self.command = env.get("HOOKBUS_COMMAND", "").strip()
        if not self.command:
            raise ConfigError("CommandHook needs HOOKBUS_COMMAND: the hook command to run")
        self.name = env.get("HOOKBUS_COMMAND_NAME", "").strip() or "command-hook"  # type: ignore[misc]
        events = []
        for given in env.get("HOOKBUS_COMMAND_EVENTS", "PreToolUse").split(","):
            given = given.strip()
            if given not in EVENTS:
                raise ConfigError(
                    f"HOOKBUS_COMMAND_EVENTS: {given!r} is not a Claude Code event with a HookBus "
                    f"counterpart (one of {', '.join(EVENTS)})"
                )
            events.append(EVENTS[given])
        self.subscribed_events = tuple(events)  # type: ignore[misc]
        matcher = env.get("HOOKBUS_COMMAND_MATCHER", "").strip()
        try:
            self._matcher = None if matcher in ("", "*") else re.compile(matcher)
        except re.error as exc:
            raise ConfigError(f"HOOKBUS_COMMAND_MATCHER {matcher!r}: {exc}") from exc
        self.match_filter = manifest_filter(matcher)  # type: ignore[misc]
        try:
            self.run_secs = float(env.get("HOOKBUS_COMMAND_TIMEOUT", "60"))
        except ValueError:
            raise ConfigError("HOOKBUS_COMMAND_TIMEOUT must be a number of seconds") from None
        if not self.run_secs > 0:
            raise ConfigError("HOOKBUS_COMMAND_TIMEOUT must be positive")
        # The dispatcher waits a little longer than the command may run: a command that runs
        # too long is killed, and reported, by this hook itself, with nothing left behind.
        self.timeout = self.run_secs + KILL_MARGIN_SECS  # type: ignore[misc]
        policy = env.get("HOOKBUS_COMMAND_FAILURE_POLICY", "ignore")
        if policy not in ("ignore", "fail"):
            raise ConfigError("HOOKBUS_COMMAND_FAILURE_POLICY must be 'ignore' or 'fail'")
        self.failure_policy = cast(FailurePolicy, policy)  # type: ignore[misc]
        self.cwd = env.get("HOOKBUS_COMMAND_CWD") or os.getcwd()
        # The service's own settings stay with it: HOOKBUS_REDIS_URL may hold its Redis password,
        # which a Claude Code hook script has no use for.
        kept = {k: v for k, v in env.items() if not k.startswith("HOOKBUS_")}
        self.env = {**kept, "CLAUDE_PROJECT_DIR": self.cwd}

    def _selected(self, ctx: HookContext) -> bool:
        tool = getattr(ctx, "tool_name", None)
        return self._matcher is None or tool is None or bool(self._matcher.fullmatch(tool))

    async def _run(self, event: HookEvent, ctx: HookContext) -> Any:
        if not self._selected(ctx):  # a regex the manifest's filter could not say
            return from_command(event, ctx, 0, "", "")
        payload = hook_input(event, ctx, cwd=self.cwd, tool_use_id=f"hookbus_{new_id()[:24]}")
        data = json.dumps(payload).encode()
        proc = await asyncio.create_subprocess_exec(
            "/bin/sh", "-c", self.command, cwd=self.cwd, env=self.env,
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, start_new_session=True,
        )  # fmt: skip
        out = asyncio.ensure_future(_capped(proc.stdout))
        err = asyncio.ensure_future(_capped(proc.stderr))
        feed = asyncio.ensure_future(_feed(proc.stdin, data))
        tasks: list[asyncio.Future[Any]] = [out, err, feed]
        try:
            async with asyncio.timeout(self.run_secs):
                stdout, stderr, _ = await asyncio.gather(out, err, feed)
                status = await proc.wait()
        except TimeoutError:
            raise CommandFailed(f"the hook command ran past {self.run_secs:g}s; killed") from None
        finally:
            await _reap(proc, tasks)
        said, complained = stdout.decode("utf-8", "replace"), stderr.decode("utf-8", "replace")
        if complained.strip() and status != 2:
            log.info("%s %s: the command said on stderr: %s", self.name, event, complained[:500])
        return from_command(event, ctx, status, said, complained)

    # one method per event, all the same command

    async def on_session_start(self, ctx: Any) -> None:
        await self._run(HookEvent.ON_SESSION_START, ctx)

    async def pre_tool_use(self, ctx: Any) -> Any:
        return await self._run(HookEvent.PRE_TOOL_USE, ctx)

    async def post_tool_use(self, ctx: Any) -> Any:
        return await self._run(HookEvent.POST_TOOL_USE, ctx)

    async def on_post_tool_use_failure(self, ctx: Any) -> Any:
        return await self._run(HookEvent.POST_TOOL_USE_FAILURE, ctx)

    async def on_step_complete(self, ctx: Any) -> None:
        await self._run(HookEvent.ON_STEP_COMPLETE, ctx)

    async def on_session_stop(self, ctx: Any) -> None:
        await self._run(HookEvent.ON_SESSION_STOP, ctx)

    async def on_subagent_start(self, ctx: Any) -> None:
        await self._run(HookEvent.ON_SUBAGENT_START, ctx)

    async def on_subagent_stop(self, ctx: Any) -> None:
        await self._run(HookEvent.ON_SUBAGENT_STOP, ctx)

    async def on_pre_compact(self, ctx: Any) -> None:
        await self._run(HookEvent.ON_PRE_COMPACT, ctx)

    async def on_post_compact(self, ctx: Any) -> None:
        await self._run(HookEvent.ON_POST_COMPACT, ctx)

    async def on_permission_request(self, ctx: Any) -> Any:
        return await self._run(HookEvent.PERMISSION_REQUEST, ctx)

    async def on_permission_denied(self, ctx: Any) -> None:
        await self._run(HookEvent.PERMISSION_DENIED, ctx)


async def _reap(proc: asyncio.subprocess.Process, tasks: list[asyncio.Future[Any]]) -> None:
    """Leave nothing behind: a command still running (timed out, cancelled, or printing too
    much) is killed with everything it started, its readers stopped, its pipes closed."""
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # its own session: the shell and its children
    for task in tasks:
        task.cancel()
    try:
        await asyncio.gather(*tasks, return_exceptions=True)
        await proc.wait()
    finally:  # even if this hook is cancelled meanwhile (its own deadline passed)
        # asyncio's Process has no close(): without this its pipes would stay open until the
        # transport is collected (and warn then) when the readers were stopped before EOF.
        proc._transport.close()  # type: ignore[attr-defined]


async def _feed(stdin: asyncio.StreamWriter | None, data: bytes) -> None:
    """Write the input and close stdin; a command that exits without reading it is fine."""
    assert stdin is not None
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        stdin.write(data)
        await stdin.drain()
    stdin.close()


async def _capped(stream: asyncio.StreamReader | None) -> bytes:
    """Everything a command prints on one stream, up to ``OUTPUT_LIMIT`` bytes."""
    assert stream is not None
    chunks, size = [], 0
    while chunk := await stream.read(65536):
        size += len(chunk)
        if size > OUTPUT_LIMIT:
            raise CommandFailed(f"the hook command printed more than {OUTPUT_LIMIT} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


__all__ = ["CommandHook", "manifest_filter"]
