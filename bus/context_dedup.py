"""Context deduplication and the ``<system-reminder>`` the LLM sees."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

from bus.actions import TaggedContext


class ContextDeduplicator:
    """Drops contexts already seen in this dispatch cycle (by content hash).

    Create one per step: duplicates are only suppressed within one cycle, never across steps.
    """

    __slots__ = ("_seen",)

    def __init__(self) -> None:
        self._seen: set[bytes] = set()

    def is_duplicate(self, content: str | TaggedContext) -> bool:
        """True if this content was seen before in this cycle; records it otherwise.

        A tagged context is compared by its content alone: two hooks injecting the same text
        produce one reminder.
        """
        text = content.content if isinstance(content, TaggedContext) else content
        digest = hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest()
        if digest in self._seen:
            return True
        self._seen.add(digest)
        return False

    def unique(self, contents: Iterable[str | TaggedContext]) -> list[str]:
        """The rendered contents that are not duplicates, in order."""
        out: list[str] = []
        for c in contents:
            if not self.is_duplicate(c):
                out.append(c.render() if isinstance(c, TaggedContext) else c)
        return out


def render_system_reminder(content: str | TaggedContext) -> str:
    """Wrap one hook context the way the runtime injects it as a user message."""
    text = content.render() if isinstance(content, TaggedContext) else content
    return f"<system-reminder>\n{text}\n</system-reminder>"
