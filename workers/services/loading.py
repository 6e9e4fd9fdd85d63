"""Loading the hook a service runs: ``package.module:HookClass`` imported from the application
directory (``hookbus worker --app-dir``, the current directory by default, as uvicorn does), and
an error that says where Python looked and what the name may have meant when it fails.

A console script (``hookbus``) does not put the current directory on ``sys.path`` the way
``python -m`` does, so without this an author's own package, run from its own directory, fails
to import.
"""

from __future__ import annotations

import difflib
import importlib
import inspect
import json
import os
import pkgutil
import sys
from collections.abc import Mapping, Sequence
from types import ModuleType
from typing import Any

from bus.errors import ConfigError
from bus.hooks import AgentHook, AsyncAgentHook

#: How many ``sys.path`` entries an import error lists.
SHOWN_PATHS = 6


def add_app_dir(app_dir: str) -> str:
    """Put ``app_dir`` (made absolute) first on ``sys.path``; return it."""
    path = os.path.abspath(app_dir)
    if not os.path.isdir(path):
        raise ConfigError(f"--app-dir {app_dir}: no such directory")
    if path in sys.path:
        sys.path.remove(path)
    sys.path.insert(0, path)
    return path


def import_target(target: str, app_dir: str | None = None) -> Any:
    """The object ``package.module:Name`` names, imported with ``app_dir`` first on the path."""
    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr or not all(attr.split(".")):
        raise ConfigError(f"hook {target!r} must look like package.module:HookClass")
    where = add_app_dir(app_dir) if app_dir is not None else None
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(import_hint(target, module_name, exc, where)) from exc
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ConfigError(missing_attribute_hint(target, module, attr))
        obj = getattr(obj, part)
    return obj


def load_hook(
    target: str, *, app_dir: str | None = None, config: Mapping[str, Any] | None = None
) -> Any:
    """Import ``package.module:Name`` and return an instance of the hook it names: a class is
    called with ``config`` as keyword arguments (none by default); an instance is returned as
    it is (and takes no ``config``)."""
    obj = import_target(target, app_dir)
    if isinstance(obj, type) and issubclass(obj, AgentHook | AsyncAgentHook):
        return construct(target, obj, dict(config or {}))
    if isinstance(obj, AgentHook | AsyncAgentHook):
        if config:
            raise ConfigError(f"{target} is a hook instance, not a class: it takes no --set")
        return obj
    kind = f"class {obj.__name__}" if isinstance(obj, type) else f"{type(obj).__name__} object"
    raise ConfigError(f"{target} is a {kind}, not a subclass of AgentHook or AsyncAgentHook")


def construct(target: str, cls: type, config: dict[str, Any]) -> Any:
    """``cls(**config)``, or a ConfigError naming the parameters it takes."""
    try:
        signature = inspect.signature(cls)
    except (TypeError, ValueError):  # no signature to check against: let the call say
        signature = None
    if signature is not None:
        try:
            signature.bind(**config)
        except TypeError as exc:
            takes = ", ".join(str(p) for p in signature.parameters.values()) or "no arguments"
            raise ConfigError(
                f"hook {target}: {exc} (--set/--config); {cls.__name__} takes: {takes}"
            ) from None
    try:
        return cls(**config)
    except (TypeError, ValueError) as exc:
        given = ", ".join(f"{k}={v!r}" for k, v in config.items())
        raise ConfigError(f"hook {target}: {cls.__name__}({given}) refused: {exc}") from exc


def parse_config(pairs: Sequence[str] = (), path: str | None = None) -> dict[str, Any]:
    """A hook's constructor arguments: the JSON object in ``path`` (``--config``), then each
    ``key=value`` of ``pairs`` (``--set``, later ones win). A value is read as JSON when it is
    JSON (``3``, ``true``, ``["a", "b"]``, ``{"k": 1}``, ``"quoted"``), else as a string."""
    config: dict[str, Any] = {}
    if path is not None:
        try:
            with open(path, encoding="utf-8") as f:
                loaded = json.load(f)
        except OSError as exc:
            raise ConfigError(f"--config {path}: {exc.strerror or exc}") from exc
        except json.JSONDecodeError as exc:
            raise ConfigError(f"--config {path}: not JSON: {exc}") from exc
        if not isinstance(loaded, dict):
            raise ConfigError(f"--config {path}: must hold a JSON object (name → value)")
        config.update(loaded)
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key.strip().isidentifier():
            raise ConfigError(f"--set {pair!r} must look like name=value (name: an identifier)")
        try:
            value: Any = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        config[key.strip()] = value
    return config


def import_hint(target: str, module_name: str, exc: ImportError, app_dir: str | None) -> str:
    """What went wrong importing ``module_name``, where Python looked, and what to try."""
    lines = [f"cannot import {module_name!r} for hook {target!r}: {exc}"]
    missing = exc.name if isinstance(exc, ModuleNotFoundError) else None
    if missing is None:
        return lines[0]
    if not _is_prefix(missing, module_name):
        # The hook's module was found, but it imports something that is not installed here.
        lines.append(
            f"  {module_name} was found, but it imports {missing!r}, which is not installed in "
            f"this Python ({sys.executable}): install it (pip install …) where hookbus runs"
        )
        return "\n".join(lines)
    parent, _, leaf = missing.rpartition(".")
    if suggestion := _close_module(parent, leaf):
        lines.append(f"  did you mean {suggestion!r}?")
    if parent:  # the package was found; the module is not in it
        package = sys.modules.get(parent)
        where = ", ".join(getattr(package, "__path__", [])) or "?"
        lines.append(f"  package {parent} ({where}) has no module {leaf!r}")
        return "\n".join(lines)
    shown = [p or "." for p in sys.path[:SHOWN_PATHS]]
    more = f" … ({len(sys.path) - SHOWN_PATHS} more)" if len(sys.path) > SHOWN_PATHS else ""
    lines.append(f"  looked in (sys.path): {', '.join(shown)}{more}")
    lines.append(
        f"  run hookbus from the directory that holds {leaf}/ (or {leaf}.py), or point "
        f"--app-dir at it (now {app_dir or os.getcwd()}), or pip install your package"
    )
    return "\n".join(lines)


def missing_attribute_hint(target: str, module: ModuleType, attr: str) -> str:
    hooks = sorted(
        name
        for name, value in vars(module).items()
        if isinstance(value, type)
        and issubclass(value, AgentHook | AsyncAgentHook)
        and value not in (AgentHook, AsyncAgentHook)
    )
    where = getattr(module, "__file__", None) or module.__name__
    line = f"module {module.__name__!r} ({where}) has no {attr!r} (hook {target!r})"
    if close := difflib.get_close_matches(attr, hooks or list(vars(module)), n=1):
        line += f"; did you mean {close[0]!r}?"
    if hooks:
        line += f" Hooks it defines: {', '.join(hooks)}"
    return line


def _is_prefix(name: str, dotted: str) -> bool:
    return dotted == name or dotted.startswith(name + ".")


def _close_module(parent: str, leaf: str) -> str | None:
    """A module next to the missing one whose name is close to it (``parent.name``)."""
    if parent:
        try:
            package = importlib.import_module(parent)
        except ImportError:
            return None
        names = [m.name for m in pkgutil.iter_modules(getattr(package, "__path__", []))]
    else:
        names = [m.name for m in pkgutil.iter_modules(sys.path)]
    close = difflib.get_close_matches(leaf, names, n=1)
    return f"{parent}.{close[0]}" if close and parent else (close[0] if close else None)
