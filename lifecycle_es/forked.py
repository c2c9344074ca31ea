"""Stores in a process forked from the one that opened them: fenced there, their connections left alone.

A connection does not survive a fork: SQLite's file locks belong to the process that took them, a
server's session is one socket, and a lock a thread of the parent held at the fork stays held for ever
in the child. So every store this process opens is tracked, and in a child forked from it (``os.fork``,
``multiprocessing``'s default on Linux) each is fenced at once (`EventStore._inherited`): its backend is
swapped for one whose every use raises the fence, and the real one is kept, never closed or collected,
since finalizing it in the child would end the session a server shares with the parent. A store file that a
thread of the parent was writing at the fork cannot be written from the child at all (`written_at_fork`).
"""

from __future__ import annotations

import os
import weakref
from typing import TYPE_CHECKING, Any, cast

from .errors import StoreFencedError

if TYPE_CHECKING:
    from .backend import Backend
    from .store import EventStore

_OPEN: weakref.WeakSet[EventStore] = weakref.WeakSet()
_KEPT: list[Backend] = []
written_at_fork: set[tuple[int, int]] = set()
"""The (device, inode) of every store file a connection of an ancestor process had a write transaction open on
when this process was forked from it. SQLite keeps, per process, what its connections lock on a file; the
child's copy says that write is still going on, and no connection the child opens can write that file: each write
would wait out the busy timeout for a lock nothing here releases, then fail, for as long as the process lives.
Such a write is refused at once instead (`SqliteBackend`)."""
generation = 0
"""How many forks this process is from the one that imported this module: a transaction begun at another
generation was begun by the parent, and the thread that forked is unwinding through it in the child, where
ending it would roll back or commit on the parent's connection (on a server, ending the parent's transaction)."""


class _Inherited:
    """The backend of a store in a process forked from the one that opened it: every use raises its fence."""

    def __init__(self, path: str, fence: str) -> None:
        self.path = path
        self._fence = fence

    def __getattr__(self, name: str) -> Any:
        raise StoreFencedError(self._fence)


def track(store: EventStore) -> None:
    """Remember `store`, so that a child forked from this process fences it."""
    _OPEN.add(store)


def inherited(backend: Backend, fence: str) -> Backend:
    """What a store fenced in a forked child uses instead of `backend` (which is kept, never finalized here)."""
    _KEPT.append(backend)
    return cast("Backend", _Inherited(backend.path, fence))


def _in_child() -> None:
    global generation
    generation += 1
    for store in list(_OPEN):
        try:
            written = store.backend.written_at_fork(store._write_busy)
        except Exception:  # a store fenced by an earlier fork, whose backend raises its fence
            written = None
        if written is not None:
            written_at_fork.add(written)
        store._inherited()


os.register_at_fork(after_in_child=_in_child)
