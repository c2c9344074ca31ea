"""A row no append writes, met by a command that does not check the chain (``events``, ``export``, ``rebuild``,
``show``): a column longer than the backend reads (it comes back NULL), a seq or version beyond 2^53-1. Each
command exits 65 naming the row, as the audit does; none prints, exports or folds the NULL as a value, and none
blames an option the user never gave (64)."""

from __future__ import annotations

import resource
import subprocess
from pathlib import Path

import pytest
from fleets import CLI, copy_store, run, smuggle

from lifecycle_es import EventStore
from lifecycle_es.backend import MAX_FIELD_BYTES
from lifecycle_es.values import MAX_SAFE_INTEGER

LONG = MAX_FIELD_BYTES + 1


def limit_memory() -> None:
    """preexec_fn: 512 MiB of address space, so a value read whole fails visibly instead of slowly succeeding."""
    resource.setrlimit(resource.RLIMIT_AS, (512 << 20, 512 << 20))


def edited(fleet_log: tuple[Path, dict[str, int]], tmp_path: Path, sql: str) -> tuple[Path, int]:
    path = copy_store(fleet_log[0], tmp_path / "edited.db", seal=False)
    with EventStore.open(path) as store:
        seq = store.head().seq // 2
    smuggle(path, (sql, (seq,)))
    return path, seq


@pytest.mark.parametrize("column", ["stream", "type", "at", "prev", "hash"])
def test_a_column_longer_than_a_read_takes_fails_every_read_at_its_row(fleet_log: tuple[Path, dict[str, int]],
                                                                       tmp_path: Path, column: str) -> None:
    value = f"zeroblob({LONG})" if column in ("prev", "hash") else f"printf('%.{LONG}c', 'r')"
    path, seq = edited(fleet_log, tmp_path, f"UPDATE events SET {column} = {value} WHERE seq = ?")
    commands = [["events", path], ["events", path, "-j"], ["events", path, "--since", "2000-01-01"],
                ["export", path, tmp_path / "out.jsonl"]]
    if column not in ("prev", "hash"):
        # An unkeyed rebuild folds the rules alone: it reads no link, and no hash but a runner's last (the audit
        # proves them; `test_a_last_hash_no_append_writes_fails_a_rebuild`).
        commands.append(["rebuild", copy_store(path, tmp_path / "rebuilt.db", seal=False)])
    for command in commands:
        done = run(*command)
        assert done.returncode == 65, (command, done.returncode, done.stdout[-300:], done.stderr)
        assert f"integrity failure at seq {seq}" in done.stderr, (command, done.stderr)
        assert "null" not in done.stdout.lower() and "None" not in done.stdout, command


@pytest.mark.parametrize("value", [MAX_SAFE_INTEGER + 2, 2**63 - 1])
def test_a_seq_beyond_the_safe_integers_is_the_logs_fault_not_an_option(fleet_log: tuple[Path, dict[str, int]],
                                                                         tmp_path: Path, value: int) -> None:
    path, _ = edited(fleet_log, tmp_path, f"UPDATE events SET seq = {value} WHERE seq = ?")  # now the head
    for command in (["show", path], ["show", path, "runner-01"], ["events", path, "-n", "3"],
                    ["rebuild", path]):
        done = run(*command)
        assert done.returncode == 65, (command, done.returncode, done.stderr)
        assert f"a seq of {value} is outside 1..{MAX_SAFE_INTEGER}" in done.stderr, (command, done.stderr)


def test_a_version_beyond_the_safe_integers_is_the_logs_fault_not_an_option(fleet_log: tuple[Path, dict[str, int]],
                                                                             tmp_path: Path) -> None:
    path = copy_store(fleet_log[0], tmp_path / "edited.db", seal=False)
    with EventStore.open(path) as store:
        stream = store.streams()[0]
        version = store.stream_version(stream)
    huge = 2**63 - 1
    smuggle(path, ("UPDATE events SET version = ? WHERE stream = ? AND version = ?", (huge, stream, version)))
    for command in (["events", path, "-r", stream, "-n", "2"], ["events", path, "-r", stream]):
        done = run(*command)
        assert done.returncode == 65, (command, done.returncode, done.stderr)
        assert f"a version of {huge} is outside 1..{MAX_SAFE_INTEGER}" in done.stderr, (command, done.stderr)


def test_a_last_hash_no_append_writes_fails_a_rebuild(fleet_log: tuple[Path, dict[str, int]], tmp_path: Path) -> None:
    # A runner's snapshot names its last event's hash: one the backend reads as NULL is named at its row.
    path = copy_store(fleet_log[0], tmp_path / "edited.db", seal=False)
    with EventStore.open(path) as store:
        head = store.head().seq
    smuggle(path, (f"UPDATE events SET hash = zeroblob({LONG}) WHERE seq = ?", (head,)))
    for jobs in ("1", "2"):
        done = run("rebuild", path, "--jobs", jobs)
        assert done.returncode == 65, (jobs, done.returncode, done.stderr)
        assert f"integrity failure at seq {head}" in done.stderr, done.stderr


@pytest.mark.parametrize("key", ["store_id", "key_id"])
def test_a_meta_value_longer_than_a_store_writes_is_refused_unread(fleet_log: tuple[Path, dict[str, int]],
                                                                   tmp_path: Path, key: str) -> None:
    # A store id is 16 bytes, a key id a few dozen: one of 300 MB (anyone who can write the file can make it)
    # is refused by its length alone, never loaded, by every command that opens the store.
    path = copy_store(fleet_log[0], tmp_path / "edited.db", seal=False)
    smuggle(path, ("INSERT OR REPLACE INTO meta (key, value) VALUES (?, zeroblob(300000000))", (key,)))
    for command in (["show", path], ["events", path, "-n", "1"], ["audit", path]):
        done = subprocess.run([str(CLI), *map(str, command)], capture_output=True, text=True, timeout=120,
                              check=False, preexec_fn=limit_memory)
        assert done.returncode in (65, 66), (command, done.returncode, done.stderr)
        assert f"its meta value {key!r} is 300,000,000 bytes" in done.stderr, (command, done.stderr)
