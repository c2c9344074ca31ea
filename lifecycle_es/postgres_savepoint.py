"""One command of a group commit's batch inside the PostgreSQL backend's write transaction (the PostgreSQL
form of ``sqlite_savepoint``), at no round trip of its own when the command only appends.

A command's block keeps the rows it appends instead of sending them; when it ends well they join the
batch's, and the batch's rows go to the server in one call before COMMIT. A block that raises drops its
rows and the head and versions it moved: nothing of it reached the server, so nothing there is rolled
back. Only when the block sends a statement of its own (a read, a snapshot, a host lease) does it become
a real savepoint: the batch's rows are sent first, then SAVEPOINT, then the block's own rows, so that the
statement sees the log as the commands before it left it; such a block ends with RELEASE, or with
ROLLBACK TO and RELEASE, its error its own.

The batch's rows are the log's next seqs under the head table's lock, so the server refuses them only when
the store was tampered with (a planted rule or trigger): then the whole batch fails. When sending them
fails inside a block, or the connection is lost, the transaction is gone: `lost` is set and the block's
exit raises StoreIOError, so the caller fails the whole batch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

import psycopg

from .errors import StoreIOError
from .postgres_errors import translation

if TYPE_CHECKING:
    from .backend import Row
    from .postgres import PostgresBackend

# One name: savepoints of a batch never nest (each command's is released or rolled back before the next).
_NAME = "command"


def send_deferred(backend: PostgresBackend) -> None:
    """Before a statement inside a write transaction: send the batch's rows, then open the open block's
    savepoint and send its rows. A failure marks the transaction failed (every block after it is lost)."""
    batch, backend._batch = backend._batch, []
    block = backend._block
    try:
        if batch:
            backend.send(batch)
        if block is not None and not block.opened:
            block.opened = True
            backend.conn.execute(f"SAVEPOINT {_NAME}")
            rows, block.rows = block.rows, []
            if rows:
                backend.send(rows)
    except BaseException:
        backend._failed = True
        raise


class ServerSavepoint:
    """`PostgresBackend.savepoint`: a command's block, a savepoint on the server only once it sends a statement."""

    __slots__ = ("action", "backend", "head", "lost", "opened", "pending", "rows", "versions")

    def __init__(self, backend: PostgresBackend, action: str) -> None:
        self.backend = backend
        self.action = action
        self.lost = False
        self.opened = False
        self.rows: list[Row] = []
        self.pending: tuple[int, bytes] | None = None
        self.head: tuple[int, bytes | None, str | None] | None = None
        self.versions: dict[str, int] = {}

    def __enter__(self) -> ServerSavepoint:
        backend = self.backend
        self.pending, self.head, self.versions = backend._pending, backend._head, dict(backend._versions)
        backend._block = self
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: object) -> Literal[False]:
        backend = self.backend
        backend._block = None
        if backend._failed or backend.conn.broken or backend.conn.closed:
            self.lost = True
            self._restore()
            raise StoreIOError(f"{self.action}: the batch's transaction failed on {backend.path} ({exc}), so the "
                               "batch is lost: nothing of it was committed") from exc
        if not self.opened:
            if exc is None:
                backend._batch.extend(self.rows)
                return False
            self._restore()  # nothing of the block reached the server
            if isinstance(exc, psycopg.Error):
                raise translation(self.action, exc, backend.path) from exc
            return False
        if exc is None:
            try:
                if self.rows:
                    backend.send(self.rows)  # appended after the block's last statement
                backend.conn.execute(f"RELEASE SAVEPOINT {_NAME}")
                return False
            except psycopg.Error as error:
                # The block's own statements failed on the server: this command is refused, alone.
                self._roll_back(error)
                raise translation(self.action, error, backend.path) from error
            except BaseException as error:
                self._roll_back(error)
                raise
        self._roll_back(exc)
        if isinstance(exc, psycopg.Error):
            raise translation(self.action, exc, backend.path) from exc
        return False

    def _restore(self) -> None:
        """Put back the head, versions and pending event as they were when the block began."""
        backend = self.backend
        backend._pending, backend._head, backend._versions = self.pending, self.head, self.versions

    def _roll_back(self, cause: BaseException) -> None:
        backend = self.backend
        self._restore()  # what the rolled-back block read or inserted is no longer the log
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
