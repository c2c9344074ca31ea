"""The SQLite backend's errors: apsw's exceptions translated into StoreError kinds, in this one place.

Most specific first, ``from exc`` so the extended result code stays reachable. A failed fsync at
COMMIT is the one error whose outcome is unknown (`SYNC_FAILURES`): the commit's frames may be on the
disk, so it is never retried and the store fences itself.
"""

from __future__ import annotations

from typing import Literal

import apsw

from .errors import StoreBusyError, StoreError, StoreFormatError, StoreFullError, StoreIOError

# A failed fsync leaves a commit's outcome unknown (its frames may be on the disk): never retried.
SYNC_FAILURES = frozenset({apsw.SQLITE_IOERR_FSYNC, apsw.SQLITE_IOERR_DIR_FSYNC})


def translation(action: str, exc: apsw.Error) -> StoreError:
    """The StoreError kind of an apsw error, most specific first (the only place that maps them)."""
    if isinstance(exc, apsw.BusyError):
        return StoreBusyError(f"{action}: the store is locked by another writer (busy timeout passed)")
    if isinstance(exc, apsw.FullError):
        return StoreFullError(f"{action}: the disk is full")
    if isinstance(exc, apsw.NotADBError | apsw.CorruptError):
        return StoreFormatError(f"{action}: the file is not a valid SQLite database ({exc})")
    if isinstance(exc, apsw.ReadOnlyError):
        return StoreIOError(f"{action}: the store is read-only ({exc})")
    if isinstance(exc, apsw.IOError | apsw.CantOpenError | apsw.PermissionsError):
        return StoreIOError(f"{action}: {exc}")
    if isinstance(exc, apsw.ConstraintError):
        return StoreError(f"{action}: constraint refused the write ({exc})")
    return StoreError(f"{action}: {exc}")


class translated:  # lower case: it reads as the function it replaced, ``with translated(action):``
    """Translate apsw errors raised inside into StoreError kinds; anything else passes unchanged.

    A class, not a ``@contextmanager`` generator: an append enters several of these, and a generator
    costs a few microseconds each to make, enter and leave.
    """

    __slots__ = ("action",)

    def __init__(self, action: str) -> None:
        self.action = action

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: object) -> Literal[False]:
        if isinstance(exc, apsw.Error):
            raise translation(self.action, exc) from exc
        return False
