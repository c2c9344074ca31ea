"""Signed checkpoints against every way a log or its checkpoint file can be tampered with, and the keys.

The log is the fleet of the command-line tests (a real lifecycle's history, read models, snapshots,
sealed), signed by key A at three seqs. The attacker edits the file with plain apsw (``fleets.attack``)
and, for an unkeyed store, re-chains it whole (``fleets.rechain``): what the chain cannot see, the
signed checkpoints must, and the audit must name the checkpoint. No store key is given to the audit
of an unkeyed log: a signed checkpoint is checked with the public key alone.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import apsw
import pytest
from fleets import KEY, attack, build_fleet, rechain
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import lifecycle_es
from lifecycle_es import EventStore, InvalidInputError, chain
from lifecycle_es.checkpoints import Checkpoint, sign_checkpoint
from lifecycle_es.files import NOT_PRIVATE, UnsafeFileError
from lifecycle_es.signing import Verifier, generate_key, load_signer, load_verifier
from lifecycle_es.testing import FakeClock

MID = (5, 12)  # seqs signed before the head


def sign_at(db: Path, signer_path: Path, seq: int, key: bytes | None = None) -> None:
    """Append to ``<db>.checkpoints`` a checkpoint of the head `db` had at `seq`, as the writer signed it then."""
    with EventStore.open(db, key=key, read_only=True) as store:
        row = store.event_at(seq)
        assert row is not None
        note = sign_checkpoint(Checkpoint(store.store_id.hex(), seq, row.hash.hex(), row.at, store.key_id),
                               load_signer(signer_path))
    with open(f"{db}.checkpoints", "a", encoding="utf-8") as out:
        out.write(note + "\n")


def sign_head(db: Path, signer_path: Path, key: bytes | None = None) -> None:
    """`EventStore.checkpoint` itself, with a clock a day past the fleet's."""
    with EventStore.open(db, key=key, now=FakeClock(FakeClock().ms + 86_400_000)) as store:
        store.checkpoint(load_signer(signer_path))


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    directory = tmp_path_factory.mktemp("keys")
    for name in ("a", "b"):
        generate_key(directory / f"{name}.key", name=f"signer-{name}")
    return {name: directory / f"{name}.key" for name in ("a", "b")}


def signed_fleet(factory: pytest.TempPathFactory, keys: dict[str, Path], key: bytes | None) -> Path:
    path = factory.mktemp("signed") / "fleet.db"
    build_fleet(path, key=key)
    for seq in MID:
        sign_at(path, keys["a"], seq, key)
    sign_head(path, keys["a"], key)
    return path


@pytest.fixture(scope="module")
def fleets(tmp_path_factory: pytest.TempPathFactory, keys: dict[str, Path]) -> dict[bytes | None, Path]:
    return {key: signed_fleet(tmp_path_factory, keys, key) for key in (None, KEY)}


def copy_of(fleets: dict[bytes | None, Path], key: bytes | None, directory: Path) -> tuple[Path, bytes | None]:
    target = directory / "fleet.db"
    for suffix in ("", ".seal", ".checkpoints"):
        shutil.copyfile(f"{fleets[key]}{suffix}", f"{target}{suffix}")
    return target, key


@pytest.fixture(params=[None, KEY], ids=["plain", "keyed"])
def copy(request: pytest.FixtureRequest, fleets: dict[bytes | None, Path], tmp_path: Path) -> tuple[Path, bytes | None]:
    """A copy of the signed fleet, unkeyed and keyed."""
    return copy_of(fleets, request.param, tmp_path)


@pytest.fixture
def plain(fleets: dict[bytes | None, Path], tmp_path: Path) -> Path:
    """A copy of the unkeyed signed fleet: the chain an attacker can re-make whole."""
    return copy_of(fleets, None, tmp_path)[0]


@pytest.fixture
def keyed(fleets: dict[bytes | None, Path], tmp_path: Path) -> Path:
    """A copy of the keyed signed fleet."""
    return copy_of(fleets, KEY, tmp_path)[0]


def audited(path: Path, keys: dict[str, Path], key: bytes | None = None, **options: Any) -> lifecycle_es.AuditReport:
    options.setdefault("trust", keys["a"].with_suffix(".key.pub"))
    return lifecycle_es.audit(path, key=key, **options)


def kinds(report: lifecycle_es.AuditReport) -> set[str]:
    return {problem.kind for problem in report.problems}


