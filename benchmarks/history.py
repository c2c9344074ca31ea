"""Long logs, built fast: other runners' lifecycle events appended in large batches.

A history of N events is N / 1000 runners of 1000 events each (one `RunnerInitialized`, then
`LeaseAcquired` / `LeaseSettled` pairs), appended through `EventStore.append` 1000 at a time, so the
file is a real store (chained, verifiable) that a benchmark then measures against. Built once per size
per run, with the store's ``normal`` durability (the build is not what is measured); a benchmark
reopens it with ``full``. Every event is rule-valid, so `projections.rebuild` replays it clean.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

from lifecycle_es import EventStore, ProxyAuthority, Resources
from lifecycle_es.events import Event, LeaseAcquired, LeaseSettled, RunnerInitialized

from .measure import quiesce
from .suite import Context

EVENTS_PER_RUNNER = 1000
BATCH = 1000
DIGEST = "sha256:" + "ab" * 32
# Every history event is stamped AT, as if all were decided in one millisecond: the rules hold
# (a lease is issued at its event's time, the proxy authority is fresh then), so the log replays clean.
AT = "2026-01-01T00:00:00.000Z"
AUTHORITY = ProxyAuthority(id="proxy-1", revision=1, issued_at=AT,
                           expires_at="2026-01-01T01:00:00.000Z")
RESOURCES = Resources(cpu_seconds=3600, memory_bytes=1 << 30)


def initialized(runner_id: str, base_dir: str | None = None) -> RunnerInitialized:
    """The first event of a runner's stream (base dir ``/srv/runners/<id>`` unless given)."""
    return RunnerInitialized(schema="cc-execution-location-runner-lifecycle/v1", runner_id=runner_id,
                             target="local", base_dir=base_dir or f"/srv/runners/{runner_id}", resources=RESOURCES,
                             post_session_hook_digest=DIGEST)


def lease_pair(runner_id: str, n: int) -> tuple[LeaseAcquired, LeaseSettled]:
    """The n-th lease of a runner: acquired at generation 1, then settled."""
    lease_id = f"lease-{runner_id}-{n:08d}"
    return (
        LeaseAcquired(lease_id=lease_id, session_id=f"session-{n:08d}", lease_generation=1,
                      issued_at=AT, expires_at="2026-01-01T00:10:00.000Z", proxy_authority=AUTHORITY),
        LeaseSettled(lease_id=lease_id, lease_generation=1, result_digest=DIGEST),
    )


def runner_events(runner_id: str, count: int, *, base_dir: str | None = None) -> Iterator[Event]:
    """`count` events of one runner: initialized (under `base_dir`), then acquire/settle pairs."""
    yield initialized(runner_id) if base_dir is None else initialized(runner_id, base_dir)
    produced, n = 1, 0
    while produced < count:
        for event in lease_pair(runner_id, n):
            if produced < count:
                yield event
                produced += 1
        n += 1


def other_runner(n: int) -> str:
    """The id of the n-th runner of a history (runner 0 is in every log, with 1000 events)."""
    return f"other-{n:06d}"


def append_runner(store: EventStore, runner_id: str, count: int, *, base_dir: str | None = None) -> None:
    """Append a runner of `count` events to `store`, BATCH at a time."""
    events = list(runner_events(runner_id, count, base_dir=base_dir))
    for start in range(0, len(events), BATCH):
        store.append_unchecked(runner_id, events[start:start + BATCH], at=AT)


def fill(store: EventStore, total: int) -> None:
    """Append `total` events of other runners to `store`, BATCH at a time."""
    runner = 0
    while total > 0:
        count = min(EVENTS_PER_RUNNER, total)
        append_runner(store, other_runner(runner), count)
        total -= count
        runner += 1


def history_log(context: Context, size: int) -> str:
    """The path of a store holding `size` events of other runners, built once per run.

    Benchmarks that write to it append a few hundred events of their own streams; at the sizes asked
    for that changes nothing they measure.
    """
    path = context.logs.get(size)
    if path is not None and os.path.exists(path):
        return path
    path = context.path(f"history-{size}.db")
    context.say(f"building a log of {size:,} events")
    with EventStore.open(path, durability="normal") as store:
        fill(store, size)
    quiesce()
    context.logs[size] = path
    return path
