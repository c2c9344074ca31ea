"""What a run directory holds as evidence: the host's proof of the unit it started, and the unit's result.

    write_proof(run_dir, HandleProof(lease_id=..., lease_generation=1, handle=handle))
    why = unproven(run_root, lease_id, lease_generation, recorded_run_dir, handle)   # None: proven
    digest = result_digest(run_dir, lease_id, "settled", 0, None)

**Proof.** Unit facts in the log are public: whoever can write the store can record a `UnitStarted`
naming any pid, or a `UnitStarting` naming any systemd unit or run directory. The host acts (observes,
signals, stops, adopts) only on a unit it can prove it started. When it starts one it writes the
handle, with the lease and generation, to ``<run dir>/unit.handle`` (`HANDLE_FILE`: 0600, written to a
temporary file, fsynced, renamed into place, the directory fsynced) before ``UnitStarted`` is recorded;
in systemd mode, where the unit name is chosen first, also before ``systemd-run``. The file sits in the
host's own 0700 run directory, outside the unit's ``work/``. A recorded unit is proven when its run
directory is exactly ``<run root>/<lease id>`` (never a path elsewhere: a run directory outside the
run root is never read, written or signalled) and that file names the same lease, generation and
handle. A (pid, start ticks, boot) in a proven handle names the one process this host started.

**Result.** A unit finds its run directory in ``$LIFECYCLE_ES_RUN_DIR`` (`RUN_DIR_ENV`) and the path of
its result, ``<run dir>/result``, in ``$LIFECYCLE_ES_RESULT`` (`RESULT_ENV`); the host sets both in
every unit's environment (over the caller's). A unit that exits 0 having written ``result`` in its
working directory (``<run dir>/work/result``, where a relative ``open('result')`` lands) and none at
``$LIFECYCLE_ES_RESULT`` has put its result in the wrong place: that is `UnitFileError`, so its lease is
parked ``lost-poll`` (an ``unsafe-file`` action says where the result should have gone), never settled
on a digest that leaves the result out. A unit's ``result`` is read the way every file someone else controls is read
(`lifecycle_es.files`): no link is followed, a FIFO or device cannot block the host, it must be a
regular file of at most `RESULT_LIMIT` bytes (1 GiB), and it is hashed in chunks, never read whole. A
``result`` that breaks these rules is `UnitFileError`, which the host treats as a unit failure.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from pathlib import Path

import msgspec

from lifecycle_es.canonical import canonical_bytes
from lifecycle_es.errors import InvalidInputError
from lifecycle_es.events import UnitRecord
from lifecycle_es.files import read_regular, sha256_regular
from lifecycle_es.values import safe_id, shown

from .proc import UnitFileError, unit_file_error
from .rundir import WORK_DIR

HANDLE_FILE = "unit.handle"
RESULT_FILE = "result"
RESULT_ENV = "LIFECYCLE_ES_RESULT"
RUN_DIR_ENV = "LIFECYCLE_ES_RUN_DIR"
# A handle is a few short fields, one path and the unit's command: a megabyte holds any sane argv.
HANDLE_LIMIT = 1 << 20
RESULT_LIMIT = 1 << 30


class HandleProof(msgspec.Struct, frozen=True, kw_only=True):
    """What ``unit.handle`` says: the unit this host started for a lease's generation, and its command
    (the one a wake may start again: never the log's, which anyone with the store could have written)."""

    lease_id: str
    lease_generation: int
    handle: UnitRecord
    command: tuple[str, ...] = ()


_DECODER = msgspec.json.Decoder(HandleProof)


def own_run_dir(run_root: str | os.PathLike[str], lease_id: str) -> Path:
    """``<run_root>/<lease_id>``: the only run directory the host touches for a lease.

    Raises InvalidInputError for a lease id outside the id pattern (it could name another directory).
    """
    return Path(run_root) / safe_id(lease_id, "lease_id")


def write_proof(run_dir: str | os.PathLike[str], proof: HandleProof) -> None:
    """Write `proof` to ``<run_dir>/unit.handle`` durably: temporary file, fsync, rename, fsync of the dir."""
    path = Path(run_dir) / HANDLE_FILE
    tmp = path.with_name(f".{HANDLE_FILE}.{os.getpid()}.tmp")
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)  # a leftover of a host that died mid-write
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        try:
            view = memoryview(msgspec.json.encode(proof))
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    dir_fd = os.open(run_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def read_proof(run_dir: str | os.PathLike[str]) -> HandleProof | None:
    """The proof in ``<run_dir>/unit.handle``, or None when it is missing, unsafe or not a proof."""
    try:
        return _DECODER.decode(read_regular(Path(run_dir) / HANDLE_FILE, limit=HANDLE_LIMIT, what=HANDLE_FILE))
    except (OSError, msgspec.DecodeError):
        return None


def unproven(run_root: str | os.PathLike[str], lease_id: str, lease_generation: int | None, run_dir: str,
             handle: UnitRecord | None, command: tuple[str, ...] | None = None) -> str | None:
    """Why the host may not act on a recorded unit, or None when it is proven its own.

    `run_dir` is the recorded run directory (the intent's), `handle` the recorded handle (None for an
    intent without one: then only the run directory is checked), `command` the recorded command.
    `lease_generation` and `command` None accept what the proof names (a caller holding only a handle).
    """
    try:
        own = own_run_dir(run_root, lease_id)
    except InvalidInputError:
        return f"lease id {shown(lease_id)} is not an id"
    if run_dir != str(own):
        return f"recorded run directory {shown(run_dir)} is not this host's {str(own)!r}"
    if handle is None:
        return None
    if handle.run_dir != str(own):
        return f"recorded handle's run directory {shown(handle.run_dir)} is not this host's {str(own)!r}"
    proof = read_proof(own)
    if proof is None:
        return f"no proof of the unit in {str(own / HANDLE_FILE)!r}"
    expected = HandleProof(lease_id=lease_id, handle=handle,
                           lease_generation=proof.lease_generation if lease_generation is None else lease_generation,
                           command=proof.command if command is None else command)
    if proof != expected:
        return f"the recorded handle is not the unit this host started ({str(own / HANDLE_FILE)!r} differs)"
    return None


def exit_digest(lease_id: str, outcome: str, code: int | None, signal_: str | None) -> str:
    """The result digest of a unit's end when it wrote no result: sha256 over its canonical exit."""
    material = {"leaseId": lease_id, "outcome": outcome, "code": code, "signal": signal_}
    return "sha256:" + hashlib.sha256(canonical_bytes(material)).hexdigest()


def result_digest(run_dir: str | os.PathLike[str], lease_id: str, outcome: str, code: int | None,
                  signal_: str | None) -> str:
    """sha256 of the unit's ``result`` file when it wrote one (hashed in chunks), else `exit_digest`.

    Raises `UnitFileError` when ``result`` is there but is a link, not a regular file, larger than
    `RESULT_LIMIT`, or unreadable; and, for a unit that ``settled``, when it wrote no ``result`` but
    left one in its working directory (see the module).
    """
    path = Path(run_dir) / RESULT_FILE
    try:
        return sha256_regular(path, limit=RESULT_LIMIT, what=RESULT_FILE)
    except FileNotFoundError:
        misplaced = Path(run_dir) / WORK_DIR / RESULT_FILE
        if outcome == "settled" and os.path.lexists(misplaced):
            raise UnitFileError(f"the unit broke the host's file rules: it wrote its result to {str(misplaced)!r}, "
                                f"its working directory, not to ${RESULT_ENV} ({str(path)!r}); nothing settles on "
                                f"a misplaced result: write it to the path ${RESULT_ENV} names") from None
        return exit_digest(lease_id, outcome, code, signal_)
    except OSError as exc:
        raise unit_file_error(exc, path, RESULT_FILE) from exc


__all__ = [
    "HANDLE_FILE",
    "HANDLE_LIMIT",
    "RESULT_ENV",
    "RESULT_FILE",
    "RESULT_LIMIT",
    "RUN_DIR_ENV",
    "HandleProof",
    "exit_digest",
    "own_run_dir",
    "read_proof",
    "result_digest",
    "unproven",
    "write_proof",
]