def reasons(report: lifecycle_es.AuditReport, kind: str) -> list[str]:
    return [problem.reason for problem in report.problems if problem.kind == kind]


def rows(path: Path) -> list[tuple[Any, ...]]:
    conn = apsw.Connection(str(path), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        return conn.execute("SELECT seq, stream, version, type, at, body, prev, hash FROM events "
                            "ORDER BY seq").fetchall()
    finally:
        conn.close()


def head_of(path: Path) -> int:
    return len(rows(path))


def replace_rows(path: Path, new_rows: list[tuple[Any, ...]]) -> None:
    attack(path, ("DELETE FROM events", ()),
           *(("INSERT INTO events VALUES (?, ?, ?, ?, ?, ?, ?, ?)", tuple(row)) for row in new_rows))


# --- the log as signed ----------------------------------------------------------------------------------


def test_signed_log_audits_whole_with_the_public_key_alone(copy: tuple[Path, bytes | None],
                                                           keys: dict[str, Path]) -> None:
    path, key = copy
    report = audited(path, keys, key)
    assert report.ok, report.problems
    assert report.checks["checkpoints"] is True
    assert report.checkpoints == {"path": f"{path}.checkpoints", "ok": True, "checked": 3, "seq": head_of(path)}
    text = Path(f"{path}.checkpoints").read_text()
    assert text.count("\u2014 signer-a ") == 3 and f"key-id {chain.key_id(key) if key else 'none'}\n" in text


def test_checkpoints_are_not_read_without_trust_and_a_warning_says_so(copy: tuple[Path, bytes | None],
                                                                       keys: dict[str, Path]) -> None:
    path, key = copy
    report = lifecycle_es.audit(path, key=key)
    assert report.ok and report.checkpoints is None and "checkpoints" not in report.checks
    assert any("checkpoints was not checked" in warning for warning in report.warnings)
    with pytest.raises(InvalidInputError) as info:
        lifecycle_es.audit(path, key=key, checkpoints=f"{path}.checkpoints")
    assert info.value.field == "checkpoints"


# --- tamper classes of the store suite, behind signed checkpoints --------------------------------------


def test_unkeyed_history_rewritten_and_rechained_fails_naming_the_checkpoint(plain: Path,
                                                                              keys: dict[str, Path]) -> None:
    path = plain
    before = rows(path)[MID[0] - 2]
    attack(path, ("UPDATE events SET body = CAST(replace(CAST(body AS TEXT), '\"s-1\"', '\"s-9\"') AS BLOB) "
                  "WHERE seq = ?", (MID[0] - 1,)))
    assert rows(path)[MID[0] - 2][5] != before[5]
    rechain(path)
    os.unlink(f"{path}.seal")  # the attacker removes what would betray them; the checkpoints are signed
    with EventStore.open(path, read_only=True) as store:
        assert store.verify().events == head_of(path)  # a valid chain
    report = audited(path, keys)
    assert not report.ok
    found = reasons(report, "checkpoint")
    assert len(found) == 3 and all("rewritten behind a signed checkpoint" in reason for reason in found)
    assert f"the checkpoint at line 1 of {path}.checkpoints (seq {MID[0]}, signed by signer-a+" in found[0]


@pytest.mark.parametrize(("column", "value"), [
    ("body", b'{"generation":1}'), ("at", "2026-01-01T00:00:03.500Z"), ("type", "RunnerParked"),
    ("stream", "runner-9"), ("version", 99),
])
def test_any_column_changed_and_rechained_is_caught_at_every_checkpoint_after_it(
        plain: Path, keys: dict[str, Path], column: str, value: object) -> None:
    path = plain
    attack(path, (f"UPDATE events SET {column} = ? WHERE seq = 4", (value,)))
    rechain(path)
    os.unlink(f"{path}.seal")
    report = audited(path, keys)
    found = [problem for problem in report.problems if problem.kind == "checkpoint"]
    assert [problem.seq for problem in found] == [MID[0], MID[1], head_of(path)], report.problems
    assert all("rewritten behind a signed checkpoint" in problem.reason for problem in found)


@pytest.mark.parametrize("seq", [1, MID[0], MID[1] + 1])
def test_changed_byte_without_rechaining_is_caught_and_checkpoints_still_checked(
        copy: tuple[Path, bytes | None], keys: dict[str, Path], seq: int) -> None:
    path, key = copy
    attack(path, ("UPDATE events SET body = CAST(replace(CAST(body AS TEXT), '\"', ' \"') AS BLOB) WHERE seq = ?",
                  (seq,)))
    report = audited(path, keys, key)
    assert "chain" in kinds(report) and report.first_problem is not None and report.first_problem.seq == seq
    assert report.checkpoints is not None and report.checkpoints["checked"] == 3  # hashes untouched: they agree


def test_deleted_row_renumbered_and_rechained_is_caught_by_the_checkpoints(plain: Path, keys: dict[str, Path]) -> None:
    path = plain
    kept = [row for row in rows(path) if row[0] != 3]
    replace_rows(path, [(seq, *row[1:]) for seq, row in enumerate(kept, 1)])
    rechain(path)
    os.unlink(f"{path}.seal")
    report = audited(path, keys)
    found = reasons(report, "checkpoint")
    assert any("beyond the log's head" in reason and "lost the events" in reason for reason in found)
    assert sum("rewritten behind" in reason for reason in found) == 2


def test_swapped_rows_rechained_are_caught_by_the_checkpoints(plain: Path, keys: dict[str, Path]) -> None:
    path = plain
    old = rows(path)
    first, second = old[1], old[2]  # runner-1 and runner-2 initialized: either order is a legal log
    replace_rows(path, [*old[:1], (2, *second[1:]), (3, *first[1:]), *old[3:]])
    rechain(path)
    os.unlink(f"{path}.seal")
    report = audited(path, keys)
    assert len(reasons(report, "checkpoint")) == 3, report.problems


@pytest.mark.parametrize("cut", [1, 4])
def test_truncated_tail_or_older_copy_is_a_log_that_lost_events(copy: tuple[Path, bytes | None],
                                                               keys: dict[str, Path], cut: int) -> None:
    path, key = copy
    head = head_of(path)
    attack(path, ("DELETE FROM events WHERE seq > ?", (head - cut,)))
    os.unlink(f"{path}.seal")
    report = audited(path, keys, key)
    problem = next(problem for problem in report.problems if problem.kind == "checkpoint")
    assert problem.seq == head - cut + 1 and "lost the events" in problem.reason and f"(seq {head}," in problem.reason


def test_log_of_another_store_is_refused_by_the_checkpoints(copy: tuple[Path, bytes | None],
                                                            keys: dict[str, Path], tmp_path: Path) -> None:
    path, key = copy
    donor = tmp_path / "donor" / "fleet.db"
    donor.parent.mkdir()
    build_fleet(donor, key=key)  # the same history, another store id: a whole log swapped in, meta and all
    shutil.copyfile(f"{path}.checkpoints", f"{donor}.checkpoints")
    report = audited(donor, keys, key)
    found = reasons(report, "checkpoint")
    assert len(found) == 3 and all("is of another store" in reason for reason in found)


def test_downgrade_of_a_keyed_store_is_caught_by_a_checkpoint(keyed: Path, keys: dict[str, Path]) -> None:
    path, key = keyed, KEY
    attack(path, ("DELETE FROM meta WHERE key = 'key_id'", ()))
    attack(path, ("DELETE FROM snapshots", ()))  # their tags need the key: the forger drops them
    rechain(path)
    os.unlink(f"{path}.seal")
    with EventStore.open(path) as store:
        store.seal()  # the seal re-made too: without the key, the audit of the forgery alone is clean
    plain = lifecycle_es.audit(path)
    assert plain.ok, plain.problems
    report = audited(path, keys)  # no store key: the public key catches it
    found = reasons(report, "checkpoint")
    assert len(found) == 3 and all("a downgrade" in reason and chain.key_id(key) in reason for reason in found)


# --- the checkpoint file and the keys --------------------------------------------------------------------


def notes_of(path: Path) -> list[str]:
    text = Path(f"{path}.checkpoints").read_text()
    parts = text.split("\n\n")  # text, signatures, text, signatures, ..., ""
    return [parts[i] + "\n\n" + parts[i + 1] + "\n" for i in range(0, len(parts) - 1, 2)]


def write_notes(path: Path, notes: list[str]) -> None:
    Path(f"{path}.checkpoints").write_text("".join(note + "\n" for note in notes))


def test_wrong_public_key_reports_every_checkpoint_as_untrusted(copy: tuple[Path, bytes | None],
                                                                keys: dict[str, Path]) -> None:
    path, key = copy
    report = audited(path, keys, key, trust=keys["b"].with_suffix(".key.pub"))
    found = reasons(report, "signature")
    assert len(found) == 3 and all("signed only by signer-a+" in reason and "not trusted" in reason
                                   for reason in found)
    assert report.checks["checkpoints"] is False
    both = audited(path, keys, key, trust=[keys["b"].with_suffix(".key.pub"), keys["a"].with_suffix(".key.pub")])
    assert both.ok, both.problems


def test_swapped_public_key_is_refused(copy: tuple[Path, bytes | None], keys: dict[str, Path], tmp_path: Path) -> None:
    path, key = copy
    a = load_verifier(keys["a"].with_suffix(".key.pub"))
    b = load_verifier(keys["b"].with_suffix(".key.pub"))
    for forged in (Verifier(a.name, a.hash, b.public), Verifier(b.name, a.hash, a.public)):
        swapped = tmp_path / "swapped.pub"
        swapped.write_text(forged.text + "\n")
        with pytest.raises(InvalidInputError) as info:
            audited(path, keys, key, trust=swapped)
        assert info.value.field == "trust" and "altered or swapped" in str(info.value)


def test_signature_or_text_altered_after_signing_does_not_verify(copy: tuple[Path, bytes | None],
                                                                 keys: dict[str, Path]) -> None:
    path, key = copy
    notes = notes_of(path)
    text, signature = notes[0].split("\n\n")
    notes[0] = text.replace(f"\n{MID[0]}\n", f"\n{MID[0] + 1}\n") + "\n\n" + signature  # another seq, same signature
    last = notes[2][:-10] + ("A" if notes[2][-10] != "A" else "B") + notes[2][-9:]
    notes[2] = last
    write_notes(path, notes)
    report = audited(path, keys, key)
    found = reasons(report, "signature")
    assert len(found) == 2 and all("does not verify" in reason for reason in found)
    assert report.checkpoints is not None and report.checkpoints["checked"] == 1


def test_truncated_checkpoint_file(copy: tuple[Path, bytes | None], keys: dict[str, Path]) -> None:
    path, key = copy
    whole = Path(f"{path}.checkpoints").read_bytes()
    unsigned = whole.rindex("\n\n\u2014".encode()) + 2  # the last note's text and its blank line, no signature
    for cut, expected in ((len(whole) - 20, "cut short"), (unsigned, "no signature")):
        Path(f"{path}.checkpoints").write_bytes(whole[:cut])
        report = audited(path, keys, key)
        found = reasons(report, "checkpoint-file")
        assert len(found) == 1 and expected in found[0], found
        assert report.checkpoints is not None and report.checkpoints["checked"] == 2
    # Cut at a note's end, the file is shorter and says nothing wrong: fewer heads are vouched for, which
    # the audit says; keeping the checkpoints where the log's writer cannot reach is what stops this.
    Path(f"{path}.checkpoints").write_bytes(whole)
    write_notes(path, notes_of(path)[:2])
    report = audited(path, keys, key)
    assert report.ok and report.checkpoints is not None and report.checkpoints["seq"] == MID[1]
    assert any(f"after seq {MID[1]}" in warning for warning in report.warnings)


def test_reordered_checkpoint_file_is_reported(copy: tuple[Path, bytes | None], keys: dict[str, Path]) -> None:
    path, key = copy
    notes = notes_of(path)
    write_notes(path, [notes[1], notes[0], notes[2]])
    report = audited(path, keys, key)
    found = reasons(report, "checkpoint-file")
    assert len(found) == 1 and "out of order" in found[0] and "line 1" in found[0]


def test_duplicated_checkpoint_is_a_warning(copy: tuple[Path, bytes | None], keys: dict[str, Path]) -> None:
    path, key = copy
    notes = notes_of(path)
    write_notes(path, [notes[0], notes[0], notes[1], notes[2]])
    report = audited(path, keys, key)
    assert report.ok, report.problems
    assert report.checkpoints is not None and report.checkpoints["checked"] == 3
    assert any("repeats the one at line 1" in warning for warning in report.warnings)


def test_two_signed_heads_at_one_seq_are_a_fork(plain: Path, keys: dict[str, Path],
                                                tmp_path: Path) -> None:
    path = plain
    other = tmp_path / "other" / "fleet.db"
    other.parent.mkdir()
    shutil.copyfile(path, other)
    attack(other, ("UPDATE events SET body = CAST(replace(CAST(body AS TEXT), 's-1', 's-9') AS BLOB) WHERE seq = 4",
                   ()))
    rechain(other)
    sign_head(other, keys["a"])  # the signer's key signs a second history at the same seq
    with open(f"{path}.checkpoints", "a", encoding="utf-8") as out:
        out.write(Path(f"{other}.checkpoints").read_text())
    report = audited(path, keys)
    forks = [problem for problem in report.problems if problem.kind == "fork"]
    assert len(forks) == 1 and forks[0].seq == head_of(path) and "two histories" in forks[0].reason
    assert "at line 25 " in forks[0].reason and "at line 17 " in forks[0].reason
    assert len(reasons(report, "checkpoint")) == 1


def test_checkpoint_by_an_untrusted_key_among_trusted_ones(copy: tuple[Path, bytes | None],
                                                           keys: dict[str, Path]) -> None:
    path, key = copy
    sign_head(path, keys["b"], key)
    report = audited(path, keys, key)
    found = reasons(report, "signature")
    assert len(found) == 1 and "line 25" in found[0] and "signed only by signer-b+" in found[0]
    assert report.checkpoints is not None and report.checkpoints["checked"] == 3


def test_missing_checkpoint_file_with_trust_is_a_problem(copy: tuple[Path, bytes | None],
                                                         keys: dict[str, Path]) -> None:
    path, key = copy
    os.unlink(f"{path}.checkpoints")
    report = audited(path, keys, key)
    assert reasons(report, "checkpoint") == [f"no checkpoint file at {path}.checkpoints: nothing signed to hold "
                                             "the log to"]


@pytest.mark.parametrize("kind", ["fifo", "symlink", "dangling"])
def test_checkpoint_file_that_is_not_a_regular_file_is_refused(copy: tuple[Path, bytes | None],
                                                               keys: dict[str, Path], kind: str) -> None:
    path, key = copy
    target = Path(f"{path}.checkpoints")
    real = path.with_name("real.checkpoints")
    target.rename(real)
    if kind == "fifo":
        os.mkfifo(target)
    else:
        os.symlink(real if kind == "symlink" else path.with_name("nowhere"), target)
    report = audited(path, keys, key)  # returns: a FIFO is never waited on
    found = reasons(report, "checkpoint-file")
    assert len(found) == 1 and ("symbolic link" in found[0] if kind != "fifo" else "a FIFO" in found[0])
    with EventStore.open(path, key=key) as store, pytest.raises(lifecycle_es.StoreIOError):
        store.checkpoint(load_signer(keys["a"]))  # nor is one appended to, or through
    assert stat.S_ISFIFO(os.lstat(target).st_mode) if kind == "fifo" else os.path.islink(target)


def test_keygen_writes_a_private_key_only_its_owner_reads(tmp_path: Path) -> None:
    verifier = generate_key(tmp_path / "k", name="ops.example")
    assert stat.S_IMODE(os.stat(tmp_path / "k").st_mode) == 0o600
    assert load_verifier(tmp_path / "k.pub") == verifier == load_signer(tmp_path / "k").verifier
    secret = (tmp_path / "k").read_text().strip().split("+", 4)[4]  # the base64 field, which may hold "+" itself
    assert secret not in repr(load_signer(tmp_path / "k"))
    (tmp_path / "x.pub").write_text("someone's\n")
    for existing in (tmp_path / "k", tmp_path / "x"):
        with pytest.raises(InvalidInputError):
            generate_key(existing)
    assert not (tmp_path / "x").exists() and (tmp_path / "x.pub").read_text() == "someone's\n"
    os.symlink(tmp_path / "elsewhere", tmp_path / "link")
    with pytest.raises(InvalidInputError):
        generate_key(tmp_path / "link")
    assert not (tmp_path / "elsewhere").exists()
    os.chmod(tmp_path / "k", 0o640)
    with pytest.raises(UnsafeFileError) as info:
        load_signer(tmp_path / "k")
    assert info.value.kind == NOT_PRIVATE and secret not in str(info.value)


def test_malformed_private_key_is_reported_by_its_size_only(tmp_path: Path) -> None:
    generate_key(tmp_path / "k")
    text = (tmp_path / "k").read_text()
    (tmp_path / "k").write_text(text.replace("PRIVATE+KEY+", "PRIVATE+KYE+"))
    with pytest.raises(lifecycle_es.StoreKeyError) as info:
        load_signer(tmp_path / "k")
    secret = text.strip().split("+", 4)[4]  # the base64 field, which may hold "+" itself
    assert secret and f"holds {len(text)} bytes" in str(info.value) and secret not in str(info.value)


# The example key and note of Go's golang.org/x/mod/sumdb/note documentation: these keys are that
# package's, byte for byte, and Ed25519 is deterministic, so the signature line must be its very line.
GO_SIGNER = "PRIVATE+KEY+PeterNeumann+c74f20a3+AYEKFALVFGyNhPJEMzD1QIDr+Y7hfZx09iUvxdXHKDFz"
GO_VERIFIER = "PeterNeumann+c74f20a3+ARpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TW"
GO_TEXT = "If you think cryptography is the answer to your problem,\nthen you don't know what your problem is.\n"
GO_SIGNATURE = ("\u2014 PeterNeumann x08go/ZJkuBS9UG/SffcvIAQxVBtiFupLLr8pAcElZInNIuGUgYN1FFYC2pZSNXgKvqfqdngotpRZb6"
                "KE6RyyBwJnAM=\n")


def test_keys_and_signatures_are_those_of_go_sumdb_note(tmp_path: Path) -> None:
    (tmp_path / "go.key").write_text(GO_SIGNER + "\n")
    os.chmod(tmp_path / "go.key", 0o600)
    signer = load_signer(tmp_path / "go.key")
    assert signer.verifier.text == GO_VERIFIER and Verifier.parse(GO_VERIFIER) == signer.verifier
    from lifecycle_es.checkpoints import parse_signature
    from lifecycle_es.signing import b64

    line = f"\u2014 {signer.verifier.name} {b64(signer.verifier.hash + signer.sign(GO_TEXT.encode()))}\n"
    assert line == GO_SIGNATURE
    name, hash_, signature = parse_signature(GO_SIGNATURE.rstrip("\n"))  # type: ignore[misc]
    assert (name, hash_) == ("PeterNeumann", bytes.fromhex("c74f20a3"))
    assert signer.verifier.verify(GO_TEXT.encode(), signature)
    assert not signer.verifier.verify(GO_TEXT.encode() + b"!", signature)


def test_a_store_that_is_no_file_names_its_checkpoint_file() -> None:
    from lifecycle_es.checkpoints import default_path

    with pytest.raises(InvalidInputError) as info:
        default_path("postgresql://auditor:hunter2@db.example/runners")
    assert info.value.field == "path" and "hunter2" not in str(info.value)
    assert default_path("runners.db") == "runners.db.checkpoints"


def test_an_empty_log_is_signed_and_checked_by_its_store_and_key_ids(tmp_path: Path, keys: dict[str, Path]) -> None:
    with EventStore.open(tmp_path / "empty.db") as store:
        signed = store.checkpoint(load_signer(keys["a"]))
    assert (signed.seq, signed.key_id) == (0, None)
    report = audited(tmp_path / "empty.db", keys)
    assert report.ok and report.checkpoints is not None and report.checkpoints["checked"] == 1


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_checkpoint_file_gives_a_report_never_an_exception(data: st.DataObject, fleets: dict[bytes | None, Path],
                                                               keys: dict[str, Path]) -> None:
    whole = Path(f"{fleets[None]}.checkpoints").read_bytes()
    mutated = bytearray(whole)
    for _ in range(data.draw(st.integers(1, 8))):
        position = data.draw(st.integers(0, len(mutated) - 1))
        choice = data.draw(st.sampled_from(["flip", "cut", "insert"]))
        if choice == "flip":
            mutated[position] ^= data.draw(st.integers(1, 255))
        elif choice == "cut":
            del mutated[position:position + data.draw(st.integers(1, 40))]
        else:
            mutated[position:position] = data.draw(st.binary(min_size=1, max_size=20))
        if not mutated:
            break
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "cp"
        path.write_bytes(bytes(mutated))
        report = audited(fleets[None], keys, checkpoints=path)
    assert report.checkpoints is not None
    assert report.checkpoints["checked"] <= 3  # no edit makes a checkpoint the key did not sign
    assert report.ok or report.checks["checkpoints"] is False
    assert all(problem.kind in {"checkpoint", "fork", "signature", "checkpoint-file"} for problem in report.problems)


def test_the_package_imports_cryptography_only_when_a_key_is_used() -> None:
    code = ("import sys, lifecycle_es, lifecycle_es.cli, lifecycle_es.checkpoint_audit\n"
            "print('cryptography' in sys.modules)\n"
            "lifecycle_es.Verifier.parse(" + repr(GO_VERIFIER) + ").verify(b'x', bytes(64))\n"
            "print('cryptography' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["False", "True"]
