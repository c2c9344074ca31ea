"""Power loss: hypothesis picks a workload, the moment the power goes, and what the disk kept.

The store runs through `faultvfs.FaultVFS`, which knows what an fsync made durable. A workload of
appends (batches of 1-4 events, on up to three streams, small bodies and bodies that spill over
several pages), seals, checkpoints and reopens is cut at a chosen write, truncate, sync or delete of a
chosen operation (or between operations). Each file then becomes its durable content plus the pending
writes a cut shape keeps: none (``drop``), a prefix (``prefix``), a prefix whose last write is torn
at a sector boundary (``torn``), or any subset in any order, each possibly torn (``reorder``). The
store is then reopened without the fault VFS and must show:

- durability ``full``: every append acknowledged before the cut, byte for byte; at most the one
  batch in flight on top, whole; the chain verifies; every event decodes; no seal complains.
- durability ``normal``: the first k events acknowledged (a whole number of batches), byte for byte,
  or all of them and the batch in flight; the chain verifies; and a seal taken before the cut at a
  head the cut lost makes `EventStore.open` raise StoreBehindSealError (a loss is flagged, never
  silent), while a seal the log still covers opens cleanly.

`make test` runs a bounded number of examples per test (50, a few seconds). A longer run is one command:

    LIFECYCLE_ES_FAULT_EXAMPLES=2000 .venv/bin/pytest tests/test_power_loss.py --hypothesis-show-statistics

(about a minute per 1000 examples per durability on two cores; the statistics show how often the
power went inside an operation, how often acknowledged events were lost, and how often a seal flagged
it). A failure prints the workload, the cut and, per file, what the disk kept.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import apsw
import pytest
from faultvfs import Fate, FaultVFS, KeepEverything, LoseEverything, Pending, Write
from hypothesis import HealthCheck, event, given, note, settings
from hypothesis import strategies as st

from lifecycle_es import EventStore, RecordedEvent, Seal, StoreBehindSealError, StoreError
from lifecycle_es.events import Event, UnitStopped, encode

EXAMPLES = int(os.environ.get("LIFECYCLE_ES_FAULT_EXAMPLES", "50"))
SETTINGS = settings(max_examples=EXAMPLES, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
SHAPES = ("drop", "prefix", "torn", "reorder")
_names = itertools.count()


# --- the workload -------------------------------------------------------------------------------------


class Append(NamedTuple):
    stream: str
    count: int
    size: int


class SealHead(NamedTuple):
    pass


class Checkpoint(NamedTuple):
    """What SQLite's autocheckpoint does after 1000 WAL pages; the next commit restarts the WAL."""


class Reopen(NamedTuple):
    """Close (which checkpoints and deletes the WAL) and open again through the fault VFS."""


Op = Append | SealHead | Checkpoint | Reopen

appends = st.builds(Append, st.sampled_from(["runner-a", "runner-b", "runner-c"]), st.integers(1, 4),
                    st.sampled_from([8, 700, 5000]))
# Each append may be followed by a seal, a checkpoint or a reopen: appends stay at least half the work.
workloads = st.lists(st.tuples(appends, st.sampled_from([None, SealHead(), Checkpoint(), Reopen()])),
                     min_size=1, max_size=8).map(lambda pairs: [op for pair in pairs for op in pair if op is not None])


class Clock:
    """A fake epoch-ms clock, so every run's ``at`` values are the same."""

    def __init__(self) -> None:
        self.ms = 1_767_225_600_000

    def __call__(self) -> int:
        self.ms += 7
        return self.ms


_bodies = itertools.count()


def batch(op: Append) -> list[Event]:
    """Events whose bodies are all different, so a lost, doubled or swapped event shows."""
    return [UnitStopped(lease_id=f"lease-{n}", reason=f"{n}:" + "x" * op.size)
            for n in (next(_bodies) for _ in range(op.count))]


