"""What an installed ``hookbus`` ships: built from a copy of the sources (no git, so that only
what pyproject.toml names goes in)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from tests.harness import ROOT

PACKAGES = ("bus", "workers", "agent_adapter")


def test_an_installed_hookbus_ships_py_typed_in_every_package(tmp_path: Path) -> None:
    """PEP 561: without ``py.typed`` a type checker ignores an installed package's annotations
    (mypy: "module is installed, but missing library stubs or py.typed marker")."""
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    for package in PACKAGES:
        shutil.copytree(ROOT / package, src / package, ignore=ignore)
    # build_py assembles the tree a wheel (and so an install) holds: every package's modules
    # and the package data pyproject.toml names. (The lock files install no ``wheel``, which
    # bdist_wheel needs under this setuptools.)
    build = "from setuptools import setup; setup()"
    site = tmp_path / "site"
    built = subprocess.run(
        [sys.executable, "-c", build, "--quiet", "build_py", "--build-lib", str(site)],
        cwd=src, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert built.returncode == 0, built.stderr
    # every subpackage is found, not only the top-level ones
    assert (site / "bus" / "telemetry" / "tracing.py").is_file()
    assert (site / "workers" / "services" / "gateway.py").is_file()
    for package in PACKAGES:
        assert (site / package / "py.typed").is_file(), f"{package}/py.typed is not installed"
