"""hosts.unitfiles: the host's proof of the units it started, and a unit's result read the safe way."""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

import pytest
from waiting import returns_within

from hosts.proc import UnitFileError
from hosts.unitfiles import (
    HANDLE_FILE,
    RESULT_LIMIT,
    HandleProof,
    exit_digest,
    read_proof,
    result_digest,
    unproven,
    write_proof,
)
from lifecycle_es.events import UnitRecord

LEASE = "lease-1"
COMMAND = ("/bin/sleep", "60")


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    path = tmp_path / "runs" / LEASE
    path.mkdir(parents=True, mode=0o700)
    return path


def handle(run_dir: Path, pid: int = 4242) -> UnitRecord:
    return UnitRecord(mode="child", host="h", boot_id="b", run_dir=str(run_dir), pid=pid, start_ticks=77)


def prove(run_dir: Path, generation: int = 1) -> UnitRecord:
    started = handle(run_dir)
    write_proof(run_dir, HandleProof(lease_id=LEASE, lease_generation=generation, handle=started, command=COMMAND))
    return started


def test_the_proof_is_written_0600_without_leftovers_and_read_back(run_dir: Path) -> None:
    started = prove(run_dir)
    assert stat.S_IMODE(os.lstat(run_dir / HANDLE_FILE).st_mode) == 0o600
    assert os.listdir(run_dir) == [HANDLE_FILE]
    assert read_proof(run_dir) == HandleProof(lease_id=LEASE, lease_generation=1, handle=started, command=COMMAND)
    assert unproven(run_dir.parent, LEASE, 1, str(run_dir), started, COMMAND) is None
    assert unproven(run_dir.parent, LEASE, None, str(run_dir), started) is None  # a caller with only the handle


def test_a_record_that_differs_from_the_proof_is_unproven(run_dir: Path) -> None:
    started = prove(run_dir)
    root = run_dir.parent
    other_pid = handle(run_dir, pid=1)
    cases = {
        "another pid": (LEASE, 1, str(run_dir), other_pid, COMMAND),
        "another generation": (LEASE, 2, str(run_dir), started, COMMAND),
        "another command": (LEASE, 1, str(run_dir), started, ("/bin/sh", "-c", "evil")),
        "an intent elsewhere": (LEASE, 1, "/tmp/elsewhere", started, COMMAND),
        "a handle elsewhere": (LEASE, 1, str(run_dir), handle(Path("/tmp/elsewhere")), COMMAND),
        "a lease id that is a path": ("../lease-1", 1, str(run_dir), started, COMMAND),
        "another lease": ("lease-2", 1, str(root / "lease-2"), handle(root / "lease-2"), COMMAND),
    }
    for name, (lease_id, generation, recorded_dir, recorded, command) in cases.items():
        assert unproven(root, lease_id, generation, recorded_dir, recorded, command) is not None, name
    assert unproven(root, LEASE, 1, "/tmp/elsewhere", None) is not None  # an intent is checked for its dir


@pytest.mark.parametrize("kind", ["missing", "link", "fifo", "garbage"])
def test_no_usable_proof_proves_nothing(run_dir: Path, tmp_path: Path, kind: str) -> None:
    started = handle(run_dir)
    path = run_dir / HANDLE_FILE
    if kind == "link":
        elsewhere = tmp_path / "elsewhere"
        elsewhere.mkdir()
        write_proof(elsewhere, HandleProof(lease_id=LEASE, lease_generation=1, handle=started, command=COMMAND))
        path.symlink_to(elsewhere / HANDLE_FILE)
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "garbage":
        path.write_bytes(b'{"lease_id": "lease-1"}')
    why = returns_within(lambda: unproven(run_dir.parent, LEASE, 1, str(run_dir), started, COMMAND), 10,
                         fifo=path if kind == "fifo" else None)
    assert why is not None and "no proof" in why


def test_result_digest_hashes_a_regular_result_or_the_exit(run_dir: Path) -> None:
    assert result_digest(run_dir, LEASE, "settled", 0, None) == exit_digest(LEASE, "settled", 0, None)
    (run_dir / "result").write_bytes(b"42")
    assert result_digest(run_dir, LEASE, "settled", 0, None) == "sha256:" + hashlib.sha256(b"42").hexdigest()


@pytest.mark.parametrize("kind", ["link-outside", "fifo", "directory", "larger-than-limit"])
def test_a_result_that_breaks_the_rules_is_a_unit_failure(run_dir: Path, tmp_path: Path, kind: str) -> None:
    path = run_dir / "result"
    if kind == "link-outside":
        (tmp_path / "secret").write_bytes(b"the host's own file")
        path.symlink_to(tmp_path / "secret")
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        path.mkdir()
    else:
        with open(path, "wb") as f:
            f.truncate(RESULT_LIMIT + 1)  # sparse: no disk used, and never read
    with pytest.raises(UnitFileError, match="result"):
        returns_within(lambda: result_digest(run_dir, LEASE, "settled", 0, None), 10,
                       fifo=path if kind == "fifo" else None)