@dataclass
class Run:
    """What the workload saw before the power went: acknowledged batches, the one in flight, the seal."""

    acked: list[RecordedEvent] = field(default_factory=list)
    boundaries: list[int] = field(default_factory=lambda: [0])
    inflight: tuple[str, list[Event]] | None = None
    seal: Seal | None = None
    io: list[int] = field(default_factory=list)  # writes, truncates, syncs and deletes of each op
    cut_inside: bool = False


def run_until_cut(path: str, vfs: FaultVFS, durability: str, workload: Sequence[Op], cut_op: int,
                  cut_io: int) -> Run:
    """Run `workload`; the power goes after `cut_io` more I/O operations of op `cut_op` (or after it)."""
    run = Run()
    clock = Clock()
    store: EventStore | None = EventStore.open(path, vfs=vfs.name, durability=durability, now=clock)
    try:
        for index, op in enumerate(workload):
            if index == cut_op:
                vfs.cut_after(cut_io)
            before = vfs.counts.total()
            try:
                store = step(store, op, run, path, vfs, durability, clock)
            except (StoreError, apsw.Error):  # apsw.Error: the checkpoint runs SQL the store does not wrap
                if vfs.powered:
                    raise
            run.io.append(vfs.counts.total() - before)
            run.cut_inside = not vfs.powered
            if not vfs.powered or index == cut_op:
                break
    finally:
        vfs.power_off()
        if store is not None:
            with contextlib.suppress(StoreError):
                store.close()
    return run


def step(store: EventStore | None, op: Op, run: Run, path: str, vfs: FaultVFS, durability: str,
         clock: Clock) -> EventStore | None:
    assert store is not None
    if isinstance(op, Append):
        events = batch(op)
        run.inflight = (op.stream, events)
        run.acked.extend(store.append_unchecked(op.stream, events))
        run.boundaries.append(len(run.acked))
        run.inflight = None
    elif isinstance(op, SealHead):
        run.seal = store.seal()
    elif isinstance(op, Checkpoint):
        store.backend.execute("PRAGMA wal_checkpoint(PASSIVE)")
    else:
        store.close()
        store = EventStore.open(path, vfs=vfs.name, durability=durability, now=clock)
    return store


# --- the cut ------------------------------------------------------------------------------------------


class DrawnCut:
    """A cut chosen by hypothesis: per file, a shape and the writes that land."""

    def __init__(self, data: st.DataObject) -> None:
        self._data = data

    def entry(self, path: str, options: Sequence[str]) -> str:
        return self._data.draw(st.sampled_from(options), label=f"{os.path.basename(path)} name")

    def fates(self, path: str, pending: Sequence[Pending]) -> Sequence[Fate]:
        draw = self._data.draw
        name = os.path.basename(path)
        shape = draw(st.sampled_from(SHAPES), label=f"{name} shape")
        event(f"cut shape {shape}")
        count = len(pending)
        if shape == "drop":
            return []
        if shape == "prefix":
            return [Fate(i) for i in range(draw(st.integers(0, count), label=f"{name} kept"))]
        if shape == "torn":
            torn = draw(st.integers(0, count - 1), label=f"{name} torn write")
            fates = [Fate(i) for i in range(torn)]
            write = pending[torn]
            if isinstance(write, Write) and write.tears():
                fates.append(Fate(torn, draw(st.sampled_from(write.tears()), label=f"{name} bytes kept")))
            return fates
        order = draw(st.permutations(range(count)), label=f"{name} order")
        kept = draw(st.lists(st.booleans(), min_size=count, max_size=count), label=f"{name} landed")
        fates = []
        for index in order:
            if not kept[index]:
                continue
            write = pending[index]
            tears = write.tears() if isinstance(write, Write) else []
            keep = draw(st.sampled_from([None, *tears]), label=f"{name} #{index} bytes") if tears else None
            fates.append(Fate(index, keep))
        return fates


