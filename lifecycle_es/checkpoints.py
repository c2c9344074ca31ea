"""Signed checkpoints: the log's head signed with an Ed25519 key, which anyone holding the public key can check.

    signer = load_signer("ops.key")                           # lifecycle_es.signing
    store.checkpoint(signer)                                   # appended to <db>.checkpoints
    lifecycle_es.audit("runners.db", trust="ops.key.pub")      # no secret needed

A seal is a checksum (or a MAC only the store key's holder can check); a checkpoint is a signature:
the log's operator signs ``(store id, seq, head hash, at, key id)`` with a private key, and an auditor
who was handed the public key proves that the log still holds that head, that no two checkpoints
disagree, and that the log did not lose events the checkpoint saw. Nothing here is SQLite's: the
checkpoint speaks of the chain alone, so every backend's log is signed and checked the same way.

The format is a C2SP signed note (https://c2sp.org/signed-note, Go's ``golang.org/x/mod/sumdb/note``)
whose text follows the C2SP tlog-checkpoint layout: an origin line, the size, the head hash in base64,
then extension lines. One checkpoint::

    lifecycle-es/6f0c...e1                 origin: the store id, 32 hex digits
    12                                     the head's seq (the log's size: seqs run 1..n)
    q0Kj...=                               the head's hash, standard base64 of 32 bytes
    at 2026-03-02T10:00:00.000Z            when it was signed (never before the head's own at)
    key-id 9a1b...77                       the chain key's id of a keyed store, or ``none``
                                           (a blank line)
    — ops.example Ab3x...==                U+2014, space, key name, space, base64(key hash || signature)

The signature is Ed25519 over the text (the five lines, each ending in a newline); the key hash is the
first 4 bytes of SHA-256(name || "\\n" || 0x01 || public key), as the signed-note spec recommends. A
checkpoint file holds such notes one after the other, each followed by one blank line; it is only
ever appended to, under a lock, so its checkpoints run in seq order. The keys are Go note keys
(`lifecycle_es.signing`), so ``note.NewVerifier`` and ``note.Open`` in Go check these
checkpoints as they are.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .canonical import iso_ms, timestamp
from .errors import InvalidInputError, StoreIOError, StoreKeyError
from .files import TOO_LARGE, UnsafeFileError, open_regular, text_path
from .signing import NAME, Signer, Verifier, b64, unb64
from .values import MAX_SAFE_INTEGER, shown

if TYPE_CHECKING:
    from .store import EventStore

ORIGIN = "lifecycle-es/"
DASH = "\u2014 "
MAX_SIGNATURES = 100  # per note, Go's cap
MAX_LINE_BYTES = 1024  # a checkpoint's longest line is a signature line of a long name: ~220 bytes
MAX_CHECKPOINTS_BYTES = 256 << 20  # a million checkpoints: one every 1000 events of a billion-event log
_HEX32 = re.compile(r"[0-9a-f]{32}")
_SEQ = re.compile(r"0|[1-9][0-9]{0,15}")


# --- the checkpoint and its note --------------------------------------------------------------------


@dataclass(frozen=True)
class Checkpoint:
    """A signed claim about a log: its store id and head (seq, hash), when, and the chain key's id (hex)."""

    store_id: str
    seq: int
    hash: str
    at: str
    key_id: str | None

    def text(self) -> str:
        """The note text the signatures cover (see the module)."""
        return (f"{ORIGIN}{self.store_id}\n{self.seq}\n{b64(bytes.fromhex(self.hash))}\n"
                f"at {self.at}\nkey-id {self.key_id or 'none'}\n")


def sign_checkpoint(checkpoint: Checkpoint, signer: Signer) -> str:
    """The whole signed note of `checkpoint`: its text, a blank line, one signature line."""
    text = checkpoint.text()
    signature = signer.sign(text.encode())
    return f"{text}\n{DASH}{signer.verifier.name} {b64(signer.verifier.hash + signature)}\n"


