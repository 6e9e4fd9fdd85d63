"""Settings, built once at start-up from the environment and passed down.

Nothing in HookBus reads the environment at import time or on a hot path.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping

import msgspec

from bus.errors import ConfigError


def _positive(env: Mapping[str, str], key: str, default: float) -> float:
    raw = env.get(key)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{key}={raw!r} is not a number of seconds") from None
    if not math.isfinite(value) or value <= 0:
        raise ConfigError(f"{key}={raw!r} must be a positive number")
    return value


class HookSettings(msgspec.Struct, frozen=True, kw_only=True):
    """How hooks are dispatched.

    Attributes:
        hook_timeout_secs: timeout of a sync hook that declares none (``HOOK_TIMEOUT_SECS``, 30).
        async_timeout_secs: timeout of an async hook call (``HOOKBUS_ASYNC_TIMEOUT_SECS``, 5).
        truncate_chars: length a ``Warning(truncate_output=True)`` cuts output to
            (``HOOKBUS_TRUNCATE_CHARS``, 2000).
    """

    hook_timeout_secs: float = 30.0
    async_timeout_secs: float = 5.0
    truncate_chars: int = 2000

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> HookSettings:
        env = os.environ if env is None else env
        return cls(
            hook_timeout_secs=_positive(env, "HOOK_TIMEOUT_SECS", 30.0),
            async_timeout_secs=_positive(env, "HOOKBUS_ASYNC_TIMEOUT_SECS", 5.0),
            truncate_chars=int(_positive(env, "HOOKBUS_TRUNCATE_CHARS", 2000)),
        )
