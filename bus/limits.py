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

import operator
import re
from itertools import accumulate, count
from typing import Any

import msgspec

from bus.errors import LimitError
from bus.events import CONTEXT_TYPES, session_of

MAX_MESSAGE_BYTES = 1_048_576
MAX_DEPTH = 128
MAX_CONTAINERS = 100_000
#: Room left in a message for the envelope around a context (ids, trace context, reply_to).
ENVELOPE_ROOM = 16_384
MAX_CONTEXT_BYTES = MAX_MESSAGE_BYTES - ENVELOPE_ROOM
MAX_CONTEXT_DEPTH = 64
#: The largest message whose scalar top-level fields are still read to answer it (8.1).
MAX_HEAD_BYTES = 4 * MAX_MESSAGE_BYTES

# Every byte but the quote and the brackets (deleted by ``translate``); braces become brackets.
_NOT_STRUCTURE = bytes(b for b in range(256) if b not in b'"[]{}')
_BRACKETS = bytes.maketrans(b"{}", b"[]")
# One token of JSON for ``top_level``: a string (escapes included), or a run of openers or closers.
_TOKEN = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"|[\[{]+|[\]}]+', re.DOTALL)


def _brackets(data: bytes) -> bytes:
    """The brackets of ``data`` outside its strings, braces as brackets: ``b"[[][]]"``.

    Escaped backslashes and quotes are removed first, so every quote left delimits a string;
    then everything but quotes and brackets is deleted, and what lay between the quotes of each
    string with it. All of it in C (``bytes.replace``, ``translate``, ``split``)."""
    if b"\\\\" in data:  # (each search is cheaper than the replace it may spare)
        data = data.replace(b"\\\\", b"")
    if b'\\"' in data:
        data = data.replace(b'\\"', b"")
    kept = data.translate(_BRACKETS, _NOT_STRUCTURE)
    if b'"' in kept:
        kept = b"".join(kept.split(b'"')[::2])
    return kept


def _depth(brackets: bytes) -> int:
    """The deepest nesting of a string of brackets: over the runs of openers between closers,
    the running sum of their lengths less one per closer passed."""
    runs = brackets.split(b"]")
    deepest: int = max(map(operator.sub, accumulate(map(len, runs)), count()))
    return deepest


def shape(data: bytes) -> tuple[int, int]:
    """(nesting depth, number of arrays and objects) of a JSON text, without recursing.

    Brackets inside strings do not count. For text that is not valid JSON the figures are
    still bounded and safe to compare with the limits (the decoder rejects such text anyway).
    """
    brackets = _brackets(data)
    containers = brackets.count(b"[")
    return (_depth(brackets) if containers > 1 else containers), containers