def parse_text(lines: list[str]) -> Checkpoint | str:
    """The checkpoint the five text lines of a note state, or why they state none."""
    if len(lines) != 5:
        return f"{len(lines)} text lines where a checkpoint has 5"
    origin, seq, digest, at, key_id = lines
    if not origin.startswith(ORIGIN) or not _HEX32.fullmatch(origin[len(ORIGIN):]):
        return f"origin {shown(origin)} is not {ORIGIN}<store id>"
    if not _SEQ.fullmatch(seq) or int(seq) > MAX_SAFE_INTEGER:
        return f"seq {shown(seq)} is not a seq"
    raw = unb64(digest)
    if raw is None or len(raw) != 32:
        return f"head hash {shown(digest)} is not 32 bytes in base64"
    try:
        canonical = timestamp(at[3:], "at") if at.startswith("at ") else None
    except (ValueError, OverflowError):  # InvalidInputError is a ValueError
        canonical = None
    if canonical is None or canonical != at[3:]:
        return f"{shown(at)} is not 'at' and a UTC time in milliseconds"
    key = key_id[7:] if key_id.startswith("key-id ") else ""
    if key != "none" and not _HEX32.fullmatch(key):
        return f"{shown(key_id)} is not 'key-id' and a key id or 'none'"
    return Checkpoint(origin[len(ORIGIN):], int(seq), raw.hex(), at[3:], None if key == "none" else key)


def parse_signature(line: str) -> tuple[str, bytes, bytes] | str:
    """(key name, key hash, signature) of a signature line, or why it is not one."""
    parts = line[len(DASH):].split(" ") if line.startswith(DASH) else []
    data = unb64(parts[1]) if len(parts) == 2 else None
    if data is None or len(data) < 5 or not NAME.fullmatch(parts[0]):
        return f"{shown(line)} is not a signature line ('— name base64')"
    return parts[0], data[:4], data[4:]


@dataclass(frozen=True)
class Note:
    """One note of a checkpoint file: where it starts (line), its text, its checkpoint (or why none), its
    signature lines as (name, key hash, signature), and a reason when the note as a whole is malformed."""

    line: int
    text: str
    checkpoint: Checkpoint | None
    signatures: tuple[tuple[str, bytes, bytes], ...]
    malformed: str | None = None

    def whole(self) -> str:
        """The note as written: text, blank line, signature lines."""
        return self.text + "\n" + "".join(f"{DASH}{name} {b64(kh + sig)}\n" for name, kh, sig in self.signatures)


def _groups(lines: Iterator[tuple[int, str]]) -> Iterator[tuple[int, list[str], str | None]]:
    """(first line, lines, why broken or None) of each run of lines between blank lines."""
    start, group, broken = 0, list[str](), None
    for number, line in lines:
        if line == "\n":
            if group:
                yield start, group, broken
            start, group, broken = 0, [], None
            continue
        if not group:
            start = number
        if not line.endswith("\n"):
            broken = f"line {number} ends without a newline: the file was cut short"
        elif broken is None and any(ch < " " or ch == "\x7f" for ch in line[:-1]):
            broken = f"line {number} holds a control character"
        group.append(line.rstrip("\n"))
    if group:
        yield start, group, broken


def notes(lines: Iterator[tuple[int, str]]) -> Iterator[Note]:
    """The notes of a checkpoint file given as (line number, text with its newline): a run of text lines,
    a blank line, a run of signature lines. A malformed note is yielded with its reason, and reading
    goes on with the next run of lines."""
    pending: tuple[int, list[str], str | None] | None = None
    for group in _groups(lines):
        start, body, _ = group
        if body[0].startswith(DASH):
            if pending is None:
                yield Note(start, "", None, (), f"line {start}: signature lines with no checkpoint above them")
                continue
            yield _note(pending, group)
            pending = None
            continue
        if pending is not None:
            yield Note(pending[0], "", None, (), f"line {pending[0]}: a checkpoint with no signature")
        pending = group
    if pending is not None:
        yield Note(pending[0], "", None, (), f"line {pending[0]}: a checkpoint with no signature (the file was "
                                             "cut short?)")


