"""A savepoint inside the PostgreSQL backend's write transaction: one command of a group commit's batch
(the PostgreSQL form of ``sqlite_savepoint``).

A server error in the block (an insert that broke a constraint, ``advance_head`` finding rows missing)
is this command's: it is rolled back to its savepoint alone and raised from the block, and the batch
goes on. A connection lost meanwhile ends the whole
transaction: `lost` is set and the exit raises StoreIOError, so the caller fails the whole batch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

import psycopg

from .errors import StoreIOError
from .postgres_errors import translation

if TYPE_CHECKING:
    from .postgres import PostgresBackend

# One name: savepoints of a batch never nest (each command's is released or rolled back before the next).
_NAME = "command"


class ServerSavepoint:
    """`PostgresBackend.savepoint`: SAVEPOINT, then RELEASE, or ROLLBACK TO and RELEASE."""

    __slots__ = ("action", "backend", "lost", "pending")

    def __init__(self, backend: PostgresBackend, action: str) -> None:
        self.backend = backend
        self.action = action
        self.lost = False
        self.pending = 0

    def __enter__(self) -> ServerSavepoint:
        self.pending = self.backend._pending
        try:
            self.backend.conn.execute(f"SAVEPOINT {_NAME}")
        except psycopg.Error as exc:
            raise translation(self.action, exc, self.backend.path) from exc
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: object) -> Literal[False]:
        backend = self.backend
        if exc is None:
            try:
                backend.conn.execute(f"RELEASE SAVEPOINT {_NAME}")
                return False
            except psycopg.Error as error:
                # The block's own statements failed on the server: this command is refused, alone.
                self._roll_back(error)
                raise translation(self.action, error, backend.path) from error
        self._roll_back(exc)
        if isinstance(exc, psycopg.Error):
            raise translation(self.action, exc, backend.path) from exc
        return False

    def _roll_back(self, cause: BaseException) -> None:
        backend = self.backend
        backend._pending = self.pending
        backend._forget()  # what the rolled-back block read or inserted is no longer the log
        conn = backend.conn
        if conn.broken or conn.closed:
            self.lost = True
            raise StoreIOError(f"{self.action}: the connection to {backend.path} was lost ({cause}), so its batch "
                               "is lost: nothing of it was committed") from cause
        try:
            conn.execute(f"ROLLBACK TO SAVEPOINT {_NAME}; RELEASE SAVEPOINT {_NAME}")
        except psycopg.Error as error:
            self.lost = True
            raise StoreIOError(f"{self.action}: rolling back to the savepoint failed ({error}), so its batch is "
                               "lost: nothing of it was committed") from cause
