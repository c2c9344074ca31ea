"""The SQLite backend's pragma profile: each connection setting a small named function, read back once set.

A value that does not read back as set is a StorePragmaError naming the pragma, what was wanted and
what was got: a build or a VFS that silently ignores a setting must not leave a store less durable
than its owner asked for.
"""

from __future__ import annotations

from typing import Any

import apsw

from .errors import StorePragmaError

DURABILITY = {"full": 2, "normal": 1}
"""``durability`` names and the ``synchronous`` level each sets."""

def _pragma(conn: apsw.Connection, name: str) -> Any:
    return conn.execute(f"PRAGMA {name}").fetchall()[0][0]


def _expect(conn: apsw.Connection, name: str, wanted: Any) -> None:
    got = _pragma(conn, name)
    if got != wanted:
        raise StorePragmaError(name, wanted, got)


def set_journal_mode_wal(conn: apsw.Connection) -> None:
    """WAL: readers never block the writer, and a commit is one append to the -wal file."""
    got = conn.execute("PRAGMA journal_mode=wal").fetchall()[0][0]
    if str(got).lower() != "wal":
        raise StorePragmaError("journal_mode", "wal", got)


def set_synchronous(conn: apsw.Connection, durability: str) -> None:
    """FULL syncs the WAL on every commit; NORMAL may lose the last commits on power loss (not on a crash)."""
    conn.execute(f"PRAGMA synchronous={DURABILITY[durability]}")
    _expect(conn, "synchronous", DURABILITY[durability])


def set_foreign_keys(conn: apsw.Connection) -> None:
    """Foreign keys on, so read models that reference each other stay consistent."""
    conn.execute("PRAGMA foreign_keys=ON")
    _expect(conn, "foreign_keys", 1)


def set_busy_timeout(conn: apsw.Connection, busy_timeout_ms: int) -> None:
    """How long a writer waits for the lock before StoreBusyError."""
    conn.set_busy_timeout(busy_timeout_ms)
    _expect(conn, "busy_timeout", busy_timeout_ms)


def set_trusted_schema_off(conn: apsw.Connection) -> None:
    """A hostile file's schema may not call functions with side effects from views or triggers."""
    conn.execute("PRAGMA trusted_schema=OFF")
    _expect(conn, "trusted_schema", 0)


def set_recursive_triggers(conn: apsw.Connection) -> None:
    """Recursive triggers on, so INSERT OR REPLACE cannot overwrite an event.

    Only with them on does the row deletion a REPLACE makes fire the append-only trigger.
    """
    conn.execute("PRAGMA recursive_triggers=ON")
    _expect(conn, "recursive_triggers", 1)


def apply_profile(conn: apsw.Connection, *, durability: str, busy_timeout_ms: int) -> None:
    """Set every pragma of the profile and read each one back; StorePragmaError on a mismatch."""
    set_busy_timeout(conn, busy_timeout_ms)
    set_trusted_schema_off(conn)
    set_journal_mode_wal(conn)
    set_synchronous(conn, durability)
    set_foreign_keys(conn)
    set_recursive_triggers(conn)


def apply_read_profile(conn: apsw.Connection, *, busy_timeout_ms: int, immutable: bool = False) -> None:
    """The profile of a read-only connection: nothing is changed on the file, WAL must already be on.

    An immutable open (read-only media, no -wal) reads journal_mode as "delete" whatever the header
    says; the check guards the durability of writes, and no write can happen there.
    """
    set_busy_timeout(conn, busy_timeout_ms)
    set_trusted_schema_off(conn)
    if not immutable:
        _expect(conn, "journal_mode", "wal")
