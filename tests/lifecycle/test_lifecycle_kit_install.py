"""The testing kit says how to install what it needs: the distribution's ``testing`` extra."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_without_hypothesis_the_kit_names_the_extra_that_installs_it() -> None:
    # A None in sys.modules makes `import hypothesis` fail as it does where hypothesis is not installed.
    code = "import sys; sys.modules['hypothesis'] = None; import lifecycle_es.testing"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert run.returncode != 0
    assert "ImportError: lifecycle_es.testing needs hypothesis: pip install 'lifecycle-es[testing]'" in run.stderr
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert [requirement.split(">")[0] for requirement in extras["testing"]] == ["hypothesis"]
