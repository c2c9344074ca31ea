"""``lifecycle-es export`` and ``lifecycle-es import``: a log as JSON lines, and back into a new file.

    lifecycle-es export runners.db runners.jsonl       every row, all columns, bytes as hex
    lifecycle-es import runners.jsonl restored.db      verified, written exactly, verified again
    lifecycle-es import runners.jsonl 'postgresql://db.example/fleet?schema=fleet'   the same, onto a server

A store is a file or a ``postgresql://`` URL on either side, so the two move a store between SQLite and
PostgreSQL (and back) with its chain, hash for hash.

The first line is a header: ``{"format": "lifecycle-es-export", "version": 1, "store_id", "key_id",
"events", "head_seq", "head_hash"}``; each line after it is one row ``{"seq", "stream", "version",
"type", "at", "body", "prev", "hash"}`` with ``body``, ``prev`` and ``hash`` in hex. Import keeps the
store id (the chain's genesis derives from it) and the rows' bytes, so the new file's chain is the old
one, hash for hash. Neither command overwrites a file or a server's store (exit 73); an export is
written 0600, like a store.

Signed checkpoints travel too: the export of a store with a checkpoint file (``FILE.checkpoints``, or
``--checkpoints CP``) says how many in its header (``"checkpoints": N``, left out when none) and
carries each after the rows as ``{"checkpoint": "<the signed note>"}``; import writes them, byte for
byte, to ``FILE.checkpoints`` of the new store (a server's store names its file with ``--checkpoints``).
The store id and every hash are kept, so each still verifies against the imported log
(``lifecycle-es audit NEW --trust KEY.pub``).
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import os
from collections.abc import Iterator
from typing import IO, Any, BinaryIO

import msgspec

from lifecycle_es import chain
from lifecycle_es.backend import Row
from lifecycle_es.backends import create_store, is_url, remove_store, store_exists
from lifecycle_es.checkpoints import Note, notes, read_notes
from lifecycle_es.errors import StoreKeyError
from lifecycle_es.files import text_path
from lifecycle_es.store import EventStore

from .access import DOWNGRADED, file_error, input_file, open_store, read_key_file, require_file
from .exits import EXIT_CANTCREAT, EXIT_DATAERR, EXIT_OK, EXIT_USAGE, CommandError, printable
from .render import Progress

FORMAT = "lifecycle-es-export"
FORMAT_VERSION = 1
# An export line is one event: its body in hex (an event body is at most 512 KiB, the store's bound)
# and a few hundred bytes of other columns. A longer line is not an export's; it is refused once that
# many bytes are read, never read whole to find that out (the file itself may be any size).
MAX_EVENT_BODY_BYTES = 512 << 10
MAX_LINE_BYTES = 2 * MAX_EVENT_BODY_BYTES + (64 << 10)


class ExportHeader(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, omit_defaults=True):
    """The first line of an export: what store the rows belong to and where its chain ends."""

    format: str
    version: int
    store_id: str
    key_id: str | None
    events: int
    head_seq: int
    head_hash: str | None
    checkpoints: int = 0


class ExportCheckpoint(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One signed checkpoint, after the rows: the note as its checkpoint file holds it."""

    checkpoint: str


