"""What a user sees of the distribution: its version, its entry points, its typing marker."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
from pathlib import Path

import pytest

import lifecycle_es

ROOT = Path(__file__).resolve().parent.parent


def test_version_is_the_distributions() -> None:
    assert lifecycle_es.__version__ == importlib.metadata.version("lifecycle-es")


@pytest.mark.parametrize("argv", [
    ["-m", "lifecycle_es", "--version"],
    ["-m", "lifecycle_es", "-V"],
    ["-m", "lifecycle_es.cli", "--version"],
])
def test_version_flag_and_module_entry_point(argv: list[str]) -> None:
    done = subprocess.run([sys.executable, *argv], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"lifecycle-es {lifecycle_es.__version__}"


def test_python_m_lifecycle_es_runs_the_command_line() -> None:
    done = subprocess.run([sys.executable, "-m", "lifecycle_es", "audit"], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 64  # the usage error of the console script, not "cannot be directly executed"
    assert "usage: lifecycle-es" in done.stderr


@pytest.mark.parametrize("package", ["lifecycle_es", "projections", "hosts"])
def test_every_package_ships_py_typed(package: str) -> None:
    assert (ROOT / package / "py.typed").is_file()
    data = (ROOT / "pyproject.toml").read_text()
    assert f'{package} = ["py.typed"]' in data


def test_metadata_is_quiet_and_typed() -> None:
    meta = importlib.metadata.metadata("lifecycle-es")
    assert meta["License-Expression"] == "MIT"
    assert "Typing :: Typed" in meta.get_all("Classifier")
    extras = meta.get_all("Provides-Extra")
    assert "testing" in extras
    testing = [req for req in meta.get_all("Requires-Dist") if 'extra == "testing"' in req]
    assert [req.split(";")[0].split(">")[0].strip() for req in testing] == ["hypothesis"]
