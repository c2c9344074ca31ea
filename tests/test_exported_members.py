"""Public surface: every public name is exported, documented, and the layers import one way."""

from __future__ import annotations

import importlib
import inspect
import subprocess
import sys

import pytest

PACKAGES = ["lifecycle_es", "projections", "hosts", "lifecycle_es.testing"]


@pytest.mark.parametrize("name", PACKAGES)
def test_all_is_complete_and_sorted(name: str) -> None:
    module = importlib.import_module(name)
    public = {
        member for member, value in vars(module).items()
        if not member.startswith("_") and not inspect.ismodule(value) and member != "annotations"
    }
    assert set(module.__all__) == public
    assert module.__all__ == sorted(module.__all__, key=lambda n: (not n.isupper(), n[:1].islower(), n))


@pytest.mark.parametrize("name", PACKAGES)
def test_every_public_name_has_a_docstring(name: str) -> None:
    module = importlib.import_module(name)
    for member in module.__all__:
        value = getattr(module, member)
        if inspect.isclass(value) or inspect.isfunction(value):
            assert inspect.getdoc(value), f"{name}.{member} has no docstring"


def test_core_imports_no_host_or_projection_code() -> None:
    code = "import sys, lifecycle_es, lifecycle_es.cli; print(sorted(m for m in sys.modules " \
           "if m.split('.')[0] in ('hosts', 'projections')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_projections_import_no_host_code() -> None:
    code = "import sys, projections; print(sorted(m for m in sys.modules if m.split('.')[0] == 'hosts'))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
