"""The audit's check of signed checkpoints: every signature, and the log against every signed head.

    report = lifecycle_es.audit("runners.db", trust="ops.key.pub")   # reads runners.db.checkpoints

Each note of the checkpoint file (`lifecycle_es.checkpoints`) is read, its signatures checked with the
trusted public keys (a line of a key not trusted is skipped, as the signed-note spec says, and a note
no trusted key signed is reported), and each trusted checkpoint held against the log and the others.
What is found is a `Problem` of the report, of one of four kinds:

- ``checkpoint``: the log disagrees with a signed checkpoint: another store, another chain key (a
  keyed store downgraded), a different hash at its seq (history rewritten and re-chained behind it),
  or a seq beyond the head (the log lost events the checkpoint saw); or no trusted checkpoint at all;
- ``fork``: two trusted checkpoints name different heads at the same seq (the signer equivocated, or
  its key signed two histories);
- ``signature``: a note signed by no trusted key, or whose trusted key's signature does not verify;
- ``checkpoint-file``: the file is not a checkpoint file (a link, a FIFO, too large), a note is
  malformed or cut short, or the notes are out of seq order (they are only ever appended, under a lock,
  and a log's head only grows).

A note repeated byte for byte is a warning, not a problem: it says nothing new.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING

from .checkpoints import Checkpoint, Note, read_notes
from .errors import LifecycleError
from .files import UNOPENABLE, UnsafeFileError
from .signing import Verifier

if TYPE_CHECKING:
    from .auditing import AuditReport
    from .store import EventStore


def check_checkpoints(store: EventStore, report: AuditReport, path: str, trusted: list[Verifier]) -> None:
    """Check the checkpoint file at `path` with the `trusted` keys against `store`, into `report`."""
    found = report.checkpoints = {"path": path, "ok": False, "checked": 0, "seq": None}
    report.checks.setdefault("checkpoints", None)
    problems = len(report.problems)
    by_seq: dict[tuple[str, int], tuple[str, str]] = {}
    seen: dict[bytes, int] = {}  # a note's digest: the file may hold a million
    last: tuple[int, str] | None = None
    head = report.head_seq
    try:
        for note in read_notes(path):
            if note.malformed is not None or note.checkpoint is None:
                report.add(None, None, "checkpoint-file", f"checkpoint file {path}: {note.malformed}")
                continue
            whole = hashlib.sha256(note.whole().encode()).digest()
            if whole in seen:
                report.warnings.append(f"checkpoint file {path}: the note at line {note.line} repeats the one at "
                                       f"line {seen[whole]}")
                continue
            seen[whole] = note.line
            signer = _signed_by(note, trusted, report, path)
            if signer is None:
                continue
            checkpoint = note.checkpoint
            name = f"the checkpoint at line {note.line} of {path} (seq {checkpoint.seq}, signed by {signer} at " \
                   f"{checkpoint.at})"
            # Seq order only: times come from the signers' clocks, which may disagree a little.
            if last is not None and checkpoint.seq < last[0]:
                report.add(None, None, "checkpoint-file", f"{name} comes after {last[1]}: the file's notes are out "
                                                          "of order (a checkpoint file is only ever appended to)")
            last = (checkpoint.seq, f"the one at line {note.line}")
            earlier = by_seq.setdefault((checkpoint.store_id, checkpoint.seq), (checkpoint.hash, name))
            if earlier[0] != checkpoint.hash:
                report.add(checkpoint.seq, None, "fork", f"{name} and {earlier[1]} name different heads at the same "
                                                         "seq: two histories were signed (a fork)")
            _against_log(store, report, checkpoint, name, head)
            found["checked"] += 1
            found["seq"] = max(found["seq"] or 0, checkpoint.seq)
    except FileNotFoundError:
        report.add(None, None, "checkpoint", f"no checkpoint file at {path}: nothing signed to hold the log to")
        return
    except UnsafeFileError as exc:
        kind = "checkpoint" if exc.kind == UNOPENABLE else "checkpoint-file"
        report.add(None, None, kind, f"the checkpoint file cannot be read: {exc.strerror}")
        return
    except OSError as exc:
        report.add(None, None, "checkpoint", f"the checkpoint file {path} cannot be read: {exc.strerror}")
        return
    if not found["checked"] and len(report.problems) == problems:
        report.add(None, None, "checkpoint", f"{path} holds no checkpoint: nothing signed to hold the log to")
    if found["seq"] is not None and found["seq"] < head:
        report.warnings.append(f"events after seq {found['seq']} (the last signed) up to the head {head} are "
                               "vouched for by no checkpoint")
    found["ok"] = len(report.problems) == problems
    if found["ok"]:
        report.checks["checkpoints"] = True


def _signed_by(note: Note, trusted: list[Verifier], report: AuditReport, path: str) -> str | None:
    """The trusted key that signed `note` (as ``name+hash``), or None, with the problem recorded."""
    message = note.text.encode()
    others = []
    for name, hash_, signature in note.signatures:
        key = next((key for key in trusted if key.name == name and key.hash == hash_), None)
        if key is None:
            others.append(f"{name}+{hash_.hex()}")
            continue
        if not key.verify(message, signature):
            # The signed-note rule: a trusted key's bad signature rejects the note, whatever else signed it.
            report.add(None, None, "signature", f"the checkpoint at line {note.line} of {path} carries a signature "
                                                f"of {key.name}+{key.hash.hex()} that does not verify: forged, "
                                                "or the checkpoint was altered after it was signed")
            return None
        return f"{key.name}+{key.hash.hex()}"
    report.add(None, None, "signature", f"the checkpoint at line {note.line} of {path} is signed only by "
                                        f"{', '.join(others)}, a key not trusted here: pass its public key with "
                                        "--trust if it is the log's signer")
    return None


def _against_log(store: EventStore, report: AuditReport, checkpoint: Checkpoint, name: str, head: int) -> None:
    if checkpoint.store_id != store.store_id.hex():
        report.add(None, None, "checkpoint", f"{name} is of another store ({checkpoint.store_id})")
        return
    if checkpoint.key_id != store.key_id:
        report.add(None, None, "checkpoint", f"{name} was made of a store whose chain key id is "
                                             f"{checkpoint.key_id or 'none'}, the log's is {store.key_id or 'none'}: "
                                             "its key id was replaced and its chain re-made (a downgrade)")
        return
    if checkpoint.seq > head:
        report.add(head + 1, None, "checkpoint", f"{name} is beyond the log's head (seq {head}): the log lost the "
                                                 "events it vouches for (truncated, or an older copy)")
        return
    if checkpoint.seq == 0:
        return  # an empty log's checkpoint holds its store id and key id, checked above
    try:
        row = store.backend.row_at(checkpoint.seq)
    except LifecycleError as exc:
        report.add(checkpoint.seq, None, "checkpoint", f"{name}: the event it vouches for cannot be read: {exc}")
        return
    if row is None or row[7].hex() != checkpoint.hash:
        report.add(checkpoint.seq, None, "checkpoint", f"{name} signed a head the log does not hold at that seq: "
                                                       "history was rewritten behind a signed checkpoint")
