"""Tracing: ``tracing`` makes HookBus's spans and configures OpenTelemetry; ``export`` sends
them over OTLP/HTTP from a thread of its own.

``from bus.telemetry import configure`` (the path before this package existed) still works:
names not found here are looked up in ``tracing``.
"""

import importlib
from typing import Any


def __getattr__(name: str) -> Any:
    if name.startswith("_"):
        raise AttributeError(name)
    try:  # a submodule not imported yet (``from bus.telemetry import tracing``)
        return importlib.import_module(f"{__name__}.{name}")
    except ModuleNotFoundError as exc:
        if exc.name != f"{__name__}.{name}":
            raise
    return getattr(importlib.import_module(f"{__name__}.tracing"), name)
