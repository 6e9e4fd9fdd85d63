"""Redaction for what the audit log stores: secrets in tool output (and in the details of held
back answers) are replaced with ``[redacted]`` before a row is written.

The audit hooks see a tool's output as the tool produced it — async hooks, and sync hooks called
in parallel, all get the same original context — so a redacting hook (``Redactor`` in the demo)
does not protect the audit log: the audit hook redacts for itself, with ``redact``:

* ``True``: ``DEFAULT_PATTERNS``, common credential shapes;
* a list of regular expressions of one's own (``--set 'redact=["ACME-[0-9]{8}"]'``): each match
  becomes ``[redacted]``, except a named group ``keep``, which stays (``(?P<keep>token=)\\S+``);
* ``False`` (the default): stored as it came.

A short list of patterns rather than a secret-scanning library: the audit row is a 200
character preview, and these shapes are what the demo and common agents' tools print;
entropy-based scanners (detect-secrets, say) bring plugins and false positives for that.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

from bus.errors import ConfigError

MARK = "[redacted]"

#: ``key=value`` / ``key: value`` for secret-sounding keys (the key is kept), then bare tokens
#: of well-known shapes: OpenAI-style ``sk-…``, AWS access key ids, GitHub tokens, Slack tokens,
#: bearer tokens, private key blocks.
DEFAULT_PATTERNS: tuple[str, ...] = (
    r"(?i)(?P<keep>\b[\w.-]*(?:api[_-]?key|secret|token|passw(?:or)?d|pwd|access[_-]?key)"
    r"[\w.-]*\s*[=:]\s*)[\"']?[^\s\"',;]+[\"']?",
    r"\bsk-[A-Za-z0-9_-]{8,}",
    r"\bAKIA[0-9A-Z]{16}\b",
    r"\bgh[pousr]_[A-Za-z0-9]{20,}\b",
    r"\bxox[abprs]-[A-Za-z0-9-]{10,}",
    r"(?i)(?P<keep>\bbearer\s+)[A-Za-z0-9._~+/-]{8,}=*",
    r"-----BEGIN [A-Z ]*PRIVATE KEY-----[\s\S]*?(?:-----END [A-Z ]*PRIVATE KEY-----|\Z)",
)


class Redaction:
    """Compiled patterns; ``Redaction(False)`` changes nothing."""

    def __init__(self, redact: bool | Sequence[str] | None = False) -> None:
        if redact is None or redact is False:
            patterns: Sequence[str] = ()
        elif redact is True:
            patterns = DEFAULT_PATTERNS
        elif isinstance(redact, str) or not all(isinstance(p, str) for p in redact):
            raise ConfigError("redact must be true, false or a list of regular expressions")
        else:
            patterns = list(redact)
        compiled = []
        for pattern in patterns:
            try:
                compiled.append(re.compile(pattern))
            except re.error as exc:
                raise ConfigError(
                    f"redact: {pattern!r} is not a regular expression: {exc}"
                ) from None
        self.patterns = tuple(compiled)

    def __bool__(self) -> bool:
        return bool(self.patterns)

    def __call__(self, text: str) -> str:
        for pattern in self.patterns:
            text = pattern.sub(_replacement, text)
        return text


def _replacement(match: re.Match[str]) -> str:
    keep = match.groupdict().get("keep")
    return (keep or "") + MARK


def within_strings(value: Any, change: Callable[[str], str]) -> Any:
    """``value`` with ``change`` applied to every string in it (object keys left alone): its
    shape — keys, types, array lengths — kept, as an agent that takes structured tool output
    back (Claude Code's ``updatedToolOutput``) requires."""
    if isinstance(value, str):
        return change(value)
    if isinstance(value, dict):
        return {k: within_strings(v, change) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [within_strings(v, change) for v in value]
    return value
