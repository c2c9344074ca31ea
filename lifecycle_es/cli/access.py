"""How the command line reaches a store: key files, opens that change nothing, and format checks.

A file handed to the command line may be anything: random bytes, another program's database, a
lifecycle-es store an attacker edited. Before any row is read, the store's open checks that the tables
are the store's own (STRICT, with the store's column types), so every value read back has the type
the code expects and a hostile file fails with StoreFormatError, never deeper in the code. Anything
else that differs from the store's schema (a trigger, an index, a constraint, a meta key) does not
stop a read-only open: `EventStore.schema_problems` lists it, and the audit reports each.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, BinaryIO

from lifecycle_es import chain
from lifecycle_es.backends import has_password, is_url, mask_password, open_backend
from lifecycle_es.errors import StoreKeyError
from lifecycle_es.files import (
    NOT_PRIVATE,
    TOO_LARGE,
    UNOPENABLE,
    UnsafeFileError,
    open_regular,
    read_regular,
    text_path,
)
from lifecycle_es.seal import MAX_SEAL_BYTES
from lifecycle_es.store import EventStore

from .exits import EXIT_DATAERR, EXIT_IOERR, EXIT_NOINPUT, EXIT_USAGE, CommandError

if TYPE_CHECKING:
    from lifecycle_es.signing import Signer, Verifier

MAX_KEY_FILE_BYTES = 256
BUSY_TIMEOUT_MS = 5000

# Whoever gives a key believes the store keyed; one that says otherwise may have had its key id removed
# and its chain and seal re-made without the key. Every command given a key refuses it the same way.
DOWNGRADED = ("tampered? a key was given but the {what} claims to be unkeyed: a keyed store whose key id was "
              "removed and whose chain and seal were re-made without the key (a downgrade) looks just like this; "
              "if it was never keyed, run without --key-file")


def file_error(exc: OSError, path: str, what: str) -> CommandError:
    """The exit code and line for a named file `lifecycle_es.files` refused or could not open.

    66 when it does not exist or cannot be opened; 65 when it is a link, a FIFO, a device, a directory
    or too large (not the file it must be); 64 when a secret file is open to group or others.
    """
    if isinstance(exc, FileNotFoundError):
        return CommandError(EXIT_NOINPUT, f"{what} {path!r} does not exist")
    if isinstance(exc, UnsafeFileError):
        code = {NOT_PRIVATE: EXIT_USAGE, UNOPENABLE: EXIT_NOINPUT}.get(exc.kind, EXIT_DATAERR)
        return CommandError(code, str(exc.strerror))
    return CommandError(EXIT_IOERR, f"cannot read {what} {path!r}: {exc.strerror}")


@contextlib.contextmanager
def input_file(path: str, *, what: str, arg: str, limit: int | None = None) -> Iterator[BinaryIO]:
    """The regular file `path` (named as `arg`) opened for reading, never following a link or blocking.

    A refusal is a CommandError (see `file_error`); the file is opened once, so every pass over it
    (``seek(0)``) reads the same file, whatever happens to its name meanwhile.
    """
    path = text_path(path, arg)
    opened = contextlib.ExitStack()
    try:
        fd, _ = opened.enter_context(open_regular(path, limit=limit, what=what))
    except OSError as exc:
        raise file_error(exc, path, what) from None
    with opened, open(fd, "rb", closefd=False) as handle:
        yield handle


def read_key_file(path: str) -> bytes:
    """The 32-byte key in `path`: 32 raw bytes, or 64 hex characters (surrounding whitespace ignored).

    The file must be a regular file that only its owner may use (mode 0600 or stricter, as ssh asks of
    a private key): a key others could read may be theirs already. The key is never echoed: a
    malformed file is reported by its length only.
    """
    path = text_path(path, "--key-file")

    def malformed(size: object) -> CommandError:
        return CommandError(EXIT_USAGE, f"key file {path!r} must hold {chain.KEY_BYTES} raw bytes or "
                                        f"{2 * chain.KEY_BYTES} hex characters (it holds {size} bytes)")

    try:
        data = read_regular(path, limit=MAX_KEY_FILE_BYTES, what="key file", private=True)
    except OSError as exc:
        if isinstance(exc, UnsafeFileError) and exc.kind == TOO_LARGE:
            raise malformed(f"more than {MAX_KEY_FILE_BYTES}") from None
        raise file_error(exc, path, "key file") from None
    if len(data) == chain.KEY_BYTES:
        return data
    text = data.strip()
    if len(text) == 2 * chain.KEY_BYTES:
        try:
            return bytes.fromhex(text.decode("ascii"))
        except (UnicodeDecodeError, ValueError):
            pass
    raise malformed(len(data))


def read_signer(path: str, arg: str = "--sign") -> Signer:
    """The checkpoint signer in the private key file `path` (named as `arg`), or CommandError.

    As `read_key_file`: a regular file only its owner may use (64 otherwise), never echoed (a malformed
    one is named by its size only, 64).
    """
    from lifecycle_es.signing import load_signer

    path = text_path(path, arg)
    try:
        return load_signer(path)
    except OSError as exc:
        raise file_error(exc, path, "signing key") from None
    except StoreKeyError as exc:
        raise CommandError(EXIT_USAGE, str(exc)) from None


def read_trust(paths: list[str]) -> list[Verifier]:
    """The public keys named by ``--trust``: each a regular file holding one key (66 when missing, 65 when
    a link, a FIFO or too large, 64 when it is not a public key of ``lifecycle-es keygen``)."""
    from lifecycle_es.signing import load_verifier

    verifiers = []
    for path in paths:
        path = text_path(path, "--trust")
        try:
            verifiers.append(load_verifier(path))
        except OSError as exc:
            raise file_error(exc, path, "public key") from None
    return verifiers


def require_file(path: str, what: str = "store", arg: str = "FILE") -> str:
    """`path` (named as `arg`) when it is UTF-8 text and something exists there, else CommandError.

    64 for a path that is not UTF-8, 66 when nothing is there; what the file is, the reader decides.
    A store may be a ``postgresql://`` URL instead: whether the server holds one, its open decides;
    one that carries a password is refused (64), since a command line is visible to every user.
    """
    path = text_path(path, arg)
    if what == "store" and is_url(path):
        return require_url(path, arg)
    try:
        os.lstat(path)
    except FileNotFoundError:
        raise CommandError(EXIT_NOINPUT, f"{what} {path!r} does not exist") from None
    return path


def require_url(url: str, arg: str = "FILE") -> str:
    """A store URL as the command line accepts it: never with a password (CommandError 64)."""
    if has_password(url):
        raise CommandError(EXIT_USAGE, f"{arg}: {mask_password(url)} carries a password, and a command line is "
                                       "visible to every user of the machine: put a password in ~/.pgpass (or the "
                                       "file PGPASSFILE names), an sslpassword in a service file (~/.pg_service.conf "
                                       "or PGSERVICEFILE, named by service=), and leave it out of the URL")
    return url


def open_store(path: str, *, key: bytes | None = None, seal: str | bool | None = None,
               need_key: bool = False) -> EventStore:
    """Open the store at `path` read-only, after checking that it is one.

    `seal`: a seal file to check on open, ``None`` for ``<path>.seal`` when it exists, ``False`` for
    none (the audit checks the seal itself, after the replay, so that its report is whole).
    `need_key`: refuse a keyed store opened without its key (StoreKeyError) instead of reading it
    unverified. A key for a store that claims to be unkeyed is refused as tampering (see `DOWNGRADED`).
    """
    require_file(path)
    if isinstance(seal, str):
        require_file(seal, "seal", "--seal")
    # The open checks the file's tables (a hostile one is StoreFormatError before any row is read).
    backend = open_backend(path, busy_timeout_ms=BUSY_TIMEOUT_MS, read_only=True)
    try:
        keyed = backend.meta("key_id") is not None
        if key is not None and not keyed:
            raise CommandError(EXIT_DATAERR, DOWNGRADED.format(what="store"))
        if need_key and keyed and key is None:
            raise StoreKeyError("the store is keyed: its hashes are MACs, so checking them needs --key-file")
        store = EventStore(backend, key=key, now=lambda: time.time_ns() // 1_000_000)
        if seal is not False:
            seal_path = seal if isinstance(seal, str) else None if is_url(path) else path + ".seal"
            # A link there, dangling or not, is read and refused, never skipped.
            if seal_path is not None and os.path.lexists(seal_path):
                store.check_seal(seal_path)
    except BaseException:
        backend.close()
        raise
    return store


def default_seal(path: str, seal: str | None) -> str | None:
    """The seal the audit checks: `seal` when named (it must exist), else ``<path>.seal`` when present.

    Either must be a regular file, not a link, FIFO or device (CommandError 65 before the audit starts).
    """
    if seal is not None:
        seal = require_file(seal, "seal", "--seal")
    elif is_url(path):
        return None  # a server's store has no file beside it: its seal is named
    else:
        beside = text_path(path, "FILE") + ".seal"
        if not os.path.lexists(beside):
            return None
        seal = beside
    with input_file(seal, what="seal", arg="--seal", limit=MAX_SEAL_BYTES):
        pass  # what the file is, checked here; what it holds, by the audit
    return seal
