"""The timeline SVG and the audit page, rendered by a real headless Chromium: the screenshots are not blank.

Pixels are not compared with a golden image (fonts and antialiasing differ between machines); the
screenshot must hold the colours the picture is drawn in, over areas only drawn shapes can cover.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from fleets import run
from png import colours
from test_timeline import Life, life, tampered_copy  # noqa: F401  (the module's fixture, shared)

from projections.timeline_svg import OUTCOME_STYLE, STATE_STYLE

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="Chromium is not installed: as root, `apt-get update && apt-get install -y chromium` "
                             "(Debian's package) to run this test")


def rgb(colour: str) -> tuple[int, int, int]:
    """``#rrggbb`` as a tuple."""
    return int(colour[1:3], 16), int(colour[3:5], 16), int(colour[5:7], 16)


def screenshot(page: Path, out: Path, width: int = 1320, height: int = 1000) -> dict[tuple[int, ...], int]:
    """Render `page` in headless Chromium (a profile of its own under the test's directory); its colours."""
    assert CHROMIUM is not None
    done = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                           f"--user-data-dir={out.parent / 'profile'}", f"--screenshot={out}",
                           f"--window-size={width},{height}", page.as_uri()],
                          capture_output=True, text=True, timeout=180, check=False)
    assert done.returncode == 0 and out.exists(), done.stderr[-2000:]
    return colours(out)


def test_the_svg_and_the_audit_page_render_in_chromium(life: Life, tmp_path: Path) -> None:  # noqa: F811
    path, seqs, _, _ = life
    svg = tmp_path / "timeline.svg"
    assert run("timeline", path, "-o", svg).returncode == 0
    shot = screenshot(svg, tmp_path / "svg.png")
    total = sum(shot.values())
    assert len(shot) > 20, f"{len(shot)} colours: a blank or near-blank screenshot"
    assert shot.get((255, 255, 255), 0) < 0.97 * total
    for colour in (OUTCOME_STYLE["settled"][0], OUTCOME_STYLE["lost-poll"][0], OUTCOME_STYLE["drain-expired"][0],
                   STATE_STYLE["accepting"], STATE_STYLE["draining"]):
        assert shot.get(rgb(colour), 0) > 500, f"{colour} covers {shot.get(rgb(colour), 0)} pixels"

    page = tmp_path / "report.html"
    bad = tampered_copy(path, tmp_path / "bad.db", seqs["drain"])
    assert run("audit", bad, "--html", page).returncode == 65
    shot = screenshot(page, tmp_path / "page.png")
    assert len(shot) > 20
    assert shot.get((0xC6, 0x28, 0x28), 0) > 500  # the FAILED verdict
    assert shot.get(rgb(OUTCOME_STYLE["settled"][0]), 0) > 500  # the timeline inside the page
    reds = sum(count for (r, g, b), count in shot.items() if r > 180 and g < 40 and b < 40)
    assert reds > 300  # the first problem's line and label, with the verdict
