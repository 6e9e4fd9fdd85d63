"""Import paths users wrote before workers/ was laid out by role still work, and say where
the module is now (workers/moved.py)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.harness import ROOT


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("workers.demo_hooks", "workers.builtins.demo_hooks"),
        ("workers.command_hook", "workers.integrations.command_hook"),
        ("workers.gateway", "workers.services.gateway"),
    ],
)
def test_an_old_path_imports_the_same_module_and_names_the_new_one(old: str, new: str) -> None:
    import importlib

    with pytest.warns(FutureWarning, match=f"{old} moved to {new}"):
        module = importlib.import_module(old)
    assert module is importlib.import_module(new)


def test_a_hook_service_named_by_its_old_path_still_loads() -> None:
    """``hookbus worker workers.demo_hooks:SecretGuard`` (deploy files, users' scripts)."""
    proc = subprocess.run(
        [sys.executable, "-m", "workers.cli", "worker", "workers.demo_hooks:SecretGuard",
         "--check", "--redis", "redis://127.0.0.1:1/0"],  # loads the class, then needs Redis
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert "workers.demo_hooks moved to workers.builtins.demo_hooks" in proc.stderr, proc
    assert "cannot reach Redis" in proc.stderr, proc  # it got as far as Redis: the class loaded


def test_names_of_a_module_that_became_a_package_still_import() -> None:
    """``workers.builtins`` and ``bus.telemetry`` became packages of that name."""
    from bus.telemetry import configure, span
    from bus.telemetry.tracing import configure as configure_there
    from bus.telemetry.tracing import span as span_there
    from workers.builtins import with_builtins
    from workers.builtins.embedded import with_builtins as with_builtins_there

    assert (configure, span, with_builtins) == (configure_there, span_there, with_builtins_there)


def test_a_module_that_was_split_names_where_its_parts_went() -> None:
    import importlib

    with pytest.raises(ModuleNotFoundError, match=r"workers\.operator was split into workers\.ops"):
        importlib.import_module("workers.operator")
