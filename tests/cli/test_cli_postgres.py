"""The command line on a store on a PostgreSQL server: every command that takes a store takes a URL, and
``export``/``import`` move a store between SQLite and PostgreSQL with its chain, hash for hash."""

from __future__ import annotations

import json
from pathlib import Path

from fleets import audit_json, one_error_line, run
from pg import Server

from lifecycle_es import EventStore


def moved_to_server(fleet: Path, url: str, tmp_path: Path) -> str:
    """`fleet` exported and imported into `url`; the file store's head hash."""
    exported = tmp_path / "fleet.jsonl"
    assert run("export", fleet, exported).returncode == 0
    done = run("import", exported, url)
    assert done.returncode == 0, done.stderr
    with EventStore.open(str(fleet), read_only=True) as store:
        return store.head().hash.hex()


def test_a_file_store_moves_to_a_server_and_back_with_the_same_head(fleet_log: tuple[Path, dict[str, int]],
                                                                   pg_url: str, tmp_path: Path) -> None:
    fleet, _ = fleet_log
    head = moved_to_server(fleet, pg_url, tmp_path)
    code, report = audit_json(pg_url)
    assert code == 0 and report["ok"] is True and report["head_hash"] == head, report
    back = tmp_path / "back.jsonl"
    assert run("export", pg_url, back).returncode == 0
    assert run("import", back, tmp_path / "back.db").returncode == 0
    code, again = audit_json(tmp_path / "back.db")
    assert code == 0 and again["head_hash"] == head and again["events"] == report["events"]
    # The two exports are the same rows (the header names the same store and head).
    lines = (tmp_path / "fleet.jsonl").read_text().splitlines()
    assert lines[1:] == back.read_text().splitlines()[1:]


def test_show_events_rebuild_and_seal_take_a_url(fleet_log: tuple[Path, dict[str, int]], pg_url: str,
                                                 tmp_path: Path) -> None:
    fleet, _ = fleet_log
    moved_to_server(fleet, pg_url, tmp_path)
    shown = run("show", pg_url, "--json")
    assert shown.returncode == 0, shown.stderr
    assert run("show", fleet, "--json").stdout == shown.stdout
    events = run("events", pg_url, "-n", "3", "--json")
    assert events.returncode == 0 and len(events.stdout.strip().splitlines()) == 3, events.stderr
    rebuilt = run("rebuild", pg_url)
    assert rebuilt.returncode == 0 and "rebuilt" in rebuilt.stdout, rebuilt.stderr
    assert run("seal", pg_url).returncode == 64  # a server's store has no file beside it
    sealed = run("seal", pg_url, "-o", tmp_path / "fleet.seal")
    assert sealed.returncode == 0, sealed.stderr
    code, report = audit_json(pg_url, "--seal", str(tmp_path / "fleet.seal"))
    assert code == 0 and report["ok"] is True


def test_an_import_never_overwrites_a_servers_store(fleet_log: tuple[Path, dict[str, int]], pg_url: str,
                                                    tmp_path: Path) -> None:
    fleet, _ = fleet_log
    moved_to_server(fleet, pg_url, tmp_path)
    done = run("import", tmp_path / "fleet.jsonl", pg_url)
    assert done.returncode == 73 and "already holds a store" in one_error_line(done)


def test_a_url_with_a_password_is_refused_on_the_command_line(pg_server: Server) -> None:
    url = f"postgresql://postgres:hunter2@/postgres?host={pg_server.directory}"
    for argv in (("audit", url), ("show", url), ("export", url, "out.jsonl")):
        done = run(*argv)
        line = one_error_line(done)
        assert done.returncode == 64 and "hunter2" not in line and ".pgpass" in line, line


def test_a_url_with_an_sslpassword_is_refused_on_the_command_line_naming_where_it_goes(pg_server: Server) -> None:
    done = run("audit", f"postgresql://postgres@/postgres?host={pg_server.directory}&sslpassword=hunter2")
    line = one_error_line(done)
    assert done.returncode == 64 and "hunter2" not in line and "PGSERVICEFILE" in line, line


def test_an_unreachable_server_is_one_line(tmp_path: Path) -> None:
    done = run("audit", f"postgresql://postgres@/postgres?host={tmp_path}")
    line = one_error_line(done)
    assert done.returncode == 74 and "cannot connect" in line, line


def test_the_audit_json_of_a_server_store_names_it_without_a_password(fleet_log: tuple[Path, dict[str, int]],
                                                                      pg_url: str, tmp_path: Path) -> None:
    fleet, _ = fleet_log
    moved_to_server(fleet, pg_url, tmp_path)
    done = run("audit", pg_url, "--json", "--jobs", "2")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["ok"] is True
