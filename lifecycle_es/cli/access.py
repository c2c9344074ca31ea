"""How the command line reaches a store: key files, opens that change nothing, and format checks.

A file handed to the command line may be anything: random bytes, another program's database, a
lifecycle-es store an attacker edited. Before any row is read, the store's open checks that the tables
are the store's own (STRICT, with the store's column types), so every value read back has the type
the code expects and a hostile file fails with StoreFormatError, never deeper in the code. Anything
else that differs from the store's schema (a trigger, an index, a constraint, a meta key) does not
stop a read-only open: `EventStore.schema_problems` lists it, and the audit reports each.
"""

from __future__ import annotations

import argparse
import os
import stat
import time
from collections.abc import Callable

from lifecycle_es import chain
from lifecycle_es.errors import StoreKeyError
from lifecycle_es.sqlite import SqliteBackend
from lifecycle_es.store import EventStore

from .exits import EXIT_NOINPUT, EXIT_USAGE, CommandError

MAX_KEY_FILE_BYTES = 256
BUSY_TIMEOUT_MS = 5000


def read_key_file(path: str) -> bytes:
    """The 32-byte key in `path`: 32 raw bytes, or 64 hex characters (surrounding whitespace ignored).

    The key is never echoed: a malformed file is reported by its length only.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        raise CommandError(EXIT_NOINPUT, f"key file {path!r} does not exist") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise CommandError(EXIT_USAGE, f"key file {path!r} is not a regular file")
        data = os.read(fd, MAX_KEY_FILE_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) == chain.KEY_BYTES:
        return data
    text = data.strip()
    if len(text) == 2 * chain.KEY_BYTES:
        try:
            return bytes.fromhex(text.decode("ascii"))
        except (UnicodeDecodeError, ValueError):
            pass
    raise CommandError(EXIT_USAGE, f"key file {path!r} must hold {chain.KEY_BYTES} raw bytes or "
                                   f"{2 * chain.KEY_BYTES} hex characters (it holds {len(data)} bytes)")


def require_file(path: str, what: str = "store") -> None:
    """CommandError(66) unless something exists at `path` (what it is, the store's own checks decide)."""
    try:
        os.lstat(path)
    except FileNotFoundError:
        raise CommandError(EXIT_NOINPUT, f"{what} {path!r} does not exist") from None


def open_store(path: str, *, key: bytes | None = None, seal: str | bool | None = None,
               need_key: bool = False) -> EventStore:
    """Open the store at `path` read-only, after checking that it is one.

    `seal`: a seal file to check on open, ``None`` for ``<path>.seal`` when it exists, ``False`` for
    none (the audit checks the seal itself, after the replay, so that its report is whole).
    `need_key`: refuse a keyed store opened without its key (StoreKeyError) instead of reading it
    unverified. A key for a store that is not keyed is refused too.
    """
    require_file(path)
    # The open checks the file's tables (a hostile one is StoreFormatError before any row is read).
    backend = SqliteBackend(path, durability="full", busy_timeout_ms=BUSY_TIMEOUT_MS, read_only=True)
    try:
        keyed = backend.meta("key_id") is not None
        if key is not None and not keyed:
            raise StoreKeyError("the store is not keyed: its events were hashed without a key (drop --key-file)")
        if need_key and keyed and key is None:
            raise StoreKeyError("the store is keyed: its hashes are MACs, so checking them needs --key-file")
        store = EventStore(backend, key=key, now=lambda: time.time_ns() // 1_000_000)
        if seal is not False:
            seal_path = seal if isinstance(seal, str) else path + ".seal"
            if isinstance(seal, str):
                require_file(seal_path, "seal")
            if os.path.lexists(seal_path):
                store.check_seal(seal_path)
    except BaseException:
        backend.close()
        raise
    return store


def default_seal(path: str, seal: str | None) -> str | None:
    """The seal the audit checks: `seal` when named (it must exist), else ``<path>.seal`` when present."""
    if seal is not None:
        require_file(seal, "seal")
        return seal
    beside = path + ".seal"
    return beside if os.path.lexists(beside) else None


def int_at_least(minimum: int) -> Callable[[str], int]:
    """An argparse type: an integer of at least `minimum` (0 for a seq, 1 for a count of workers)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{value} is not at least {minimum}")
        return value

    return parse
