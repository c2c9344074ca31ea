"""Every example in docs/ runs as written.

Each page's ```python blocks run in order in one namespace, in a fresh temporary directory, so a page
reads top to bottom like a session. Its ```sh blocks of ``lifecycle-es`` commands run at their place
in the page, against the files its python blocks made: each command must exit 0 unless its line ends
in ``# exit N``. A ```text block right after an sh block is the output of that block's last command
(``...`` matches anything within a line; a line of only ``...`` matches any number of lines). An sh
block that cannot run (a server that runs until stopped, an install) is marked with
``<!-- not run: reason -->`` on the line before it; a python block can never be so marked.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
PAGES = sorted(DOCS.glob("*.md"))
PAGE_TIMEOUT_S = 25
COMMAND_TIMEOUT_S = 20

FENCE = re.compile(r"^```([A-Za-z0-9_-]*)[ \t]*\n(.*?)^```[ \t]*$", re.S | re.M)
NOT_RUN = re.compile(r"<!--\s*not run:(.*?)-->\s*\Z", re.S)
EXPECTED_EXIT = re.compile(r"#\s*exit\s+(\d+)\s*$")
# JavaScript spellings of fields the Python API spells in snake_case: a reader copying one gets an error.
CAMEL_FIELDS = re.compile(r"\b(ttlMs|timeoutMs|baseDir|runnerId|leaseId|sessionId|cpuSeconds|memoryBytes|"
                          r"expectedGeneration|leaseGeneration|resultDigest|hookDigest|proxyAuthority)\b")


@dataclass
class Block:
    """One fenced block of a page: its language, code, first code line, and what the page says of it."""

    lang: str
    code: str
    line: int
    not_run: str | None
    output: str | None = None


def blocks(page: Path) -> list[Block]:
    """The page's fenced blocks in order; a text block right after an sh block becomes its `output`."""
    text = page.read_text()
    found: list[Block] = []
    end = 0
    for match in FENCE.finditer(text):
        between = text[end:match.start()]
        marker = NOT_RUN.search(between)
        line = text.count("\n", 0, match.start(2)) + 1
        block = Block(match.group(1), match.group(2), line, marker.group(1).strip() if marker else None)
        if block.lang == "text" and found and found[-1].lang == "sh" and not between.strip():
            found[-1].output = block.code
        else:
            found.append(block)
        end = match.end()
    return found


def matches(expected: str, actual: str) -> bool:
    """Whether `actual` has the lines of `expected`, where ``...`` stands for anything (see the module)."""
    pattern = []
    for line in expected.rstrip("\n").split("\n"):
        if line.strip() == "...":
            pattern.append(r"(?:[^\n]*\n)*?")
        else:
            pattern.append(".*?".join(re.escape(part) for part in line.rstrip().split("...")) + r"[ \t]*\n")
    return re.fullmatch("".join(pattern), actual.rstrip("\n") + "\n") is not None


