"""The bounds on what HookBus encodes and decodes: size, nesting depth and number of containers.

Content on the bus is written by an LLM and by whoever can inject text into it, so every JSON
message is measured before msgspec parses it and after msgspec writes it. msgspec parses nested
arrays and objects recursively: about 980 levels exhaust its recursion limit (it raises
``RecursionError``, not ``DecodeError``; fewer when called deep in a stack), and a megabyte of
``[[],[],…]`` makes it build 300,000 lists. The bounds here keep every decoder far from both.

=========================  ==========  ==============================================
limit                      value       applies to
=========================  ==========  ==============================================
``MAX_MESSAGE_BYTES``      1 048 576   every message (envelope included)
``MAX_DEPTH``              128         every message; its outer object is level 1
``MAX_CONTAINERS``         100 000     every message: arrays and objects, all levels
``MAX_CONTEXT_BYTES``      1 032 192   an event's context (room for its envelope)
``MAX_CONTEXT_DEPTH``      64          an event's context; the context object is level 1
=========================  ==========  ==============================================

A context within its bounds fits in every message that carries it, with room for a hook to
wrap what it was given in its answer. A context outside them is *uninspectable*: no hook can be
shown it, so the dispatcher refuses it (``bus/runner.py``) instead of letting hooks' failure
policies decide.

Why a scanner of our own: neither msgspec nor the standard library can bound depth before they
recurse (``json`` recurses too; orjson's fixed 1024 is beyond msgspec's limit). The scan below
never recurses. It costs two ``bytes.count`` calls for a message with fewer than
``MAX_DEPTH`` brackets (about 0.1 µs); otherwise it removes the strings with one regular
expression and measures what is left in C-level iterators (at worst about 50–90 ms for a
megabyte of brackets, the same order as msgspec's own parse of such a megabyte).
"""

from __future__ import annotations

import re
from itertools import accumulate
from typing import Any

import msgspec

from bus.errors import LimitError

MAX_MESSAGE_BYTES = 1_048_576
MAX_DEPTH = 128
MAX_CONTAINERS = 100_000
#: Room left in a message for the envelope around a context (ids, trace context, reply_to).
ENVELOPE_ROOM = 16_384
MAX_CONTEXT_BYTES = MAX_MESSAGE_BYTES - ENVELOPE_ROOM
MAX_CONTEXT_DEPTH = 64
#: The largest message whose scalar top-level fields are still read to answer it (8.1).
MAX_HEAD_BYTES = 4 * MAX_MESSAGE_BYTES

# A JSON string: a quote, then any characters but a quote or a backslash, or a backslash and the
# character it escapes, then a quote (unrolled: no backtracking, linear in the string's length).
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_OTHER_BYTES = bytes(b for b in range(256) if b not in b"[]{}")
_BRACKETS_ONLY = bytes.maketrans(b"{}", b"[]")
_STEP = [0] * 256
_STEP[ord("[")] = 1
_STEP[ord("]")] = -1


def shape(data: bytes) -> tuple[int, int]:
    """(nesting depth, number of arrays and objects) of a JSON text, without recursing.

    Brackets inside strings do not count. For text that is not valid JSON the figures are
    still bounded and safe to compare with the limits (the decoder rejects such text anyway).
    """
    if b'"' in data:
        data = _STRING.sub(b"", data)
    brackets = data.translate(_BRACKETS_ONLY, _OTHER_BYTES)
    containers = brackets.count(b"[")
    if containers <= 1:
        return containers, containers
    return max(accumulate(map(_STEP.__getitem__, brackets))), containers


def check(
    data: bytes,
    what: str,
    *,
    max_bytes: int = MAX_MESSAGE_BYTES,
    max_depth: int = MAX_DEPTH,
    field: str = "",
) -> None:
    """Raise LimitError, naming the limit, if the JSON text ``data`` is over a bound."""
    if len(data) > max_bytes:
        name = "MAX_MESSAGE_BYTES" if max_bytes == MAX_MESSAGE_BYTES else "MAX_CONTEXT_BYTES"
        raise LimitError(
            f"{what} of {len(data)} bytes is over the {max_bytes}-byte limit ({name})",
            field,
            limit=name,
        )
    # Fast path: fewer opening brackets than the depth limit (strings included) cannot be
    # nested deeper than it, nor be too many containers.
    if data.count(b"[") + data.count(b"{") <= max_depth:
        return
    depth, containers = shape(data)
    if depth > max_depth:
        name = "MAX_DEPTH" if max_depth == MAX_DEPTH else "MAX_CONTEXT_DEPTH"
        raise LimitError(
            f"{what} nests {depth} levels deep; the limit is {max_depth} ({name})",
            field,
            limit=name,
        )
    if containers > MAX_CONTAINERS:
        raise LimitError(
            f"{what} holds {containers} arrays and objects; the limit is {MAX_CONTAINERS} "
            "(MAX_CONTAINERS)",
            field,
            limit="MAX_CONTAINERS",
        )


def check_context(data: bytes, what: str) -> None:
    """``check`` with a context's bounds (``MAX_CONTEXT_BYTES``, ``MAX_CONTEXT_DEPTH``)."""
    check(data, what, max_bytes=MAX_CONTEXT_BYTES, max_depth=MAX_CONTEXT_DEPTH, field="$.context")


_encoder = msgspec.json.Encoder()


def encode(value: Any, what: str, *, context: bool = False) -> bytes:
    """``value`` as JSON, checked against the bounds of a message (or, with ``context``, of a
    context). Raises LimitError naming the bound, also when msgspec cannot encode it at all:
    nested too deep for it (``RecursionError``), or holding what JSON cannot (an object of an
    unsupported type, a lone surrogate)."""
    depth = MAX_CONTEXT_DEPTH if context else MAX_DEPTH
    try:
        data = _encoder.encode(value)
    except RecursionError:
        name = "MAX_CONTEXT_DEPTH" if context else "MAX_DEPTH"
        raise LimitError(
            f"{what} nests too deep to encode; the limit is {depth} ({name})",
            "$.context" if context else "",
            limit=name,
        ) from None
    except Exception as exc:  # whatever msgspec raises, the caller gets the protocol's error
        raise LimitError(
            f"{what} cannot be encoded as JSON: {type(exc).__name__}: {exc}",
            "$.context" if context else "",
            limit="encodable",
        ) from None
    if context:
        check_context(data, what)
    else:
        check(data, what)
    return data


def top_level(data: bytes) -> bytes | None:
    """``data`` (a JSON object) with every value below its top level replaced by ``null``, so
    that its scalar fields (``id``, ``reply_to``, ``event``) can be read from a message that is
    too deep or too large to decode. None if ``data`` is longer than ``MAX_HEAD_BYTES`` or is
    not an object. Walks the brackets one by one: for error paths only."""
    if len(data) > MAX_HEAD_BYTES or not data.lstrip().startswith(b"{"):
        return None
    # Blank the strings' insides (same length), so that brackets in them are not counted.
    masked = _STRING.sub(lambda m: b'"' + b" " * (len(m[0]) - 2) + b'"', data)
    out: list[bytes] = []
    depth = 0
    kept_from: int | None = 0  # None while inside a nested value
    for m in re.finditer(rb"[\[\]{}]", masked):
        if m[0] in (b"[", b"{"):
            depth += 1
            if depth == 2 and kept_from is not None:
                out.append(data[kept_from : m.start()])
                kept_from = None
        else:
            depth -= 1
            if depth == 1:
                out.append(b"null")
                kept_from = m.end()
            elif depth <= 0:
                break
    out.append(data[kept_from:] if kept_from is not None else b"null")
    return b"".join(out)
