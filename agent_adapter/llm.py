"""A scripted LLM: a fixed plan of replies, so runs are deterministic."""

from __future__ import annotations

import inspect
import itertools
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import msgspec


class ToolCall(msgspec.Struct, frozen=True):
    """One tool call the LLM asked for. ``args`` is whatever the LLM produced (checked later)."""

    id: str
    name: str
    args: Any = msgspec.field(default_factory=dict)


class LLMReply(msgspec.Struct, frozen=True):
    """Text, tool calls, or both. No tool calls means the turn's final answer."""

    text: str = ""
    tool_calls: tuple[ToolCall, ...] = ()


class ChatMessage(msgspec.Struct):
    role: str  # system | user | assistant | tool
    content: str
    name: str = ""


Step = LLMReply | Callable[[Sequence[ChatMessage]], LLMReply | Awaitable[LLMReply]]


class ScriptedLLM:
    """Replies from a plan, one per call; a step may be a function of the messages so far.

    When the plan runs out, the last step repeats if ``repeat_last`` (to drive a loop past
    ``max_steps``), else the LLM answers that it has nothing more to do.
    """

    def __init__(self, plan: Sequence[Step], *, repeat_last: bool = False) -> None:
        self._plan = list(plan)
        self._next = 0
        self._repeat_last = repeat_last

    async def complete(self, messages: Sequence[ChatMessage]) -> LLMReply:
        if self._next < len(self._plan):
            step = self._plan[self._next]
            self._next += 1
        elif self._repeat_last and self._plan:
            step = self._plan[-1]
        else:
            return LLMReply(text="I have nothing more to do.")
        if not callable(step):
            return step
        reply = step(messages)
        return await reply if inspect.isawaitable(reply) else reply


def call(name: str, call_id: str | None = None, /, **args: Any) -> ToolCall:
    """Shorthand for a tool call in a plan: ``call("file_read", path="a.txt")``."""
    return ToolCall(id=call_id or f"call-{next(_ids)}", name=name, args=args)


_ids = itertools.count(1)


def tools(*calls: ToolCall, text: str = "") -> LLMReply:
    return LLMReply(text=text, tool_calls=calls)


def answer(text: str) -> LLMReply:
    return LLMReply(text=text)
