"""Reads at scale: the fleet view, ``lifecycle-es show`` and ``state_at`` on a long log, against a full replay.

    python -m benchmarks.reads [--quick]

The log holds 1M events (200k with ``--quick``) of a fleet of 64 runners living a life the rules allow
(``benchmarks.audit.build``, appended raw in batches, once per run), and each runner's tagged snapshot
taken when `TAIL` events were left to write, as commands take one every 128 of a runner's events while it
retains 257 to 512 leases, as these runners do (``lifecycle_es.handle.snapshot_interval``): a reader starts
from the snapshots and folds the tail, about 64 events a runner.

- ``projections.fleet()`` against the same view by a full replay (``fleet_of(replay(store))``), in
  alternating rounds: the time (target: under 100 ms at 1M events) and its ratio to the replay's;
- ``lifecycle-es show FILE --json`` run in this process (parsing, opening the file read-only, the view,
  printing; no interpreter start-up) against the same full replay;
- ``projections.state_at`` of one runner against a replay of its stream from its first event.
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Callable

from lifecycle_es import EventStore
from lifecycle_es.replay import load

from .audit import FLEET, build
from .measure import Figure, Target, alternate, clock_ns, compared, quiesce
from .suite import Context, main

TAIL = FLEET * 64  # events after the snapshots: half the commands' snapshot interval, on average, per runner
RUNNER = "runner-007"


def _scale(context: Context) -> dict[str, int]:
    if context.quick:
        return {"events": 200_000, "replay_rounds": 3, "rounds": 7}
    return {"events": 1_000_000, "replay_rounds": 3, "rounds": 7}


def _ms(operation: Callable[[], object]) -> float:
    start = clock_ns()
    operation()
    return (clock_ns() - start) / 1e6


def _show(path: str) -> None:
    from lifecycle_es.cli import main as cli

    with contextlib.redirect_stdout(io.StringIO()) as out:
        assert cli(["show", path, "--json"]) == 0
    assert out.getvalue().startswith("{")


def run(context: Context) -> list[Figure]:
    """Every reads figure."""
    from projections import fleet, fleet_of, replay, state_at

    scale = _scale(context)
    events = scale["events"]
    context.say(f"reads: building a log of {events:,} events with snapshots {TAIL:,} events before its head")
    path = build(context.path(f"reads-{events}.db"), events, snapshot_tail=TAIL)
    quiesce()
    figures: list[Figure] = []
    with EventStore.open(path, read_only=True) as store:
        head = store.head().seq
        # The view from snapshots must be the replay's, or the figure means nothing.
        assert fleet(store) == fleet_of(replay(store), head)

        context.say("reads: fleet() and show against a full replay")
        times = alternate({
            "fleet": lambda: _ms(lambda: fleet(store)),
            "show": lambda: _ms(lambda: _show(path)),
            "replay": lambda: _ms(lambda: fleet_of(replay(store), head)),
        }, scale["replay_rounds"])
        note = (f"{FLEET} runners, each from its tagged snapshot, then about {TAIL // FLEET} events of its own; "
                "the baseline folds every event of the log")
        figures.append(compared("reads.fleet", f"projections.fleet() at {head:,} events", "ms", times["fleet"],
                                times["replay"], "full replay", Target("<=", 100, of="value"), samples=times,
                                note=note))
        figures.append(compared("reads.show", f"lifecycle-es show --json at {head:,} events (in process)", "ms",
                                times["show"], times["replay"], "full replay", Target("<=", 100, of="value"),
                                samples=times, note="the command's whole run but the interpreter's start-up"))

        context.say("reads: state_at against a replay of the runner's stream")
        assert state_at(store, RUNNER) == load(store, RUNNER, use_snapshot=False).state
        one = alternate({
            "state_at": lambda: _ms(lambda: state_at(store, RUNNER)),
            "stream": lambda: _ms(lambda: load(store, RUNNER, use_snapshot=False)),
        }, scale["rounds"])
        figures.append(compared("reads.state_at", f"state_at of one runner ({store.stream_version(RUNNER):,} events)",
                                "ms", one["state_at"], one["stream"], "its stream replayed", Target("<=", 0.1),
                                samples=one, note="from its snapshot and its tail, against all of its events"))
    return figures


if __name__ == "__main__":
    raise SystemExit(main(modules={"reads": run}))
