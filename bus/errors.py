"""The one error hierarchy of HookBus.

::

    HookBusError                    root: catch this to catch everything HookBus raises
    ├── InvalidInputError           bad input to the public API (also a ValueError)
    │   ├── UnknownEventError       an event name that is not one of the 12
    │   ├── PatternError            a malformed tool-name or content pattern
    │   ├── ContextTypeError        a context of the wrong type for the event (also a TypeError)
    │   └── ProtocolError           a wire message that does not fit the protocol (names the field)
    │       └── LimitError          a message or context over a bound of bus/limits.py (names it)
    ├── ConfigError                 a setting that cannot be used (bad env var, bad hook class)
    │   ├── RedisAuthError          Redis refused the credentials (permanent: services stop)
    │   └── HookRetired             an operator removed the hook this replica would serve
    ├── TransportError              Redis could not be reached or answered with an error
    └── HookFailure                 one hook call that did not answer
        ├── HookTimeout             it ran past its timeout
        ├── HookCrashed             it raised
        └── HookUnreachable         nothing could serve it (no live replica, transport down)

A ``HookFailure`` never escapes a dispatch: the dispatcher records it in the result (which hook,
why) and applies the hook's failure policy. It is an exception only so that an endpoint can
raise it from deep inside a transport.
"""

from __future__ import annotations

from typing import ClassVar, Literal

FailureKind = Literal["timeout", "error", "unreachable"]


class HookBusError(Exception):
    """Root of every error HookBus raises."""


class InvalidInputError(HookBusError, ValueError):
    """Bad input to the public API."""


class UnknownEventError(InvalidInputError):
    """An event name that is not one of the 12 lifecycle events."""


class PatternError(InvalidInputError):
    """A malformed tool-name or content pattern."""


class ContextTypeError(InvalidInputError, TypeError):
    """A context object of the wrong type for the event it was dispatched with."""


class ProtocolError(InvalidInputError):
    """A message from the wire that does not fit the protocol.

    Attributes:
        field: JSON path of the offending field (``$.context.tool_name``), or "" if unknown.
    """

    def __init__(self, message: str, field: str = "") -> None:
        super().__init__(message)
        self.field = field


class LimitError(ProtocolError):
    """A message or context over one of the bounds of ``bus/limits.py``: too large, nested too
    deep, too many containers, or not encodable at all.

    Attributes:
        limit: the name of the bound (``MAX_CONTEXT_DEPTH``, ``MAX_MESSAGE_BYTES``, …), or
            ``"encodable"`` for a value that cannot be written as JSON.
    """

    def __init__(self, message: str, field: str = "", *, limit: str) -> None:
        super().__init__(message, field)
        self.limit = limit


class ConfigError(HookBusError):
    """A setting or hook declaration that cannot be used."""


class RedisAuthError(ConfigError):
    """Redis refused the connection's credentials (missing or wrong password, unknown or
    disabled user). Permanent: retrying cannot help, so a service stops (exit status 2) instead
    of retrying. Deliberately not a ``redis.exceptions.RedisError``: every retry loop, which
    catches those, lets it through (bus/transport/redis_io.py raises it, in one place)."""


class HookRetired(ConfigError):
    """A replica was asked to serve a hook an operator removed (``hookbus hooks remove``)."""


class TransportError(HookBusError):
    """Redis could not be reached, or refused a command."""


class HookFailure(HookBusError):
    """One hook call that produced no answer."""

    kind: ClassVar[FailureKind] = "error"


class HookTimeout(HookFailure):
    """The hook ran past its timeout."""

    kind: ClassVar[FailureKind] = "timeout"


class HookCrashed(HookFailure):
    """The hook raised an exception."""

    kind: ClassVar[FailureKind] = "error"


class HookUnreachable(HookFailure):
    """No replica could serve the hook, or the transport to it is down."""

    kind: ClassVar[FailureKind] = "unreachable"


class SessionCancelled(HookBusError):
    """The session was cancelled (``hookbus cancel``): an agent framework's run stops here."""
