"""A savepoint inside the PostgreSQL backend's write transaction: one command of a group commit's batch
(the PostgreSQL form of ``sqlite_savepoint``).

Statements of a write transaction go in pipeline mode, so a server error (an insert that broke a
constraint, ``advance_head`` finding rows missing) surfaces only when the pipeline is synced. A savepoint
syncs when its block ends, so such an error is this command's: it is rolled back to its savepoint alone
and raised from the block's end, and the batch goes on. A connection lost meanwhile ends the whole
transaction: `lost` is set and the exit raises StoreIOError, so the caller fails the whole batch.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Literal

import psycopg

from .errors import StoreIOError
from .postgres_errors import translation

if TYPE_CHECKING:
    from .postgres import PostgresBackend

# One name: savepoints of a batch never nest (each command's is released or rolled back before the next).
_NAME = "command"


class ServerSavepoint:
    """`PostgresBackend.savepoint`: SAVEPOINT, then RELEASE and a sync, or ROLLBACK TO and RELEASE."""

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
                self._sync()
                return False
            except psycopg.Error as error:
                # The block's own statements failed on the server: this command is refused, alone.
                self._roll_back(error)
                raise translation(self.action, error, backend.path) from error
        self._roll_back(exc)
        if isinstance(exc, psycopg.Error):
            raise translation(self.action, exc, backend.path) from exc
        return False

    def _sync(self) -> None:
        pipeline = self.backend._pipeline
        if pipeline is not None:
            pipeline.sync()

    def _roll_back(self, cause: BaseException) -> None:
        backend = self.backend
        backend._pending = self.pending
        backend._tails = {}  # what the rolled-back block read or inserted is no longer the log
        conn = backend.conn
        if conn.broken or conn.closed:
            self.lost = True
            raise StoreIOError(f"{self.action}: the connection to {backend.path} was lost ({cause}), so its batch "
                               "is lost: nothing of it was committed") from cause
        try:
            # A sync first: what was queued before the failure ends (skipped, on an aborted transaction).
            with contextlib.suppress(psycopg.Error):
                self._sync()
            conn.execute(f"ROLLBACK TO SAVEPOINT {_NAME}")
            conn.execute(f"RELEASE SAVEPOINT {_NAME}")
            self._sync()
        except psycopg.Error as error:
            self.lost = True
            raise StoreIOError(f"{self.action}: rolling back to the savepoint failed ({error}), so its batch is "
                               "lost: nothing of it was committed") from cause
