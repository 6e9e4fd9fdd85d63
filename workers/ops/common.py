"""What the operator's queries share: decoding Redis's answers, stream ids, chunk sizes."""

from __future__ import annotations

import re
from typing import Any

from bus.protocol import DATA_FIELD

_DATA = DATA_FIELD.encode()


_STREAM_ID = re.compile(r"^\d+(-\d+)?$")


CHUNK = 500


#: From this many entries on, ``dlq replay`` and ``dlq purge`` show a progress bar.
MANY = 500


def _text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return "" if value is None else str(value)


def _id_ms(entry_id: str) -> int:
    return int(entry_id.partition("-")[0])


def _secs(ms: float) -> float:
    return max(0.0, ms / 1000)


def _ago(secs: float | None) -> str:
    if secs is None:
        return "-"
    return f"{secs:.1f}s" if secs < 100 else f"{secs:.0f}s"