@contextlib.contextmanager
def time_limit(seconds: int, what: str) -> Iterator[None]:
    """Raise TimeoutError in this (the main) thread when `seconds` pass: a hung example fails the test."""
    def expire(signum: int, frame: object) -> None:
        raise TimeoutError(f"{what} still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def run_python(page: Path, block: Block, namespace: dict[str, object]) -> None:
    """Run a python block in the page's namespace; tracebacks name the page's own line numbers."""
    code = compile("\n" * (block.line - 1) + block.code, str(page), "exec")
    with contextlib.redirect_stdout(io.StringIO()):
        exec(code, namespace)


def run_sh(page: Path, block: Block, cwd: Path) -> None:
    """Run each ``lifecycle-es`` line of an sh block with this tree's code; check exit codes and output."""
    last: subprocess.CompletedProcess[str] | None = None
    for offset, raw in enumerate(block.code.splitlines()):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        where = f"{page.name}:{block.line + offset}"
        argv = shlex.split(line, comments=True)
        assert argv and argv[0] == "lifecycle-es", (
            f"{where}: an sh block that runs must hold lifecycle-es commands only; mark others "
            "<!-- not run: reason -->")
        expected = EXPECTED_EXIT.search(line)
        last = subprocess.run([sys.executable, "-m", "lifecycle_es", *argv[1:]], cwd=cwd, capture_output=True,
                              text=True, timeout=COMMAND_TIMEOUT_S, check=False)
        wanted = int(expected.group(1)) if expected else 0
        assert last.returncode == wanted, (
            f"{where}: {line!r} exited {last.returncode}, the page says {wanted}\n{last.stdout}{last.stderr}")
    if block.output is not None:
        assert last is not None, f"{page.name}:{block.line}: output shown for a block with no command"
        shown = last.stdout + last.stderr
        assert matches(block.output, shown), (
            f"{page.name}:{block.line}: the page shows\n{block.output}\nbut the command printed\n{shown}")


def test_the_guide_is_linked_from_the_front_page_and_lists_every_page() -> None:
    assert "(docs/README.md)" in (ROOT / "README.md").read_text()
    contents = (DOCS / "README.md").read_text()
    numbered = [page.name for page in PAGES if re.match(r"\d\d-", page.name)]
    assert numbered, "the guide has no numbered pages"
    for name in numbered:
        assert f"({name})" in contents, f"docs/README.md does not link {name}"


def anchor(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


@pytest.mark.parametrize("page", PAGES, ids=[page.name for page in PAGES])
def test_the_page_links_lead_somewhere(page: Path) -> None:
    for target, fragment in re.findall(r"\]\(([^)#\s:]*)(?:#([^)\s]+))?\)", page.read_text()):
        linked = (page.parent / target).resolve() if target else page
        assert linked.exists(), f"{page.name} links {target}, which does not exist"
        if fragment:
            headings = re.findall(r"^#+ (.+)$", linked.read_text(), flags=re.M)
            assert fragment in {anchor(heading) for heading in headings}, f"{page.name}: no #{fragment} in {target}"


@pytest.mark.parametrize("page", PAGES, ids=[page.name for page in PAGES])
def test_the_page_speaks_the_python_api(page: Path) -> None:
    text = page.read_text()
    assert re.search(r"\bseed", text, re.I) is None, f"{page.name}: say what this project does instead"
    found = CAMEL_FIELDS.search(text)
    assert found is None, f"{page.name}: {found.group()} is the JavaScript spelling; use the Python API's"


@pytest.mark.parametrize("page", PAGES, ids=[page.name for page in PAGES])
def test_the_page_runs(page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    found = blocks(page)
    for block in found:
        if block.not_run is not None:
            assert block.lang == "sh", f"{page.name}:{block.line}: every python block runs; only sh may be skipped"
            assert block.not_run, f"{page.name}:{block.line}: a skipped block must say why"
    # Child processes the examples start (units, followers, the command line) import this tree's code.
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, object] = {"__name__": f"docs_{page.stem.replace('-', '_')}"}
    with time_limit(PAGE_TIMEOUT_S, page.name):
        for block in found:
            if block.not_run is not None:
                continue
            if block.lang == "python":
                run_python(page, block, namespace)
            elif block.lang == "sh":
                run_sh(page, block, tmp_path)


def test_a_skipped_block_needs_a_reason(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("<!-- not run: serves until SIGTERM -->\n```sh\nlifecycle-es host x\n```\n\n"
                    "<!-- not run: -->\n```sh\nlifecycle-es host y\n```\n\n```sh\nlifecycle-es audit z\n```\n"
                    "```text\nOK ... whole\n```\n")
    found = blocks(page)
    assert [block.not_run for block in found] == ["serves until SIGTERM", "", None]
    assert found[2].output == "OK ... whole\n"


def test_shown_output_matches_with_ellipses() -> None:
    assert matches("audit of ...\n...\n  result  OK\n", "audit of /tmp/x\n  a  1\n  b  2\n  result  OK\n")
    assert matches("a\n...\nz\n", "a\nz\n")
    assert not matches("a\n  result  OK\n", "a\n  result  FAILED\n")
