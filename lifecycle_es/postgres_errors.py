"""The PostgreSQL backend's errors: psycopg's exceptions translated into StoreError kinds, in this one place.

A server's error carries an SQLSTATE and says the statement failed, so its transaction did not commit.
An error without one (the connection lost, the server gone) says nothing of what happened to a COMMIT
in flight: that one outcome is unknown, and the caller (`postgres_write.ServerTransaction`) marks it so.
"""

from __future__ import annotations

from typing import Literal

import psycopg
from psycopg import errors as pg_errors

from .errors import StoreBusyError, StoreError, StoreFormatError, StoreFullError, StoreIOError

NOT_KEPT = "LE001"
"""The SQLSTATE the store's ``advance_head`` function raises when the rows an append wrote are not in the log."""


def translation(action: str, exc: psycopg.Error, where: str) -> StoreError:
    """The StoreError kind of a psycopg error met while doing `action` on the store at `where` (a masked URL)."""
    state = exc.sqlstate
    detail = _first_line(exc)
    if state == NOT_KEPT:
        return StoreFormatError(f"{where} did not keep the write ({detail}): the store's schema was altered "
                                "(a trigger or a rule?), so nothing was appended: audit it (lifecycle-es audit)")
    if isinstance(exc, pg_errors.LockNotAvailable | pg_errors.DeadlockDetected):
        return StoreBusyError(f"{action}: the store in {where} is locked by another session (a writer, or a table "
                              "lock such as ALTER TABLE's) past the busy timeout: retry later, or open the store "
                              "with a longer busy_timeout_ms")
    if isinstance(exc, pg_errors.DiskFull | pg_errors.OutOfMemory):
        return StoreFullError(f"{action}: the server is out of space ({detail})")
    if isinstance(exc, pg_errors.InsufficientPrivilege):
        return StoreIOError(f"{action}: the server refused it: {detail} (grant the role what the README's "
                            "PostgreSQL section lists)")
    if isinstance(exc, pg_errors.ReadOnlySqlTransaction):
        return StoreIOError(f"{action}: the store is read-only ({detail})")
    if isinstance(exc, pg_errors.UndefinedTable | pg_errors.UndefinedColumn | pg_errors.UndefinedFunction):
        return StoreFormatError(f"{action}: {where} is not a lifecycle-es store as this library makes one ({detail})")
    if state is None or isinstance(exc, psycopg.OperationalError):
        return StoreIOError(f"{action}: the connection to {where} failed ({detail}): check that the server is up "
                            "and reachable, then retry")
    if isinstance(exc, psycopg.IntegrityError):
        return StoreError(f"{action}: constraint refused the write ({detail})")
    return StoreError(f"{action}: {detail}")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


class translated:  # lower case: it reads as a function, ``with translated(action, where):``
    """Translate psycopg errors raised inside into StoreError kinds; anything else passes unchanged."""

    __slots__ = ("action", "where")

    def __init__(self, action: str, where: str) -> None:
        self.action = action
        self.where = where

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: object) -> Literal[False]:
        if isinstance(exc, psycopg.Error):
            raise translation(self.action, exc, self.where) from exc
        return False
