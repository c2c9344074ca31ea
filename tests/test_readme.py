"""The README's usage example runs as written and prints what it says it prints."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def test_readme_leads_with_the_two_commands() -> None:
    head = README.read_text().split("## ", 1)[0]
    assert "make demo" in head and "make test" in head


def run_examples(*blocks: str) -> list[str]:
    """The lines `blocks` print, run in order in one namespace (a later example uses an earlier one's names)."""
    out = io.StringIO()
    namespace: dict[str, object] = {}
    with contextlib.redirect_stdout(out):
        for block in blocks:
            exec(compile(block, "README.md", "exec"), namespace)
    return out.getvalue().splitlines()


def test_readme_usage_example_runs() -> None:
    blocks = python_blocks()
    assert blocks, "the README has no python example"
    lines = run_examples(blocks[0])
    assert lines[0].startswith("refused: execution location runner is not accepting this generation")
    assert lines[1] == "parked 3"
    assert lines[2].startswith("VerifyReport(events=5, streams=1")
    assert lines[3] == ("True {'schema': True, 'chain': True, 'rules': True, 'snapshots': None, "
                        "'read_models': None, 'seal': None}")


def test_readme_asyncio_example_runs() -> None:
    blocks = python_blocks()
    (example,) = [block for block in blocks if "lifecycle_es.aio" in block]
    lines = run_examples(blocks[0], example)
    assert lines[4:] == ["1 RunnerInitialized", "2 LeaseAcquired"]


def test_the_host_driver_unit_file_restarts_on_failure_but_never_on_fenced_or_held() -> None:
    from lifecycle_es.errors import EXIT_FENCED, EXIT_HELD

    (unit,) = re.findall(r"```ini\n(.*?)```", README.read_text(), flags=re.S)
    settings = dict(line.split("=", 1) for line in unit.splitlines() if "=" in line and not line.startswith("#"))
    assert settings["Type"] == "notify" and settings["Restart"] == "on-failure"
    assert set(settings["RestartPreventExitStatus"].split()) == {str(EXIT_FENCED), str(EXIT_HELD)}
    assert "lifecycle-es host" in settings["ExecStart"] and settings["KillMode"] == "process"