def openers(data: bytes) -> int:
    """How many ``[`` and ``{`` the JSON text ``data`` holds (strings included): an upper bound
    on its nesting depth and on its number of containers. One pass (``bytes.translate``) costs
    about two thirds of two ``bytes.count``."""
    return len(data) - len(data.translate(None, b"[{"))


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
    if openers(data) <= max_depth:
        return
    brackets = _brackets(data)
    depth_name = "MAX_DEPTH" if max_depth == MAX_DEPTH else "MAX_CONTEXT_DEPTH"
    if b"[" * (max_depth + 1) in brackets:  # a run of openers: too deep, found in one search
        raise LimitError(
            f"{what} nests more than {max_depth} levels deep; the limit is {max_depth} "
            f"({depth_name})",
            field,
            limit=depth_name,
        )
    containers = brackets.count(b"[")
    if containers > MAX_CONTAINERS:
        raise LimitError(
            f"{what} holds {containers} arrays and objects; the limit is {MAX_CONTAINERS} "
            "(MAX_CONTAINERS)",
            field,
            limit="MAX_CONTAINERS",
        )
    if containers > max_depth and (depth := _depth(brackets)) > max_depth:
        raise LimitError(
            f"{what} nests {depth} levels deep; the limit is {max_depth} ({depth_name})",
            field,
            limit=depth_name,
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
    data = _encode(value, what, depth)
    # check()'s fast path, inlined: this runs for every message sent and every dispatch. The
    # length first: openers() copies the text, and a huge one is refused without it.
    if len(data) > MAX_CONTEXT_BYTES or openers(data) > depth:
        if context:
            check_context(data, what)
        else:
            check(data, what)
    return data


_WHAT = {kind: f"{event.value} context" for event, kind in CONTEXT_TYPES.items()}
_DEEP_ENOUGH = 2 * MAX_CONTEXT_DEPTH
#: A context's JSON is at most this long before its session id could outgrow its room.
_HALF_CONTEXT = MAX_CONTEXT_BYTES // 2
_to_json = _encoder.encode  # bound once: every dispatch encodes its context


def encode_context(ctx: Any) -> bytes:
    """A context as JSON, within the bounds of a context (LimitError otherwise). Every dispatch
    runs this once, embedded too: the usual case is one encode, two counts and a length."""
    try:
        data = _to_json(ctx)
    except Exception:
        data = _encode(ctx, _WHAT[type(ctx)], MAX_CONTEXT_DEPTH)  # raises, naming why
    # JSON of 2 * MAX_CONTEXT_DEPTH bytes or fewer cannot nest deeper (each level opens and
    # closes): no need to count its brackets (two passes that cost more than the encode).
    size = len(data)
    if size > _DEEP_ENOUGH and (size > MAX_CONTEXT_BYTES or openers(data) > MAX_CONTEXT_DEPTH):
        check_context(data, _WHAT[type(ctx)])
    if size > _HALF_CONTEXT:  # only then can the session id outgrow its room
        _check_session_id(ctx, size)
    return data


def _check_session_id(ctx: Any, size: int) -> None:
    """Every message that carries a context names its session once more, outside it
    (``HookRequest``, ``EventMessage``): a context counts its session id twice, so that a long
    one cannot push the message over ``MAX_MESSAGE_BYTES`` — and its hooks into failing under
    their policies — while the context is within ``MAX_CONTEXT_BYTES``."""
    session = len(_encoder.encode(session_of(ctx)))
    if size + session > MAX_CONTEXT_BYTES:
        raise LimitError(
            f"{_WHAT[type(ctx)]} of {size} bytes and its session id of {session} bytes, which "
            f"every message carrying it repeats, are over the {MAX_CONTEXT_BYTES}-byte limit "
            "(MAX_CONTEXT_BYTES)",
            "$.context",
            limit="MAX_CONTEXT_BYTES",
        )


def check_answer(action: Any) -> None:
    """Raise LimitError unless a hook's answer fits in the ``HookReply`` that carries it (where
    it is level 2). The distributed mode finds this out when the worker encodes its reply; the
    dispatcher checks the answers that carry free-form values the same way in both modes."""
    check(_encode({"action": action}, "HookReply", MAX_DEPTH), "HookReply")


def _encode(value: Any, what: str, depth: int) -> bytes:
    context = depth == MAX_CONTEXT_DEPTH
    try:
        return _encoder.encode(value)
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


#: In JSON text: the escape of a UTF-16 surrogate, and a valid pair of them (high, then low).
_SURROGATE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")
_PAIR = re.compile(rb"\\u[dD][89abAB][0-9a-fA-F]{2}\\u[dD][c-fC-F][0-9a-fA-F]{2}")


def lone_surrogate(data: bytes) -> bool:
    """Whether the JSON text ``data`` escapes a UTF-16 surrogate outside a valid pair
    (``"\\ud800"``): valid JSON syntax that no UTF-8 text can hold, which msgspec refuses with
    ``DecodeError``. A JavaScript agent's ``JSON.stringify`` writes one for a lone surrogate.
    Each step runs in C, with no Python call per match: a megabyte of escapes costs
    milliseconds (a regex callback per escaped backslash cost 0.4 s)."""
    if not has_surrogate_escape(data):
        return False
    text = data.replace(b"\\\\", b"")  # an escaped backslash: what follows it is not an escape
    return _SURROGATE.search(_PAIR.sub(b"", text)) is not None


def check_text(data: bytes, what: str, field: str = "") -> None:
    """Raise LimitError (not encodable) if the JSON text ``data`` escapes a lone surrogate:
    input no hook can be shown as text is refused, never taken for a typo (protocol 5.6)."""
    if lone_surrogate(data):
        raise LimitError(
            f"{what} cannot be read as text: it escapes a lone UTF-16 surrogate "
            "(\\ud800-\\udfff without its pair)",
            field,
            limit="encodable",
        )


def has_surrogate_escape(data: bytes) -> bool:
    """Whether ``data`` holds anything like a surrogate escape (one search, in C)."""
    return _SURROGATE.search(data) is not None


def without_surrogates(data: bytes) -> bytes:
    """``data`` with every surrogate escape, paired or not, made ``\\ufffd`` (U+FFFD), and
    every escaped backslash written ``\\u005c`` (the same character), so that what follows
    one is never taken for an escape: the rest can then be read (a message's head, to answer
    it)."""
    return _SURROGATE.sub(rb"\\ufffd", data.replace(b"\\\\", b"\\u005c"))


def top_level(data: bytes) -> bytes | None:
    """``data`` (a JSON object) with every value below its top level replaced by ``null``, so
    that its scalar fields (``id``, ``reply_to``, ``event``) can be read from a message that is
    too deep or has too many containers to decode. None if ``data`` is longer than
    ``MAX_HEAD_BYTES`` or is not an object. Walks the strings and runs of brackets one by one
    (about 0.3 µs each): for the coordinator service's error path only."""
    if len(data) > MAX_HEAD_BYTES or not data.lstrip().startswith(b"{"):
        return None
    out: list[bytes] = []
    depth = 0
    kept_from: int | None = 0  # None while inside a nested value
    for m in _TOKEN.finditer(data):
        token = m[0]
        if token[0] == 34:  # a string: its brackets are text
            continue
        if token[0] in b"[{":
            if depth < 2 <= depth + len(token) and kept_from is not None:
                out.append(data[kept_from : m.start() + 1 - depth])
                kept_from = None
            depth += len(token)
        else:
            depth -= len(token)
            if depth <= 1 and kept_from is None:
                out.append(b"null")
                kept_from = m.end() - (1 - depth) if depth < 1 else m.end()
            if depth <= 0:
                break
    out.append(data[kept_from:] if kept_from is not None else b"null")
    return b"".join(out)