def _note(text_group: tuple[int, list[str], str | None], signature_group: tuple[int, list[str], str | None]) -> Note:
    start, body, broken = text_group
    text = "".join(line + "\n" for line in body)
    broken = broken or signature_group[2]
    if broken:
        return Note(start, text, None, (), broken)
    parsed = parse_text(body)
    if isinstance(parsed, str):
        return Note(start, text, None, (), f"line {start}: {parsed}")
    if len(signature_group[1]) > MAX_SIGNATURES:
        return Note(start, text, None, (), f"line {start}: more than {MAX_SIGNATURES} signatures")
    signatures = []
    for offset, line in enumerate(signature_group[1]):
        signature = parse_signature(line)
        if isinstance(signature, str):
            return Note(start, text, None, (), f"line {signature_group[0] + offset}: {signature}")
        signatures.append(signature)
    return Note(start, text, parsed, tuple(signatures))


def read_notes(path: str) -> Iterator[Note]:
    """The notes of the checkpoint file at `path`, streamed, lines bounded (see `lifecycle_es.files`)."""
    with open_regular(path, limit=MAX_CHECKPOINTS_BYTES, what="checkpoint file") as (fd, _), \
            open(fd, "rb", closefd=False) as handle:
        yield from notes(_lines(handle, path))


def _lines(handle: object, path: str) -> Iterator[tuple[int, str]]:
    number = total = 0
    while True:
        line: bytes = handle.readline(MAX_LINE_BYTES + 1)  # type: ignore[attr-defined]
        if not line:
            return
        number += 1
        total += len(line)
        if len(line) > MAX_LINE_BYTES or total > MAX_CHECKPOINTS_BYTES:  # the file may grow while it is read
            raise UnsafeFileError(errno.EFBIG, f"checkpoint file {path!r}: line {number} is longer than "
                                               f"{MAX_LINE_BYTES} bytes or past {MAX_CHECKPOINTS_BYTES} bytes in "
                                               "all: not a checkpoint file", kind=TOO_LARGE)
        yield number, line.decode("utf-8", "replace")


def default_path(store_path: str) -> str:
    """``<db>.checkpoints`` beside a store file; InvalidInputError("path") for a store that is no file (a
    server's URL), whose checkpoint file must be named."""
    if "://" in store_path:
        raise InvalidInputError("path", f"the store {store_path.split('@')[-1]!r} is not a file: name the "
                                        "checkpoint file to use")
    return text_path(store_path + ".checkpoints", "path")


# --- signing -----------------------------------------------------------------------------------------


def append_checkpoint(store: EventStore, signer: Signer, path: str) -> Checkpoint:
    """Sign the store's head and append it to the checkpoint file `path` (created 0600), durably.

    The head is read under an exclusive lock on the file, so checkpoints appended by several processes
    land in seq order. The file must be a regular file, not a link or a FIFO (StoreIOError otherwise).
    """
    if not isinstance(signer, Signer):
        raise InvalidInputError("signer", f"signer is invalid: {type(signer).__name__} is not a Signer "
                                          "(lifecycle_es.checkpoints.load_signer)")
    try:
        created = not os.path.lexists(path)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
                     | os.O_NOCTTY, 0o600)
    except OSError as exc:
        what = "is a symbolic link" if exc.errno == errno.ELOOP else f"cannot be opened: {exc.strerror}"
        raise StoreIOError(f"checkpoint file {path!r} {what}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise StoreIOError(f"checkpoint file {path!r} is not a regular file")
        fcntl.flock(fd, fcntl.LOCK_EX)
        head = store.head()
        if head.seq == 0 and not head.hash:
            raise StoreKeyError("an empty keyed store opened without its key has no head hash to sign")
        at = iso_ms(store.now())
        checkpoint = Checkpoint(store.store_id.hex(), head.seq, head.hash.hex(),
                                max(at, head.at) if head.at else at, store.key_id)
        os.write(fd, (sign_checkpoint(checkpoint, signer) + "\n").encode())
        os.fsync(fd)
    except OSError as exc:
        raise StoreIOError(f"cannot write checkpoint file {path!r}: {exc.strerror}") from None
    finally:
        os.close(fd)
    if created:
        with contextlib.suppress(OSError):
            directory = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY | os.O_DIRECTORY)
            try:
                os.fsync(directory)
            finally:
                os.close(directory)
    return checkpoint


__all__ = ["Checkpoint", "Note", "Signer", "Verifier", "append_checkpoint", "default_path", "notes", "parse_signature",
           "parse_text", "read_notes", "sign_checkpoint"]
