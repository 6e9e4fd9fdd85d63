"""Log lines that the content they quote cannot forge.

Much of what HookBus logs was chosen by someone else: a session id, a tool name, an inbox key,
a hook's reason, an exception's message that quotes a request. Tool arguments and prompts are
written by an LLM and by whoever injects text into it, so a session id such as
``"s1\\n2026-12-03 12:00:00 INFO hookbus.coordinator: break-glass is off"`` would otherwise
write a line of its own into the log, and an ANSI sequence would rewrite what a terminal shows.

:class:`LineFormatter` writes every record as one line: control characters (C0, DEL, C1),
the Unicode line and paragraph separators and the bidirectional and zero-width format
characters are written as escapes (``\\n``, ``\\r``, ``\\t``, ``\\xNN``, ``\\uNNNN``). A
traceback keeps its own line breaks (they are Python's, not the content's), has the same
characters escaped on every line, and each of its lines is indented, so that no line of it can
pass for a record (a record begins in the first column). Every
``hookbus`` command logs through it; an application that embeds HookBus can use it too::

    handler.setFormatter(LineFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))

Why not escape at each call site (``%r``): a call site that forgets is a hole, and an
exception's message is formatted by whoever raised it; one formatter covers every line.

``HOOKBUS_LOG_FORMAT=json`` (``formatter("json")``) writes each record as one JSON object per
line instead, for log pipelines: python-json-logger's formatter, with every non-ASCII and
control character escaped by the JSON encoder (``\n``, ``\u2028``, ``\u001b``), so a quoted
value can neither break the line nor pass for a field; a traceback is the ``exc_info`` field.
"""

from __future__ import annotations

import logging
import re

#: What a log line must not contain as itself: C0 controls (newline, carriage return, escape…),
#: DEL and C1 controls, zero-width and bidirectional format characters, line/paragraph
#: separators, the byte-order mark, the interlinear annotation marks. A traceback keeps its
#: newlines.
_FORMAT_CHARS = "\u061c\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff\ufff9-\ufffb"
_UNSAFE = re.compile(f"[\x00-\x1f\x7f-\x9f{_FORMAT_CHARS}]")
_UNSAFE_IN_BLOCK = re.compile(f"[\x00-\x09\x0b-\x1f\x7f-\x9f{_FORMAT_CHARS}]")


_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(match: re.Match[str]) -> str:
    char = match.group()
    if escaped := _NAMED.get(char):
        return escaped
    return f"\\x{ord(char):02x}" if ord(char) < 0x100 else f"\\u{ord(char):04x}"


def one_line(text: str) -> str:
    """``text`` with every character that could break or disguise a log line escaped."""
    return _UNSAFE.sub(_escape, text) if _UNSAFE.search(text) else text


def _block(text: str) -> str:
    """A traceback or stack: its own line breaks kept, every line indented and escaped."""
    text = _UNSAFE_IN_BLOCK.sub(_escape, text.rstrip("\n"))
    return "\n".join("    " + line for line in text.split("\n"))


#: Each record's fields in JSON mode (python-json-logger reads them from the format string).
JSON_FIELDS = "%(asctime)s %(levelname)s %(name)s %(message)s"
FORMATS = ("text", "json")


def formatter(kind: str, text_format: str) -> logging.Formatter:
    """The formatter of a ``hookbus`` process: ``text`` (one escaped line, :class:`LineFormatter`
    with ``text_format``) or ``json`` (one JSON object per line)."""
    if kind == "json":
        from pythonjsonlogger.json import JsonFormatter

        return JsonFormatter(JSON_FIELDS, json_ensure_ascii=True)
    if kind != "text":
        from bus.errors import ConfigError

        raise ConfigError(f"HOOKBUS_LOG_FORMAT must be one of {', '.join(FORMATS)}, not {kind!r}")
    return LineFormatter(text_format)


class LineFormatter(logging.Formatter):
    """A :class:`logging.Formatter` whose records are one line each, whatever they quote,
    followed by the traceback's indented lines when there is one."""

    def format(self, record: logging.LogRecord) -> str:
        # logging.Formatter.format, but the traceback is not cached on the record: another
        # handler's formatter must not be handed this one's escaped and indented text.
        record.message = record.getMessage()
        if self.usesTime():
            record.asctime = self.formatTime(record, self.datefmt)
        lines = [one_line(self.formatMessage(record))]
        if record.exc_info:
            lines.append(_block(self.formatException(record.exc_info)))
        elif record.exc_text:
            lines.append(_block(record.exc_text))
        if record.stack_info:
            lines.append(_block(self.formatStack(record.stack_info)))
        return "\n".join(lines)
