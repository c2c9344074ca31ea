"""A savepoint inside the SQLite backend's write transaction: one command of a group commit's batch.

    with backend.write("batch"):
        with backend.savepoint("acquire_lease"):
            ...                      # raises: this block's writes are gone, the transaction goes on

SQLite ends the whole transaction by itself on some errors (a full disk, an I/O error, a busy lock,
no memory); then there is no savepoint left to roll back to, and the exit raises StoreIOError (StoreFullError
for a full disk) saying that the transaction was lost, so the caller fails the whole batch rather than
commit what is left. So does a block whose work caught that error and went on, and a savepoint begun
after it: outside a transaction, SAVEPOINT and RELEASE would commit each later command alone.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

import apsw

from .errors import StoreFullError, StoreIOError
from .sqlite_errors import translation

if TYPE_CHECKING:
    from .sqlite import SqliteBackend

# One name: savepoints of a batch never nest (each command's is released or rolled back before the next).
_NAME = "command"


def _outside(conn: apsw.Connection) -> bool:
    """Whether no transaction is open on `conn`: ended by SQLite, or the connection closed under the batch (a
    command's work that closed its store), whose driver error would reach the callers untranslated."""
    try:
        return bool(conn.getautocommit())
    except apsw.ConnectionClosedError:
        return True


class SqliteSavepoint:
    """`SqliteBackend.savepoint`: SAVEPOINT, then RELEASE, or ROLLBACK TO and RELEASE when the block raised.

    A rollback also drops what the connection knows of the log's end (``sqlite_write.LogEnd``):
    `total_changes` does not go back with the rows, so what was read or written inside the savepoint
    would otherwise pass for the head.
    """

    __slots__ = ("action", "backend", "lost")

    def __init__(self, backend: SqliteBackend, action: str) -> None:
        self.backend = backend
        self.action = action
        self.lost = False

    def __enter__(self) -> SqliteSavepoint:
        if _outside(self.backend.conn):
            # Outside a transaction SAVEPOINT begins one of its own, which RELEASE commits: this command alone.
            self.lost = True
            raise StoreIOError(f"{self.action}: the batch's write transaction is no longer open, so its batch is "
                               "lost: nothing of it was committed")
        try:
            self.backend.conn.execute(f"SAVEPOINT {_NAME}")
        except apsw.Error as exc:
            raise translation(self.action, exc) from exc
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: object) -> Literal[False]:
        backend = self.backend
        conn = backend.conn
        if exc is None:
            if _outside(conn):
                # The block went on past the error that ended the transaction (it caught it): the commands after
                # it would each commit alone, outside the batch.
                self.lost = True
                backend.log_end.forget()
                raise StoreIOError(f"{self.action}: the database ended the write transaction while this command ran "
                                   "(its work went on past the error), so its batch is lost: nothing of it was "
                                   "committed")
            try:
                conn.execute(f"RELEASE {_NAME}")
            except apsw.Error as error:
                # Refused, so its writes must go: left in place, the batch's COMMIT would keep them.
                self._undo(error)
                raise translation(self.action, error) from error
            return False
        backend.log_end.forget()
        if _outside(conn):
            self.lost = True
            # A full disk stays a StoreFullError, as a lone command's is; the batch's loss is told in the message.
            kind = StoreFullError if isinstance(exc, StoreFullError | apsw.FullError) else StoreIOError
            raise kind(f"{self.action}: the database ended the write transaction ({exc}), so its batch "
                       "is lost: nothing of it was committed") from exc
        self._undo(exc)
        if isinstance(exc, apsw.Error):
            raise translation(self.action, exc) from exc
        return False

    def _undo(self, cause: BaseException) -> None:
        """Roll the block's writes back and end the savepoint; when that fails (or the database ended the
        transaction meanwhile), `lost` and StoreIOError: the whole batch must fail, nothing of it committed."""
        backend = self.backend
        backend.log_end.forget()
        conn = backend.conn
        try:
            if _outside(conn):
                raise apsw.SQLError("the write transaction is no longer open")
            conn.execute(f"ROLLBACK TO {_NAME}")
            conn.execute(f"RELEASE {_NAME}")
        except apsw.Error as error:
            self.lost = True
            raise StoreIOError(f"{self.action}: rolling back to the savepoint failed ({error}), so its batch is "
                               "lost: nothing of it was committed") from cause
