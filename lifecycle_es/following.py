"""Following the log as it grows: `EventStore.follow`'s loop, and the check each follower makes that the
log still holds what it yielded (`EventStore.check_followed`, which the ``aio`` follower makes too).

    for recorded in store.follow(after=seq, stop=stop):    # IntegrityError, StoreFencedError: see below
        ...

A follower reads through the connection its store opened. Two things can leave it reading a log that is
not the store's any more, and each raises instead of waiting for ever or yielding twice: the log cut back
under it (its head found below a seq it yielded: rows deleted, an older copy put back) is IntegrityError
at the first seq gone; the store's files replaced, removed or cut short underneath (its connection would
go on reading a file no one writes) is StoreFencedError, and fences the store.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING

from .errors import IntegrityError, StoreFencedError
from .log import RecordedEvent
from .values import safe_id, safe_int, safe_number, safe_stop

if TYPE_CHECKING:
    from .store import EventStore


def checked(after: object, poll_interval: object, stream: object,
            stop: object) -> tuple[int, float, threading.Event | None]:
    """`EventStore.follow`'s arguments checked, as (after, poll interval, stop); no read of the store."""
    interval = safe_number(poll_interval, "poll_interval", 0, 3600, above=True)
    if stream is not None:
        safe_id(stream, "stream")
    watched = None if stop is None else safe_stop(stop)
    return safe_int(after, "after"), interval, watched


def held(store: EventStore, after: int) -> tuple[int, bytes | None]:
    """What a follower starting after seq `after` holds of the log: the lower of `after` and the head now, and the
    hash of the event there (None for none, or for a hash no append writes: the audit's to name). Checked like the
    hash of an event it yielded, so that a log cut back and grown again past that seq before its first look is
    seen, not followed on from events it no longer holds."""
    if after <= 0:
        return 0, None  # started from the beginning: it holds nothing yet
    backend = store.backend
    with store.lock:
        head, digest, _ = backend.head()
        if 0 < after < head:
            row = backend.row_at(after)
            head, digest = after, row[7] if row is not None else None
    return head, digest if type(digest) is bytes and len(digest) == 32 else None


def follow_log(store: EventStore, last: int, poll_interval: float, stream: str | None,
               stop: threading.Event | None, *, held: tuple[int, bytes | None] = (0, None)) -> Iterator[RecordedEvent]:
    """`EventStore.follow`'s events (its arguments checked there): read whenever the backend's data version or
    this handle's own commits moved, checked with `check_followed` after each read. `held`: a seq the log held
    when the follower started after it (the lower of its start and the head then), and its event's hash (`held`)."""
    backend = store.backend
    seen: tuple[int, int] | None = None
    # The highest seq the log is known to have held up to the follower's place (yielded, or held at its start):
    # a head found below it is a log cut back under the follower, even one that has yielded nothing yet. The
    # hash of the event there: one found changed is a log cut back and grown again between two polls.
    reached, reached_hash = held
    while stop is None or not stop.is_set():
        try:
            with store.lock:
                marker = (backend.data_version(), store._local_commits)
        except StoreFencedError as exc:  # the files replaced: the number would never move again
            raise store._fenced_by(exc) from None
        if marker != seen:
            seen = marker
            check_followed(store, reached, reached_hash)  # before anything new is yielded past a rewrite
            for recorded in store.read(after=last, stream=stream):
                last = reached = recorded.seq
                reached_hash = recorded.hash
                yield recorded
            check_followed(store, reached, reached_hash)
            continue
        backend.wait(poll_interval, stop)


def check_followed(store: EventStore, reached: int, event_hash: bytes | None = None) -> None:
    """`EventStore.check_followed` (its arguments checked there): the files first, then the head, when the
    follower holds any seq (one that holds none has nothing to lose), then the hash at `reached` if given."""
    backend = store.backend
    with store.lock:
        try:
            backend.check_files()
        except StoreFencedError as exc:
            raise store._fenced_by(exc) from None
        head = backend.head()[0] if reached else 0
        row = backend.row_at(reached) if event_hash is not None and 0 < reached <= head else None
    if head < reached:
        raise IntegrityError(head + 1, f"the log's head went back from seq {reached} to {head} while it was "
                                       "followed: events were deleted, or the store was replaced by an older "
                                       "copy (audit it)")
    if event_hash is not None and reached and (row is None or row[7] != event_hash):
        raise IntegrityError(reached, f"the event at seq {reached} changed while it was followed: the log was "
                                      "cut back and written again, or edited (audit it)")