class ExportRow(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One row of the events table, its byte columns in hex."""

    seq: int
    stream: str
    version: int
    type: str
    at: str
    body: str
    prev: str
    hash: str


def register(subparsers: Any) -> None:
    """Add the ``export`` and ``import`` subcommands."""
    export = subparsers.add_parser(
        "export", help="write every row of the log as JSON lines (bytes as hex), after a header line",
        description="Write the log to OUT: a header line (store id, key id, head), then one JSON line per row "
                    "with every column. OUT must not exist; it is created 0600.")
    export.add_argument("file", metavar="FILE", help="the store file, or a postgresql:// URL")
    export.add_argument("out", metavar="OUT.jsonl", help="the export to write")
    export.add_argument("--checkpoints", metavar="CP",
                        help="the signed checkpoints to carry (default: FILE.checkpoints when present)")
    export.set_defaults(run=run_export)

    restore = subparsers.add_parser(
        "import", help="restore an export into a NEW store file, chain verified before and after",
        description="Verify the export's whole chain, write its rows exactly into a new store FILE (same store "
                    "id, so the chain is unchanged), then verify FILE. FILE must not exist.")
    restore.add_argument("source", metavar="IN.jsonl", help="an export written by `lifecycle-es export`")
    restore.add_argument("file", metavar="FILE", help="the new store file, or a postgresql:// URL whose schema "
                                                      "holds no store yet")
    restore.add_argument("-k", "--key-file", metavar="K", help="the key of a keyed store's export")
    restore.add_argument("--checkpoints", metavar="CP",
                         help="where to write the export's signed checkpoints (default: FILE.checkpoints; a "
                              "postgresql:// store needs one when the export carries any)")
    restore.set_defaults(run=run_import)


# --- export -----------------------------------------------------------------------------------------


def run_export(args: argparse.Namespace) -> int:
    """Write the export, no-clobber, and say what it holds."""
    require_file(args.file)
    _refuse_existing(args.out, "OUT.jsonl")
    encoder = msgspec.json.Encoder()
    signed = _signed(args.checkpoints, args.file)
    with open_store(args.file) as store, store.backend.read_tx("export"), _new_file(args.out) as out:
        head = store.head()
        out.write(encoder.encode(ExportHeader(
            format=FORMAT, version=FORMAT_VERSION, store_id=store.store_id.hex(), key_id=store.key_id,
            events=head.seq, head_seq=head.seq, head_hash=head.hash.hex() if head.seq else None,
            checkpoints=len(signed))) + b"\n")
        bar = Progress("export", head.seq)
        try:  # erased however the export ends: an error's line starts a line of its own
            for recorded in store.read():
                out.write(encoder.encode(ExportRow(
                    seq=recorded.seq, stream=recorded.stream, version=recorded.version, type=recorded.type,
                    at=recorded.at, body=recorded.body.hex(), prev=recorded.prev.hex(), hash=recorded.hash.hex(),
                )) + b"\n")
                if recorded.seq % 1000 == 0:
                    bar.update(recorded.seq)
            bar.update(head.seq)  # the last rows too: a bar never stops short of its end
        finally:
            bar.close()
        for note in signed:
            out.write(encoder.encode(ExportCheckpoint(checkpoint=note.whole())) + b"\n")
    print(printable(f"exported {head.seq:,} events of {args.file} to {args.out}"
                    + (f" (head seq {head.seq:,}, hash {head.hash.hex()})" if head.seq else "")
                    + (f" and {len(signed):,} signed checkpoint(s)" if signed else "")))
    return EXIT_OK


def _signed(named: str | None, store: str) -> list[Note]:
    """The notes of the checkpoint file to carry: `named` (it must exist), else ``<store>.checkpoints`` when
    there. A malformed note is refused (65): an export carries checkpoints exactly or not at all."""
    path = require_file(named, "checkpoint file", "--checkpoints") if named is not None else store + ".checkpoints"
    if named is None and not os.path.lexists(path):
        return []
    try:
        found = list(read_notes(path))
    except OSError as exc:
        raise file_error(exc, path, "checkpoint file") from None
    for note in found:
        if note.malformed is not None:
            raise CommandError(EXIT_DATAERR, f"checkpoint file {path}: {note.malformed}: audit it before it is "
                                             "exported")
    return found


def _refuse_existing(path: str, arg: str) -> None:
    if os.path.lexists(text_path(path, arg)):
        raise CommandError(EXIT_CANTCREAT, f"{path!r} exists; it is not overwritten")


@contextlib.contextmanager
def _new_file(path: str) -> Iterator[IO[bytes]]:
    """A file written under a temporary name, synced, then linked to `path` (never over another file)."""
    directory = os.path.dirname(os.path.abspath(path))
    temp = os.path.join(directory, f".{os.path.basename(path)}.writing-{os.getpid()}-{os.urandom(4).hex()}")
    try:
        fd = os.open(temp, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_NOFOLLOW, 0o600)
    except OSError as exc:
        raise CommandError(EXIT_CANTCREAT, f"cannot create {path!r}: {exc.strerror}") from None
    try:
        with os.fdopen(fd, "wb", buffering=1 << 20) as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        try:
            os.link(temp, path)
        except FileExistsError:
            raise CommandError(EXIT_CANTCREAT, f"{path!r} appeared while it was written; it is not overwritten") \
                from None
    finally:
        with contextlib.suppress(OSError):
            os.unlink(temp)


# --- import -----------------------------------------------------------------------------------------


def run_import(args: argparse.Namespace) -> int:
    """Verify the export, write the new store, verify it."""
    if is_url(args.file):
        require_file(args.file)  # never a password on the command line
        if store_exists(args.file):
            raise CommandError(EXIT_CANTCREAT, f"{args.file} already holds a store; it is not overwritten")
    else:
        _refuse_existing(args.file, "FILE")
    cp_path = args.checkpoints if args.checkpoints is not None else None if is_url(args.file) else (
        args.file + ".checkpoints")
    if cp_path is not None:
        _refuse_existing(cp_path, "--checkpoints")
    key = read_key_file(args.key_file) if args.key_file else None
    # One open for every pass: the rows written are read from the file whose chain was verified.
    with input_file(args.source, what="export", arg="IN.jsonl") as source:
        header = verify_export(source, args.source, key)
        signed = _carried(source, args.source)
        if signed and cp_path is None:
            raise CommandError(EXIT_USAGE, f"the export carries {len(signed):,} signed checkpoint(s) and a store on "
                                           "a server has no file beside it: name where they go with --checkpoints")
        source.seek(0)
        create_store(args.file, store_id=bytes.fromhex(header.store_id), key_id=header.key_id,
                     rows=_rows(source, args.source))
    try:
        if signed and cp_path is not None:
            with _new_file(cp_path) as out:
                out.write("".join(note.whole() + "\n" for note in signed).encode())
        # A read-write open turns on WAL and the profile; verify() then proves the new file's chain.
        with EventStore.open(args.file, key=key) as store:
            report = store.verify(key=key)
        if report.events != header.events or (header.head_hash is not None
                                              and report.head.hash.hex() != header.head_hash):
            raise CommandError(EXIT_DATAERR, f"{args.file!r} does not hold the export's chain (the export changed "
                                             "while it was imported?)")
    except BaseException:
        with contextlib.suppress(Exception):
            remove_store(args.file)
        if signed and cp_path is not None:
            with contextlib.suppress(OSError):
                os.unlink(cp_path)
        raise
    print(printable(f"imported {report.events:,} events into {args.file}, chain verified"
                    + (f" (head seq {report.head.seq:,}, hash {report.head.hash.hex()})" if report.events else "")
                    + (f"; {len(signed):,} signed checkpoint(s) to {cp_path}" if signed else "")))
    return EXIT_OK


def _lines(source: BinaryIO, path: str) -> Iterator[tuple[int, bytes]]:
    """(line number, line) of the export `source` from where it stands, refusing a line too long to be an
    export's: the file is streamed, never read whole, however large it is."""
    number = 0
    while True:
        line = source.readline(MAX_LINE_BYTES + 1)
        if not line:
            return
        number += 1
        if len(line) > MAX_LINE_BYTES:
            raise CommandError(EXIT_DATAERR, f"{path}: line {number} is longer than {MAX_LINE_BYTES:,} bytes: "
                                             "not an export")
        yield number, line


def _bad(path: str, number: int, reason: str) -> CommandError:
    return CommandError(EXIT_DATAERR, f"{path}: line {number}: {reason}")


def _header(path: str, lines: Iterator[tuple[int, bytes]]) -> ExportHeader:
    first = next(lines, None)
    if first is None:
        raise _bad(path, 1, "empty file: not an export")
    try:
        header = msgspec.json.decode(first[1], type=ExportHeader)
        bytes.fromhex(header.store_id)
    except (msgspec.MsgspecError, ValueError) as exc:
        raise _bad(path, 1, f"not a lifecycle-es export header ({exc})") from None
    if header.format != FORMAT or header.version != FORMAT_VERSION:
        raise _bad(path, 1, f"format {header.format!r} version {header.version} is not {FORMAT!r} "
                            f"version {FORMAT_VERSION}")
    if not header.store_id or header.events < 0 or header.head_seq != header.events or header.checkpoints < 0:
        raise _bad(path, 1, "the header's store id, event count or head is malformed")
    return header


def _decoded_rows(source: BinaryIO, path: str) -> Iterator[tuple[int, Row]]:
    """(line number, row) for every row line, each decoded and its hex turned to bytes."""
    decoder = msgspec.json.Decoder(ExportRow)
    lines = _lines(source, path)
    header = _header(path, lines)
    for number, line in itertools.islice(lines, header.events):
        try:
            row = decoder.decode(line)
            yield number, (row.seq, row.stream, row.version, row.type, row.at, bytes.fromhex(row.body),
                           bytes.fromhex(row.prev), bytes.fromhex(row.hash))
        except (msgspec.MsgspecError, ValueError) as exc:
            raise _bad(path, number, f"not an export row ({exc})") from None


def _carried(source: BinaryIO, path: str) -> list[Note]:
    """The signed checkpoints after the rows of the export open as `source`: as many as its header says,
    each a well-formed note of this store, and nothing after them (65 otherwise)."""
    source.seek(0)
    lines = _lines(source, path)
    header = _header(path, lines)
    for _ in itertools.islice(lines, header.events):
        pass
    decoder = msgspec.json.Decoder(ExportCheckpoint)
    carried: list[Note] = []
    for number, line in lines:
        if len(carried) == header.checkpoints:
            raise _bad(path, number, "a line after the last checkpoint the header announces")
        try:
            text = decoder.decode(line).checkpoint
        except msgspec.MsgspecError as exc:
            raise _bad(path, number, f"not an export's checkpoint line ({exc})") from None
        found = list(notes(enumerate(text.splitlines(keepends=True), 1)))
        if len(found) != 1 or found[0].malformed is not None or found[0].checkpoint is None or found[0].whole() != text:
            reason = found[0].malformed if len(found) == 1 and found[0].malformed else "not one signed checkpoint"
            raise _bad(path, number, f"checkpoint: {reason}")
        if found[0].checkpoint.store_id != header.store_id:
            raise _bad(path, number, "a checkpoint of another store")
        carried.append(found[0])
    if len(carried) != header.checkpoints:
        raise CommandError(EXIT_DATAERR, f"{path}: {len(carried):,} checkpoint line(s), the header says "
                                         f"{header.checkpoints:,} (a truncated export)")
    return carried


def _rows(source: BinaryIO, path: str) -> Iterator[Row]:
    for _, row in _decoded_rows(source, path):
        yield row


def verify_export(source: BinaryIO, path: str, key: bytes | None) -> ExportHeader:
    """Prove the whole chain of the export open as `source` (seqs, versions, links, hashes or MACs) and
    return its header; `path` names it in messages."""
    source.seek(0)
    header = _header(path, _lines(source, path))
    if header.key_id is not None and key is None:
        raise StoreKeyError("the export is of a keyed store: verifying its MACs needs --key-file")
    if header.key_id is None and key is not None:
        raise CommandError(EXIT_DATAERR, DOWNGRADED.format(what="export"))
    if key is not None and chain.key_id(key) != header.key_id:
        raise StoreKeyError("wrong key: its key id differs from the one the export names")
    prev = chain.genesis(bytes.fromhex(header.store_id), key)
    versions: dict[str, int] = {}
    expected = 1
    bar = Progress("verify export", header.events)
    source.seek(0)
    for number, (seq, stream, version, type_, at, body, row_prev, digest) in _decoded_rows(source, path):
        if seq != expected:
            raise _bad(path, number, f"seq {seq} where {expected} was due")
        if version != versions.get(stream, 0) + 1:
            raise _bad(path, number, f"seq {seq}: version {version} where {versions.get(stream, 0) + 1} was due")
        versions[stream] = version
        if row_prev != prev:
            raise _bad(path, number, f"seq {seq}: prev does not link to the hash of the row before it")
        try:
            digest_ok = chain.link(prev, seq, stream, version, type_, at, body, key) == digest
        except UnicodeEncodeError:  # a lone surrogate from a JSON escape: no store could hold it
            raise _bad(path, number, f"seq {seq}: text that is not valid Unicode") from None
        if not digest_ok:
            raise _bad(path, number, f"seq {seq}: hash does not match the row's contents")
        prev = digest
        expected += 1
        if seq % 10_000 == 0:
            bar.update(seq)
    bar.close()
    if expected - 1 != header.events or (header.events and prev.hex() != header.head_hash):
        raise CommandError(EXIT_DATAERR, f"{path}: the rows end at seq {expected - 1:,}, the header says "
                                         f"{header.head_seq:,} (a truncated or spliced export)")
    return header
