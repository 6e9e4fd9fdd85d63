"""A package that became the home of a module of the same name keeps its old names.

``bus.telemetry`` was a module and is now a package (``tracing``, ``export``);
``workers.builtins`` likewise (``embedded`` and the built-in hooks). ``from bus.telemetry import
configure`` still works: a name the package does not have is looked up, when first asked, in the
module that took the old module's place (PEP 562's module ``__getattr__``), so nothing is
imported before it is needed.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def names_of(package: str, module: str) -> Callable[[str], Any]:
    """The ``__getattr__`` of ``package``: its submodules, then the names of ``module``."""

    def __getattr__(name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        try:  # a submodule not imported yet (``from bus.telemetry import tracing``)
            return importlib.import_module(f"{package}.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"{package}.{name}":
                raise
        return getattr(importlib.import_module(f"{package}.{module}"), name)

    return __getattr__
