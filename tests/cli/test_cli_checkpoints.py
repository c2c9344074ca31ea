"""``keygen``, ``seal --sign``, ``audit --trust``, checkpoints through ``export``/``import``, and ``host --sign``."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import stat
import subprocess
from pathlib import Path

import pytest
from fleets import CLI, attack, audit_json, build_fleet, one_error_line, rechain, run
from waiting import wait_for

from lifecycle_es import EventStore, RunnerLifecycle
from lifecycle_es.values import Resources


@pytest.fixture(scope="module")
def signed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An unkeyed fleet, sealed and signed by ``ops.key`` (its public key beside it as ops.key.pub)."""
    directory = tmp_path_factory.mktemp("signed")
    assert run("keygen", directory / "ops.key", "--name", "ops.example").returncode == 0
    build_fleet(directory / "fleet.db")
    done = run("seal", directory / "fleet.db", "--sign", directory / "ops.key")
    assert done.returncode == 0 and "signed checkpoint at seq" in done.stdout, done.stdout + done.stderr
    return directory


@pytest.fixture
def copy(signed: Path, tmp_path: Path) -> Path:
    for name in ("fleet.db", "fleet.db.seal", "fleet.db.checkpoints", "ops.key", "ops.key.pub"):
        shutil.copy2(signed / name, tmp_path / name)
    return tmp_path / "fleet.db"


def test_keygen_writes_the_pair_prints_the_public_key_only_and_never_overwrites(tmp_path: Path) -> None:
    done = run("keygen", tmp_path / "k", "--name", "ops.example")
    assert done.returncode == 0, done.stderr
    private = (tmp_path / "k").read_text().strip()
    public = (tmp_path / "k.pub").read_text().strip()
    assert stat.S_IMODE(os.stat(tmp_path / "k").st_mode) == 0o600
    assert private.startswith("PRIVATE+KEY+ops.example+") and public.startswith("ops.example+")
    assert public in done.stdout and private.split("+", 4)[4] not in done.stdout + done.stderr
    again = run("keygen", tmp_path / "k")
    assert again.returncode == 73 and "never overwritten" in one_error_line(again)
    assert (tmp_path / "k").read_text().strip() == private


def test_audit_with_the_public_key_proves_the_signed_log(copy: Path) -> None:
    done = run("audit", copy, "--trust", copy.with_name("ops.key.pub"))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "checkpoints: 1 signed by a trusted key, the last at seq" in done.stdout
    code, report = audit_json(copy, "--trust", str(copy.with_name("ops.key.pub")))
    assert code == 0 and report["checkpoints"]["ok"] is True and report["checks"]["checkpoints"] is True


def test_history_rewritten_and_rechained_fails_with_65_naming_the_checkpoint(copy: Path) -> None:
    attack(copy, ("UPDATE events SET body = CAST(replace(CAST(body AS TEXT), '\"s-1\"', '\"s-9\"') AS BLOB) "
                  "WHERE seq = 4", ()))
    rechain(copy)
    os.unlink(f"{copy}.seal")
    assert run("audit", copy).returncode == 65  # the snapshots and read models still say what was
    code, report = audit_json(copy, "--trust", str(copy.with_name("ops.key.pub")))
    assert code == 65
    found = [problem for problem in report["problems"] if problem["kind"] == "checkpoint"]
    assert len(found) == 1 and f"the checkpoint at line 1 of {copy}.checkpoints" in found[0]["reason"]


def test_wrong_or_swapped_public_key(copy: Path) -> None:
    assert run("keygen", copy.with_name("other.key")).returncode == 0
    done = run("audit", copy, "--trust", copy.with_name("other.key.pub"))
    assert done.returncode == 65 and "a key not trusted here" in done.stdout
    public = copy.with_name("ops.key.pub").read_text()
    other = copy.with_name("other.key.pub").read_text()
    name, hash_, _ = public.split("+", 2)  # the key's bytes swapped for another's, under its name and hash
    copy.with_name("swapped.pub").write_text(f"{name}+{hash_}+{other.split('+', 2)[2]}")
    done = run("audit", copy, "--trust", copy.with_name("swapped.pub"))
    assert done.returncode == 64 and "altered or swapped" in one_error_line(done)


