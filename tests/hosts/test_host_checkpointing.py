"""`hosts.checkpointing.Checkpointer`: a signed checkpoint every N events or T seconds, driven by a fake clock."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

import lifecycle_es
from hosts.checkpointing import Checkpointer
from lifecycle_es import EventStore, InvalidInputError
from lifecycle_es.checkpoints import read_notes
from lifecycle_es.events import ReclaimCompleted
from lifecycle_es.signing import Signer, generate_key, load_signer


class Seconds:
    """A monotonic clock in seconds that stands still until moved."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def signer(tmp_path: Path) -> Signer:
    generate_key(tmp_path / "host.key", name="host")
    return load_signer(tmp_path / "host.key")


def signed_seqs(path: Path) -> list[int]:
    return [note.checkpoint.seq for note in read_notes(f"{path}.checkpoints") if note.checkpoint is not None]


def grow(store: EventStore, count: int) -> None:
    for _ in range(count):
        generation = store.stream_version("runner-1") + 1
        store.append_unchecked("runner-1", [ReclaimCompleted(generation=generation)])


def test_signs_every_n_events_and_never_the_same_head_twice(tmp_path: Path, signer: Signer) -> None:
    path = tmp_path / "runners.db"
    clock = Seconds()
    with EventStore.open(path) as store:
        grow(store, 2)
        checkpointer = Checkpointer(store, signer, every=3, seconds=None, clock=clock)
        assert checkpointer.tick() is not None  # the head the host finds
        assert checkpointer.tick() is None
        grow(store, 2)
        clock.now += 10_000
        assert checkpointer.tick() is None  # 2 events since, and no time rule
        grow(store, 1)
        assert checkpointer.tick() is not None
        grow(store, 1)
        assert checkpointer.tick(force=True) is not None
        assert checkpointer.tick(force=True) is None  # the log did not move
    assert signed_seqs(path) == [2, 5, 6]


def test_signs_after_t_seconds_when_the_log_moved(tmp_path: Path, signer: Signer) -> None:
    path = tmp_path / "runners.db"
    clock = Seconds()
    with EventStore.open(path) as store:
        grow(store, 1)
        checkpointer = Checkpointer(store, signer, every=None, seconds=60, clock=clock)
        checkpointer.tick()
        clock.now += 120
        assert checkpointer.tick() is None  # time passed, but nothing new to vouch for
        grow(store, 1)
        clock.now += 59
        assert checkpointer.tick() is not None  # 179 s since the last signing, and the log moved
        grow(store, 1)
        clock.now += 59
        assert checkpointer.tick() is None
        clock.now += 1
        assert checkpointer.tick() is not None
    assert signed_seqs(path) == [1, 2, 3]
    assert lifecycle_es.audit(path, trust=f"{tmp_path}/host.key.pub").checks["checkpoints"] is True


def test_serve_signs_the_head_once_more_when_stopped(tmp_path: Path, signer: Signer) -> None:
    path = tmp_path / "runners.db"
    with EventStore.open(path) as store:
        grow(store, 1)
        checkpointer = Checkpointer(store, signer, every=1000, seconds=None)
        checkpointer.tick()
        grow(store, 3)
        stop = threading.Event()
        stop.set()
        signed: list[int] = []
        checkpointer.serve(stop, poll_interval=0.01, on_checkpoint=lambda checkpoint: signed.append(checkpoint.seq))
    assert signed == [4] and signed_seqs(path) == [1, 4]


def test_serve_reports_a_failure_to_sign_and_goes_on(tmp_path: Path, signer: Signer) -> None:
    path = tmp_path / "runners.db"
    (tmp_path / "elsewhere").write_text("")
    Path(f"{path}.checkpoints").symlink_to(tmp_path / "elsewhere")
    with EventStore.open(path) as store:
        grow(store, 1)
        stop = threading.Event()
        stop.set()
        errors: list[Exception] = []
        Checkpointer(store, signer).serve(stop, poll_interval=0.01, on_error=errors.append)
    assert len(errors) == 1 and isinstance(errors[0], lifecycle_es.StoreIOError)
    assert (tmp_path / "elsewhere").read_text() == ""


@pytest.mark.parametrize(("every", "seconds", "field"), [(None, None, "every"), (0, None, "every"),
                                                          (None, 0, "seconds"), (None, True, "seconds")])
def test_refuses_a_schedule_that_is_none(tmp_path: Path, signer: Signer, every: object, seconds: object,
                                         field: str) -> None:
    with EventStore.open(tmp_path / "runners.db") as store, pytest.raises(InvalidInputError) as info:
        Checkpointer(store, signer, every=every, seconds=seconds)  # type: ignore[arg-type]
    assert info.value.field == field
