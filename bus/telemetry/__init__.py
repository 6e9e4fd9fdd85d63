"""Tracing: ``tracing`` makes HookBus's spans and configures OpenTelemetry; ``export`` sends
them over OTLP/HTTP from a thread of its own.

``from bus.telemetry import configure`` (the path before this package existed) still works:
names not found here are looked up in ``tracing``.
"""

from bus.lazy import names_of

__getattr__ = names_of(__name__, "tracing")