# --- the checks ---------------------------------------------------------------------------------------


@contextlib.contextmanager
def seal_aside(path: str) -> Iterator[None]:
    """Open the store without its seal (to read what survived), then put the seal back."""
    seal_path, aside = path + ".seal", path + ".seal-aside"
    had_seal = os.path.exists(seal_path)
    if had_seal:
        os.rename(seal_path, aside)
    try:
        yield
    finally:
        if had_seal:
            os.rename(aside, seal_path)


def survivors_of(path: str) -> list[RecordedEvent]:
    """Every event the store shows after the reboot, each decoded, after the whole chain verified."""
    with seal_aside(path), EventStore.open(path) as store:
        report = store.verify()
        survivors = list(store.read())
        for recorded in survivors:
            assert recorded.event is not None
    assert report.events == len(survivors)
    return survivors


def check_prefix(survivors: list[RecordedEvent], run: Run, durability: str) -> None:
    """The survivors are whole acknowledged batches, byte for byte, and at most the batch in flight."""
    acked = [recorded.row() for recorded in run.acked]
    got = [recorded.row() for recorded in survivors]
    kept = min(len(got), len(acked))
    assert got[:kept] == acked[:kept], "a surviving event differs from the one acknowledged"
    if len(got) <= len(acked):
        assert len(got) in run.boundaries, f"{len(got)} events survived: a batch was split"
        if durability == "full":
            assert len(got) == len(acked), f"full durability lost acknowledged events {len(got) + 1}.."
        return
    assert run.inflight is not None, f"{len(got) - len(acked)} events survived that no one appended"
    stream, events = run.inflight
    extra = survivors[len(acked):]
    assert [(r.stream, r.body) for r in extra] == [(stream, encode(event)) for event in events], (
        "the events beyond the acknowledged ones are not the whole batch in flight")


