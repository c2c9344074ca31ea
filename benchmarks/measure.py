"""The one place that measures: clocks, percentiles, interleaved rounds, peak memory, and figures.

Absolute numbers on shared machines drift between runs (up to 1.7x here); a ratio between two things
measured in the same run, in alternating rounds, holds. So every figure is `ours` against a `baseline`
measured in the same process, round by round, with the order of the subjects reversed each round
(ABBA), and the figure is the ratio of their medians.

A `Target` says what the ratio (or, for an absolute target, our value) must reach. A figure whose code
has not landed yet is `unavailable` ("n/a"), not a failure.
"""

from __future__ import annotations

import math
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

clock_ns = time.perf_counter_ns
NS = 1_000_000_000


# --- statistics --------------------------------------------------------------------------------------


def percentile(samples: list[float] | list[int], q: float) -> float:
    """The q-th percentile (0..100) of `samples`, linearly interpolated between closest ranks."""
    if not samples:
        raise ValueError("percentile of no samples")
    ordered = sorted(samples)
    rank = (len(ordered) - 1) * q / 100
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def median(values: list[float]) -> float:
    """The median of `values`."""
    return float(statistics.median(values))


# --- timing ------------------------------------------------------------------------------------------


def rate(operation: Callable[[], int]) -> float:
    """Run `operation` once; it returns how many units of work it did. Units per second."""
    start = clock_ns()
    units = operation()
    elapsed = clock_ns() - start
    return units * NS / max(elapsed, 1)


def latencies_us(operation: Callable[[int], object], count: int) -> list[float]:
    """Call `operation(i)` for i in range(count); the latency of each call, in microseconds."""
    samples: list[float] = []
    for i in range(count):
        start = clock_ns()
        operation(i)
        samples.append((clock_ns() - start) / 1000)
    return samples


def alternate(subjects: Mapping[str, Callable[[], float]], rounds: int) -> dict[str, list[float]]:
    """Run each subject once per round, reversing the order every round (ABBA); their results per round.

    Interleaving spreads the machine's drift over every subject alike, so their ratio holds even when
    the absolute numbers move. Dirty pages are written back first (`quiesce`).
    """
    quiesce()
    names = list(subjects)
    results: dict[str, list[float]] = {name: [] for name in names}
    for round_ in range(rounds):
        for name in names if round_ % 2 == 0 else reversed(names):
            results[name].append(subjects[name]())
    return results


def quiesce() -> None:
    """Write back every dirty page before measuring (``os.sync``).

    Logs are built with the store's ``normal`` durability; until the kernel has written them back, every
    fsync of a later measurement waits behind that writeback, which slows whichever side happens to run
    first. Call this after each build and before the first round.
    """
    os.sync()


def settle(path: str) -> None:
    """Wait until the directory holding the store file at `path` has been still for as long as the store asks
    before it trusts it (``sqlite_files.SETTLED_NS``), as a long-lived host's store directory has been.

    Until then every write transaction also stats the store's side files, and a ``stat`` of the ``-wal``
    makes its next sync slower (see ``lifecycle_es.sqlite_files``): a run measured right after its files
    were made would time the store's first seconds, not its steady state. Call it after the last file of
    the measured directory was made, before the first round.
    """
    from lifecycle_es.sqlite_files import SETTLED_NS

    directory = os.path.dirname(os.path.abspath(path))
    while True:
        info = os.stat(directory)
        still_ns = time.time_ns() - max(info.st_mtime_ns, info.st_ctime_ns)
        if still_ns > SETTLED_NS:
            return
        time.sleep((SETTLED_NS - still_ns) / 1e9 + 0.05)


# --- peak memory -------------------------------------------------------------------------------------

_RSS_PROBE = """
import resource, sys

def _status(field):
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return None

{setup}
_before = _status("VmRSS")
try:  # reset the high-water mark, so the peak is work's own and not the imports'
    with open("/proc/self/clear_refs", "w") as clear:
        clear.write("5")
    _reset = True
except OSError:
    _reset = False
{work}
_peak = _status("VmHWM") if _reset else None
if _peak is None:
    _peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(_before, _peak, file=sys.stderr)
"""


def peak_rss_kib(setup: str, work: str, *, cwd: str | None = None) -> tuple[int, int]:
    """(RSS after `setup`, peak RSS while `work` ran), in KiB, of a fresh child process.

    The child is a new interpreter (``sys.executable -c``), so nothing measured before leaks into it.
    On Linux the high-water mark is reset after `setup` (``/proc/self/clear_refs``), so the peak is the
    work's own; elsewhere it falls back to ``getrusage`` (a peak that may include the setup).
    """
    code = _RSS_PROBE.format(setup=setup, work=work)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=cwd, check=False,
                          timeout=1800)
    if done.returncode != 0:
        raise RuntimeError(f"memory probe failed ({done.returncode}): {done.stderr.strip()[-2000:]}")
    before, peak = done.stderr.strip().splitlines()[-1].split()
    return int(before), int(peak)


