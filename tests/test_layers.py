"""The packages' direction, read from the source itself: hosts -> projections -> lifecycle_es (the core),
with lifecycle_es.cli on top. An import of a layer above, anywhere in a module (inside a function too),
fails here, naming the module and the line."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# What each layer may not import (its own package and those below are allowed).
FORBIDDEN = {
    "core": ("projections", "hosts", "lifecycle_es.cli"),
    "projections": ("hosts", "lifecycle_es.cli"),
    "hosts": ("lifecycle_es.cli",),
}


def layer_of(path: Path) -> str | None:
    parts = path.relative_to(ROOT).parts
    if parts[0] == "lifecycle_es":
        # ``python -m lifecycle_es`` (__main__.py) is the command line's entry point: its layer.
        return None if parts[1] in ("cli", "__main__.py") else "core"
    return parts[0] if parts[0] in ("projections", "hosts") else None


def imported(tree: ast.AST, module: str) -> list[tuple[int, str]]:
    names = []
    package = module.rsplit(".", 1)[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against the module's package
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            names.append((node.lineno, target))
            names += [(node.lineno, f"{target}.{alias.name}") for alias in node.names]
    return names


def sources() -> list[Path]:
    return sorted(path for package in ("lifecycle_es", "projections", "hosts")
                  for path in (ROOT / package).rglob("*.py") if layer_of(path) is not None)


@pytest.mark.parametrize("path", sources(), ids=lambda path: str(path.relative_to(ROOT)))
def test_no_module_imports_a_layer_above_its_own(path: Path) -> None:
    layer = layer_of(path)
    assert layer is not None
    relative = path.relative_to(ROOT).with_suffix("")
    module = ".".join(relative.parts[:-1] if relative.name == "__init__" else relative.parts)
    if relative.name == "__init__":
        module += ".__init__"
    tree = ast.parse(path.read_text(), str(path))
    wrong = [f"line {line}: {name}" for line, name in imported(tree, module)
             if any(name == banned or name.startswith(banned + ".") for banned in FORBIDDEN[layer])]
    assert not wrong, f"{relative} ({layer}) imports a layer above it: {wrong}"


def test_the_check_sees_what_it_must() -> None:
    tree = ast.parse("def f():\n    from projections import fleet\nimport hosts.local\nfrom .cli import main\n")
    found = [name for _, name in imported(tree, "lifecycle_es.store")]
    assert "projections" in found and "hosts.local" in found and "lifecycle_es.cli" in found
