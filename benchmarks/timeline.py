"""Timeline figures: drawing a window of a long log, against a bare read of the same log in the same run.

    python -m benchmarks.timeline [--quick]

- a 30-minute window of every runner, in the middle of the log (``lifecycle-es timeline --since
  --until``: collect and draw), against a bare read of the same log (``EventStore.read`` of every row
  and nothing else) (>= 0.25x: a picture costs at most four bare reads);
- the last 50 leases of the log (no window, the command's default), against the same bare read;
- one runner's window (its stream alone is read) against the bare read of the whole log, for
  information: it reads a 64th of the rows;
- the peak RSS of ``lifecycle-es timeline`` as a process of its own, at the big log against the small
  (<= 1.1x: what it keeps is bounded by the window, not the log).

Rates count the log's events per second for every subject, so their ratio is the ratio of times. The
log is the audit benchmark's fleet (``benchmarks.audit.build``): 64 runners living the whole lifecycle
(leases acquired and settled, parked for a lost poll, drains, hooks, reclaims, proxy rotations), so the
picture holds every kind of mark.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from typing import Any

from lifecycle_es.canonical import parse_iso_ms

from .audit import FLEET, T0_MS, build
from .measure import Figure, Target, alternate, compared, quiesce, rate
from .suite import Context, main

WINDOW_MS = 30 * 60 * 1000
RUNNER = "runner-007"


def _scale(context: Context) -> dict[str, int]:
    if context.quick:
        return {"log": 200_000, "rounds": 3, "small": 50_000}
    return {"log": 1_000_000, "rounds": 5, "small": 200_000}


_BUILT: dict[tuple[str, int], str] = {}


def _log(context: Context, events: int) -> str:
    key = (context.workdir, events)
    path = _BUILT.get(key)
    if path is None or not os.path.exists(path):
        context.say(f"timeline: building a fleet log of {events:,} events")
        path = _BUILT[key] = build(context.path(f"timeline-{events}.db"), events)
        quiesce()
    return path


def _window(path: str) -> tuple[int, int]:
    """A window of WINDOW_MS in the middle of the log's time."""
    from lifecycle_es.cli.access import open_store

    with open_store(path, seal=False) as store:
        end = parse_iso_ms(store.head().at)
    middle = (T0_MS + end) // 2
    return middle - WINDOW_MS // 2, middle + WINDOW_MS // 2


def _draw_rate(path: str, **options: Any) -> Callable[[], float]:
    """A round: open the file, read it as the command does, collect and draw; the log's events per second."""
    from lifecycle_es.cli.access import open_store
    from lifecycle_es.cli.timeline import readable
    from projections.timeline import collect
    from projections.timeline_svg import draw

    runners = options.get("runners")

    def one_round() -> float:
        with open_store(path, seal=False) as store:
            events = store.head().seq

            def whole() -> int:
                svg = draw(collect(readable(store, runners[0] if runners else None), **options))
                assert 'class="bar lease' in svg
                return events
            return rate(whole)
    return one_round


def _bare_rate(path: str) -> Callable[[], float]:
    """A round: open the file and read every row through ``EventStore.read``, keeping nothing."""
    from lifecycle_es.cli.access import open_store

    def one_round() -> float:
        with open_store(path, seal=False) as store:
            def whole() -> int:
                count = 0
                for _ in store.read():
                    count += 1
                return count
            return rate(whole)
    return one_round


def _peak_rss_kib(path: str, since: int, until: int, out: str) -> int:
    """Peak RSS of ``lifecycle-es timeline`` over a window, as a process of its own."""
    from lifecycle_es.canonical import iso_ms

    script = os.path.join(os.path.dirname(sys.executable), "lifecycle-es")
    probe = ("import resource, subprocess, sys\n"
             "done = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL)\n"
             "assert done.returncode == 0, done.returncode\n"
             "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n")
    done = subprocess.run([sys.executable, "-c", probe, script, "timeline", path, "--since", iso_ms(since),
                           "--until", iso_ms(until), "-o", out], capture_output=True, text=True, check=True,
                          timeout=3600)
    return int(done.stdout.split()[-1])


def run(context: Context) -> list[Figure]:
    """Every timeline figure."""
    scale = _scale(context)
    log, rounds = scale["log"], scale["rounds"]
    path = _log(context, log)
    since, until = _window(path)
    figures: list[Figure] = []

    context.say("timeline: a window of every runner against a bare read")
    window = alternate({"ours": _draw_rate(path, since_ms=since, until_ms=until), "bare": _bare_rate(path)}, rounds)
    seconds = log / min(window["ours"])
    figures.append(compared(
        "timeline.window", f"timeline, a 30-minute window of {FLEET} runners, {log:,}-event log", "ev/s",
        window["ours"], window["bare"], "bare EventStore.read of every row", Target(">=", 0.25), samples=window,
        note=f"collect and draw read every row once, decode the lease and state events, keep the window's last "
             f"50 leases; the slowest round drew the {log:,}-event log in {seconds:.1f} s"))

    context.say("timeline: the last 50 leases against a bare read")
    last = alternate({"ours": _draw_rate(path), "bare": _bare_rate(path)}, rounds)
    figures.append(compared(
        "timeline.last", f"timeline, the last 50 leases of a {log:,}-event log", "ev/s", last["ours"], last["bare"],
        "bare EventStore.read of every row", Target(">=", 0.25), samples=last,
        note="every lease of the log is read and all but the last 50 dropped"))

    context.say("timeline: one runner's window against a bare read of the whole log")
    one = alternate({"ours": _draw_rate(path, runners=[RUNNER], since_ms=since, until_ms=until),
                     "bare": _bare_rate(path)}, rounds)
    figures.append(compared(
        "timeline.runner", f"timeline, one runner's 30-minute window, {log:,}-event log", "ev/s", one["ours"],
        one["bare"], "bare EventStore.read of every row", None, samples=one,
        note=f"for information: only the runner's stream is read, a {FLEET}th of the rows"))

    context.say("timeline: peak memory against log length")
    peaks = {}
    for size in (scale["small"], log):
        sized = _log(context, size)
        start, end = _window(sized)
        peaks[size] = _peak_rss_kib(sized, start, end, context.path("timeline.svg"))
    figures.append(compared(
        f"timeline.memory.{log}", f"timeline peak RSS at {log:,} events", "KiB", peaks[log], peaks[scale["small"]],
        f"at {scale['small']:,}", Target("<=", 1.1),
        note="ru_maxrss of `lifecycle-es timeline --since --until` as a child process; the same fleet, a longer life"))
    return figures


if __name__ == "__main__":
    raise SystemExit(main(modules={"timeline": run}))