# --- figures -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    """What a figure must reach: ``ratio >= 0.9``, ``ratio <= 1.2``, or an absolute ``value >= 300000``."""

    op: Literal[">=", "<="]
    value: float
    of: Literal["ratio", "value"] = "ratio"

    def met(self, ours: float | None, ratio: float | None) -> bool | None:
        """Whether the figure reaches the target (None when there is nothing to judge)."""
        subject = ratio if self.of == "ratio" else ours
        if subject is None:
            return None
        return subject >= self.value if self.op == ">=" else subject <= self.value

    def __str__(self) -> str:
        shown = f"{self.value:g}x" if self.of == "ratio" else number(self.value)
        return f"{self.op} {shown}"


@dataclass(frozen=True)
class Figure:
    """One line of the report: our number, the baseline's, their ratio, and the target.

    `ratio` is always ours / baseline; the target's direction says whether higher or lower is better
    (rates want ``>=``, growth of a cost with log length wants ``<=``).
    """

    name: str
    title: str
    unit: str
    ours: float | None
    baseline: float | None
    baseline_name: str
    target: Target | None
    status: Literal["ok", "n/a", "error"] = "ok"
    note: str = ""
    missing: str = ""
    samples: dict[str, Any] = field(default_factory=dict)
    paired_ratio: float | None = None

    @property
    def ratio(self) -> float | None:
        """ours / baseline: the median of the per-round ratios when measured in rounds, else of the values."""
        if self.paired_ratio is not None:
            return self.paired_ratio
        if self.ours is None or self.baseline is None or self.baseline == 0:
            return None
        return self.ours / self.baseline

    @property
    def met(self) -> bool | None:
        """Whether the target is met (None when there is no target or nothing measured)."""
        if self.target is None or self.status != "ok":
            return None
        return self.target.met(self.ours, self.ratio)

    def as_json(self) -> dict[str, Any]:
        """The figure as plain JSON values, with its ratio and verdict."""
        data = asdict(self)
        data["target"] = str(self.target) if self.target else None
        data["ratio"] = self.ratio
        data["met"] = self.met
        return data


def compared(name: str, title: str, unit: str, ours: float | list[float], baseline: float | list[float] | None,
             baseline_name: str, target: Target | None, *, note: str = "",
             samples: dict[str, Any] | None = None) -> Figure:
    """A measured figure. Given per-round lists (from `alternate`), ours and baseline are their medians
    and the ratio is the median of the round-by-round ratios, which cancels drift between rounds."""
    paired = None
    if isinstance(ours, list) and isinstance(baseline, list):
        paired = median([mine / theirs for mine, theirs in zip(ours, baseline, strict=True) if theirs])
    ours_value = median(ours) if isinstance(ours, list) else ours
    base_value = median(baseline) if isinstance(baseline, list) else baseline
    return Figure(name, title, unit, ours_value, base_value, baseline_name, target, note=note,
                  samples=samples or {}, paired_ratio=paired)


def unavailable(name: str, title: str, baseline_name: str, target: Target | None, why: str, *,
                missing: str = "not yet available") -> Figure:
    """A figure whose code has not landed (or whose baseline is not installed): "n/a", never a failure."""
    return Figure(name, title, "", None, None, baseline_name, target, status="n/a", note=why, missing=missing)


def failed(name: str, title: str, why: str) -> Figure:
    """A benchmark that raised: reported, and the run exits non-zero."""
    return Figure(name, title, "", None, None, "", None, status="error", note=why)


# --- formatting --------------------------------------------------------------------------------------


def number(value: float | None) -> str:
    """A number with three significant digits and thousands separators (``12,300``, ``0.412``)."""
    if value is None:
        return "-"
    if value == 0:
        return "0"
    digits = max(0, 2 - math.floor(math.log10(abs(value))))
    return f"{round(value, digits):,.{digits}f}"


def ratio_text(value: float | None) -> str:
    """A ratio to three significant digits (``0.797x``, ``22.9x``), so a verdict at the edge reads right."""
    if value is None:
        return "-"
    return f"{value:,.0f}x" if value >= 99.95 else f"{value:#.3g}x"


def verdict(figure: Figure) -> str:
    """The "met?" cell."""
    if figure.status == "n/a":
        return f"n/a ({figure.missing})"
    if figure.status == "error":
        return "ERROR"
    if figure.met is None:
        return "-"
    return "yes" if figure.met else "NO"


def table(figures: list[Figure]) -> str:
    """The report as a fixed-width table, one figure a line, notes below."""
    header = ("figure", "ours", "baseline", "ratio", "target", "met?")
    rows = [header]
    for figure in figures:
        unit = f" {figure.unit}" if figure.unit else ""
        ours = number(figure.ours) + unit if figure.ours is not None else "-"
        base = f"{number(figure.baseline)}{unit} ({figure.baseline_name})" if figure.baseline is not None else (
            f"- ({figure.baseline_name})" if figure.baseline_name else "-")
        rows.append((figure.title, ours, base, ratio_text(figure.ratio), str(figure.target or "-"),
                     verdict(figure)))
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
             for row in rows]
    lines.insert(1, "  ".join("-" * width for width in widths))
    notes = [f"  [{figure.name}] {figure.note}" for figure in figures if figure.note]
    if notes:
        lines += ["", "notes:", *notes]
    return "\n".join(lines)


def cpu_count() -> int:
    """CPUs this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
