"""The seal: the log's head written durably to a side file, so a rollback or truncation shows.

A chain proves that what is there links up; it cannot prove that nothing is missing from the end.
The seal can: it records ``(store id, seq, hash, at)`` at some moment. Later the log must still hold
that hash at that seq. The file is JSON, mode 0600, written to a temporary name, fsynced, renamed and
the directory fsynced. Its ``mac`` is blake3 keyed with the store key for a keyed store; for an
unkeyed store it is a checksum that catches damage, not forgery (whoever can rewrite both files can
rewrite history; use a keyed store, or keep the seal where the log's writer cannot reach).

A seal is read the way every file a user names is (`lifecycle_es.files`): a link, a FIFO or a device
where the seal belongs is refused as StoreFormatError, never followed or waited on, and every field
is held to what `write_seal` writes (a seq in 0..2**53-1, hex of the right length, a canonical time).
"""

from __future__ import annotations

import contextlib
import os
import re

import msgspec

from .canonical import canonical_bytes, timestamp
from .chain import seal_mac
from .errors import InvalidInputError, StoreBehindSealError, StoreFormatError, StoreIOError, StoreKeyError
from .files import UNOPENABLE, UnsafeFileError, read_regular
from .values import MAX_SAFE_INTEGER, shown

MAX_SEAL_BYTES = 4096
_HEX = re.compile(r"[0-9a-f]+")


class Seal(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A sealed head: the store it belongs to, the seq and hash of its last event then, and when."""

    store_id: str
    seq: int
    hash: str
    at: str
    key_id: str | None = None


class _SealFile(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    v: int
    seal: Seal
    mac: str


def _payload(sealed: Seal) -> bytes:
    return canonical_bytes(msgspec.to_builtins(sealed))


def write_seal(path: str, sealed: Seal, key: bytes | None) -> None:
    """Write `sealed` to `path` durably (temp file, fsync, rename, directory fsync), mode 0600."""
    data = msgspec.json.encode(_SealFile(v=1, seal=sealed, mac=seal_mac(key, _payload(sealed))))
    directory = os.path.dirname(os.path.abspath(path))
    temp = f"{path}.tmp-{os.getpid()}-{os.urandom(4).hex()}"
    try:
        fd = os.open(temp, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_NOFOLLOW, 0o600)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(temp, path)
        dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise StoreIOError(f"cannot write seal {path!r}: {exc.strerror}") from exc


def read_seal(path: str, key: bytes | None, key_id: str | None) -> Seal:
    """Read and check a seal file; StoreFormatError when it is damaged, forged or not a regular file.

    The file is opened without following a link or blocking (see `lifecycle_es.files`): a link,
    dangling or not, a FIFO or a device where the seal belongs is refused, never read through.
    """
    try:
        data = read_regular(path, limit=MAX_SEAL_BYTES, what="seal")
    except FileNotFoundError:
        raise StoreIOError(f"seal {path!r} does not exist") from None
    except UnsafeFileError as exc:
        if exc.kind == UNOPENABLE:
            raise StoreIOError(f"cannot read seal {path!r}: {exc.strerror}") from exc
        raise StoreFormatError(str(exc.strerror)) from None
    except OSError as exc:
        raise StoreIOError(f"cannot read seal {path!r}: {exc.strerror}") from exc
    try:
        parsed = msgspec.json.decode(data, type=_SealFile)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise StoreFormatError(f"seal {path!r} is not a seal file: {exc}") from None
    if parsed.v != 1:
        raise StoreFormatError(f"seal {path!r} has unknown version {parsed.v}")
    malformed = _malformed(parsed)
    if malformed:
        raise StoreFormatError(f"seal {path!r} is malformed: {malformed}")
    if parsed.seal.key_id != key_id:
        raise StoreKeyError(f"seal {path!r} was made for key id {parsed.seal.key_id}, the store has {key_id}")
    if key_id is not None and key is None:
        # Without the key the MAC cannot be checked; the head comparison below still holds.
        return parsed.seal
    if seal_mac(key, _payload(parsed.seal)) != parsed.mac:
        raise StoreFormatError(f"seal {path!r} fails its {'MAC' if key else 'checksum'}: damaged or forged")
    return parsed.seal


def _malformed(parsed: _SealFile) -> str | None:
    """What is out of range in a decoded seal file, or None. A seal only ever holds what `write_seal`
    writes, so anything else is damage or forgery, refused before its MAC is even looked at."""
    sealed = parsed.seal
    if not 0 <= sealed.seq <= MAX_SAFE_INTEGER:
        return f"seq {shown(sealed.seq)} is outside 0..{MAX_SAFE_INTEGER}"
    for name, value, digits in (("store_id", sealed.store_id, 32), ("hash", sealed.hash, 64),
                                ("key_id", sealed.key_id, 32), ("mac", parsed.mac, 64)):
        if value is not None and (len(value) != digits or not _HEX.fullmatch(value)):
            return f"{name} {shown(value)} is not {digits} lowercase hex digits"
    try:
        canonical = timestamp(sealed.at, "at")
    except InvalidInputError:
        canonical = None
    if canonical != sealed.at:
        return f"at {shown(sealed.at)} is not a UTC timestamp in milliseconds"
    return None


def check_seal(sealed: Seal, *, store_id: bytes, head_seq: int, hash_at_seq: bytes | None) -> None:
    """StoreBehindSealError unless the log still holds the sealed hash at the sealed seq."""
    if sealed.store_id != store_id.hex():
        raise StoreBehindSealError("the seal belongs to a different store", sealed_seq=sealed.seq, head_seq=head_seq)
    if head_seq < sealed.seq:
        raise StoreBehindSealError("the log is shorter than when it was sealed (truncated or an older copy)",
                                   sealed_seq=sealed.seq, head_seq=head_seq)
    if sealed.seq > 0 and (hash_at_seq is None or hash_at_seq.hex() != sealed.hash):
        raise StoreBehindSealError("the event at the sealed seq is not the one sealed (history rewritten)",
                                   sealed_seq=sealed.seq, head_seq=head_seq)