@pytest.mark.parametrize("kind", ["fifo", "symlink"])
def test_checkpoint_file_that_is_a_fifo_or_a_link_is_refused(copy: Path, kind: str) -> None:
    named = copy.with_name("named.checkpoints")
    if kind == "fifo":
        os.mkfifo(named)
    else:
        named.symlink_to(f"{copy}.checkpoints")
    done = run("audit", copy, "--trust", copy.with_name("ops.key.pub"), "--checkpoints", named, timeout=30)
    assert done.returncode == 65 and ("FIFO" if kind == "fifo" else "symbolic link") in one_error_line(done)
    signing = run("seal", copy, "--sign", copy.with_name("ops.key"), "--checkpoints", named, timeout=30)
    assert signing.returncode != 0 and "checkpoint file" in one_error_line(signing)


def test_option_mistakes_are_usage_or_missing_files(copy: Path) -> None:
    pub = str(copy.with_name("ops.key.pub"))
    assert run("audit", copy, "--checkpoints", f"{copy}.checkpoints").returncode == 64  # no --trust
    assert run("audit", copy, "--trust", pub, "--checkpoints", copy.with_name("none")).returncode == 66
    assert run("audit", copy, "--trust", copy.with_name("none.pub")).returncode == 66
    assert run("seal", copy, "--checkpoints", f"{copy}.checkpoints").returncode == 64  # no --sign
    os.chmod(copy.with_name("ops.key"), 0o644)
    done = run("seal", copy, "--sign", copy.with_name("ops.key"))
    assert done.returncode == 64 and "chmod 600" in one_error_line(done)
    os.unlink(f"{copy}.checkpoints")
    done = run("audit", copy, "--trust", pub)
    assert done.returncode == 65 and "no checkpoint file" in done.stdout


def test_export_carries_the_checkpoints_and_import_keeps_them_verifiable(copy: Path) -> None:
    out = copy.with_name("fleet.jsonl")
    done = run("export", copy, out)
    assert done.returncode == 0 and "1 signed checkpoint(s)" in done.stdout, done.stderr
    lines = out.read_text().splitlines()
    assert json.loads(lines[0])["checkpoints"] == 1 and "checkpoint" in json.loads(lines[-1])
    restored = copy.with_name("restored.db")
    done = run("import", out, restored)
    assert done.returncode == 0, done.stderr
    assert Path(f"{restored}.checkpoints").read_bytes() == Path(f"{copy}.checkpoints").read_bytes()
    assert run("audit", restored, "--trust", copy.with_name("ops.key.pub")).returncode == 0
    # A checkpoint altered in the export does not get in.
    note = json.loads(lines[-1])["checkpoint"]
    out.write_text("\n".join([*lines[:-1], json.dumps({"checkpoint": note.replace("\nkey-id none", "\nkey-id x")})])
                   + "\n")
    again = copy.with_name("again.db")
    done = run("import", out, again)
    assert done.returncode == 65 and "checkpoint" in one_error_line(done) and not again.exists()


def test_host_signs_checkpoints_while_it_serves_and_when_it_stops(tmp_path: Path) -> None:
    assert run("keygen", tmp_path / "host.key", "--name", "host").returncode == 0
    db = tmp_path / "runners.db"
    (tmp_path / "base").mkdir()
    with EventStore.open(db) as store:
        RunnerLifecycle(store, runner_id="runner-1", target="local", base_dir=str(tmp_path / "base"),
                        resources=Resources(cpu_seconds=30, memory_bytes=1 << 30),
                        post_session_hook_digest="sha256:" + "a" * 64).initialize()
    assert CLI is not None
    server = subprocess.Popen([CLI, "host", str(db), "--runner", "runner-1", "--tick", "0.2", "--sign",
                               str(tmp_path / "host.key"), "--checkpoint-every", "1"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert wait_for(lambda: Path(f"{db}.checkpoints").exists())
        with EventStore.open(db) as store:
            RunnerLifecycle(store, runner_id="runner-1", target="local", base_dir=str(tmp_path / "base"),
                            resources=Resources(cpu_seconds=30, memory_bytes=1 << 30),
                            post_session_hook_digest="sha256:" + "a" * 64).request_drain(expected_generation=1)
            head = store.head().seq
        assert wait_for(lambda: f"\n{head}\n" in Path(f"{db}.checkpoints").read_text())
    finally:
        server.send_signal(signal.SIGTERM)
        out, err = server.communicate(timeout=60)
    assert server.returncode == 0, out + err
    # The first is signed once the host serves (after its host lease was taken), the last at the head.
    signed = [int(seq) for seq in re.findall(r"^checkpoint seq (\d+) signed$", out, re.M)]
    assert len(signed) >= 2 and signed == sorted(signed) and signed[-1] == head, out
    done = run("audit", db, "--trust", tmp_path / "host.key.pub")
    assert done.returncode == 0 and f"checkpoints: {len(signed)} signed by a trusted key" in done.stdout, done.stdout
