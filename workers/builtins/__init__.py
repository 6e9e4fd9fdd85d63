"""The hooks HookBus ships: the specification's embedded built-ins (``embedded``:
CancellationHook, MetricsHook, AuditLogHook, ``with_builtins``), and the services' built-in
hooks (``cancellation``, ``audit``, ``metrics``, ``redaction``, ``demo_hooks``).

``from workers.builtins import with_builtins`` (the path before this package existed) still
works: names not found here are looked up in ``embedded``.
"""

import importlib
from typing import Any


def __getattr__(name: str) -> Any:
    if name.startswith("_"):
        raise AttributeError(name)
    try:  # a submodule not imported yet (``from workers.builtins import embedded``)
        return importlib.import_module(f"{__name__}.{name}")
    except ModuleNotFoundError as exc:
        if exc.name != f"{__name__}.{name}":
            raise
    return getattr(importlib.import_module(f"{__name__}.embedded"), name)