def check_seal(path: str, run: Run, survivors: list[RecordedEvent], durability: str) -> None:
    """A seal whose head the cut lost fails the open; a seal the log still covers does not."""
    if run.seal is None:
        return
    if run.seal.seq > len(survivors):
        assert durability == "normal", "full durability lost a sealed head"
        with pytest.raises(StoreBehindSealError) as caught:
            EventStore.open(path)
        assert caught.value.sealed_seq == run.seal.seq
        assert caught.value.head_seq == len(survivors)
    else:
        EventStore.open(path).close()


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A new, cleanly closed store; each example starts from a copy (creating one costs fsyncs)."""
    path = str(tmp_path_factory.mktemp("template") / "runners.db")
    EventStore.open(path).close()
    return path


@contextlib.contextmanager
def fresh_store(template: str) -> Iterator[tuple[str, FaultVFS]]:
    """A copy of the template store in its own directory, and a fault VFS registered for it."""
    with tempfile.TemporaryDirectory(prefix="lces-power-") as directory:
        path = os.path.join(directory, "runners.db")
        shutil.copyfile(template, path)
        vfs = FaultVFS(f"fault-power-{next(_names)}")
        try:
            yield path, vfs
        finally:
            vfs.unregister()


# --- the tests ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("durability", ["full", "normal"])
@SETTINGS
@given(workload=workloads, data=st.data())
def test_power_cut_keeps_what_was_promised(template: str, durability: str, workload: list[Op],
                                           data: st.DataObject) -> None:
    # A dry run counts each operation's writes, truncates, syncs and deletes, so the cut can land on
    # any one of them (or just after the operation, when it equals the count).
    with fresh_store(template) as (path, vfs):
        dry = run_until_cut(path, vfs, durability, workload, len(workload), 0)
    busy = [index for index, count in enumerate(dry.io) if count > 0]
    cut_op = data.draw(st.sampled_from(busy) | st.integers(0, len(workload)), label="cut during op")
    count = dry.io[cut_op] if cut_op < len(workload) else 0
    # integers() favours its bounds, which here are the two cuts with nothing pending; the first
    # branch aims inside the operation.
    cut_io = data.draw(st.integers(1, max(count - 1, 1)) | st.integers(0, count), label="cut after I/O ops")
    with fresh_store(template) as (path, vfs):
        run = run_until_cut(path, vfs, durability, workload, cut_op, cut_io)
        assert vfs.open_files == 0
        note(f"acknowledged {len(run.acked)} events in batches {run.boundaries}, "
             f"in flight {len(run.inflight[1]) if run.inflight else 0}, seal {run.seal}")
        for name, what in vfs.power_cut(DrawnCut(data)).items():
            note(f"{os.path.basename(name)}: {what}")
        survivors = survivors_of(path)
        check_prefix(survivors, run, durability)
        check_seal(path, run, survivors, durability)
    # What the examples covered (shown by --hypothesis-show-statistics).
    event("the power went inside an operation" if run.cut_inside else "the power went between operations")
    event("acknowledged events lost" if len(survivors) < len(run.acked) else "no acknowledged event lost")
    if len(survivors) > len(run.acked):
        event("the batch in flight survived")
    if run.seal is not None and run.seal.seq > len(survivors):
        event("a seal flagged the loss")


def appended_then_cut(template: str, durability: str,
                      chooser: LoseEverything | KeepEverything) -> tuple[Run, list[RecordedEvent]]:
    """Three acknowledged appends and a seal, then a power cut of the given kind."""
    workload = [Append("runner-a", 2, 8), Append("runner-b", 1, 5000), SealHead(), Append("runner-a", 1, 8)]
    with fresh_store(template) as (path, vfs):
        run = run_until_cut(path, vfs, durability, workload, len(workload), 0)
        vfs.power_cut(chooser)
        survivors = survivors_of(path)
        check_prefix(survivors, run, durability)
        check_seal(path, run, survivors, durability)
    return run, survivors


def test_the_vfs_really_loses_unsynced_commits(template: str) -> None:
    # Without this the property above could pass against a VFS that never loses anything: under
    # durability "normal" no commit was synced, so the harshest cut must take every one of them,
    # and the seal must notice.
    run, survivors = appended_then_cut(template, "normal", LoseEverything())
    assert len(run.acked) == 4 and run.seal is not None and run.seal.seq == 3
    assert survivors == []


def test_full_durability_survives_the_harshest_cut(template: str) -> None:
    run, survivors = appended_then_cut(template, "full", LoseEverything())
    assert [r.row() for r in survivors] == [r.row() for r in run.acked]


def test_a_cut_that_keeps_everything_loses_nothing_even_under_normal(template: str) -> None:
    # What a process crash leaves: every write reached the kernel, so nothing is lost.
    run, survivors = appended_then_cut(template, "normal", KeepEverything())
    assert [r.row() for r in survivors] == [r.row() for r in run.acked]


@pytest.mark.parametrize("keep", [True, False], ids=["disk-kept-it", "disk-lost-it"])
def test_a_batch_cut_before_its_sync_survives_whole_or_not_at_all(template: str, keep: bool) -> None:
    # The power goes after every frame of the commit was written, before the sync that would have
    # acknowledged it: the batch was never acknowledged, and may come back only whole.
    workload = [Append("runner-a", 1, 8), Append("runner-b", 3, 5000)]
    with fresh_store(template) as (path, vfs):
        dry = run_until_cut(path, vfs, "full", workload, len(workload), 0)
    with fresh_store(template) as (path, vfs):
        run = run_until_cut(path, vfs, "full", workload, 1, dry.io[1] - 1)
        assert run.cut_inside and run.inflight is not None and len(run.acked) == 1
        vfs.power_cut(KeepEverything() if keep else LoseEverything())
        survivors = survivors_of(path)
        check_prefix(survivors, run, "full")
    assert len(survivors) == (4 if keep else 1)
