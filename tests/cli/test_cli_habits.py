"""The command line's shared habits, through the real console script: one refusal (exit 66, one message)
of a runner the log does not have, whatever the command; short options that are the long ones; and
``events -n/-f/--since/--until``, journalctl's way, the last N found without reading the log from its start."""

from __future__ import annotations

import json
import os
import re
import select
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import apsw
import pytest
from fleets import CLI, HOOK, KEY, attack, copy_store, long_in, one_error_line, run

from lifecycle_es import EventStore, ProxyAuthority, Resources, RunnerLifecycle
from lifecycle_es.canonical import iso_ms, parse_iso_ms
from lifecycle_es.cli.events import last_events, seq_window, window
from lifecycle_es.cli.options import LAST_MS
from lifecycle_es.events import RUNNER_SCHEMA, LeaseAcquired, RunnerInitialized
from lifecycle_es.replay import load

FleetLog = tuple[Path, dict[str, int]]
NEWLINE = b"\n"


@pytest.fixture(scope="module")
def every_event(fleet_log: FleetLog) -> list[dict[str, Any]]:
    """``events --json`` of the whole fleet log: what every selection is checked against."""
    return json_lines(run("events", fleet_log[0], "--json"))


def json_lines(done: subprocess.CompletedProcess[str]) -> list[dict[str, Any]]:
    """The parsed lines of a command that must have succeeded."""
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()]


# --- a runner the log does not have ------------------------------------------------------------------


@pytest.mark.parametrize("argv", [
    ("show", "runner-404"),
    ("show", "runner-404", "--json"),
    ("events", "--runner", "runner-404"),
    ("events", "-r", "runner-404", "-n", "5"),
    ("events", "-r", "runner-404", "-f"),  # refused before it follows: it does not wait for the runner
    ("timeline", "--runner", "runner-404", "-o", "OUT"),
    ("timeline", "-r", "runner-0", "-r", "runner-404", "-o", "OUT"),
], ids=" ".join)
def test_every_command_refuses_a_runner_the_log_lacks_with_66_and_one_message(fleet_log: FleetLog, tmp_path: Path,
                                                                             argv: tuple[str, ...]) -> None:
    path, out = fleet_log[0], tmp_path / "out.svg"
    command, *rest = argv
    done = run(command, path, *(str(out) if arg == "OUT" else arg for arg in rest), timeout=60)
    assert done.returncode == 66 and done.stdout == ""
    assert one_error_line(done) == (f"lifecycle-es {command}: error: no runner 'runner-404' in {path} "
                                    f"('lifecycle-es show {path}' lists the runners it has)")
    assert not out.exists()


def test_show_names_the_seq_a_runner_did_not_exist_at_yet(fleet_log: FleetLog) -> None:
    path = fleet_log[0]
    done = run("show", path, "runner-2", "--at", "1")  # runner-2 is initialized at seq 3
    assert done.returncode == 66
    assert f"error: no runner 'runner-2' in {path} as of seq 1 (" in one_error_line(done)


def test_a_runner_id_that_cannot_be_one_is_bad_usage_before_the_file_is_read(tmp_path: Path) -> None:
    for argv in (("events", "-r", "no spaces!"), ("timeline", "-r", "no spaces!", "-o", "x.svg"),
                 ("show", "no spaces!"), ("host", "-r", "no spaces!")):
        done = run(argv[0], tmp_path / "absent.db", *argv[1:])
        assert done.returncode == 64 and "'no spaces!' is not an id" in done.stderr, done.stderr



@pytest.mark.parametrize("argv", [("show", "runner-0", "EVIL"), ("events", "--EVIL"), ("rebuild", "EVIL")],
                         ids=" ".join)
def test_a_usage_error_prints_what_it_quotes_escaped(fleet_log: FleetLog, argv: tuple[str, ...]) -> None:
    # `lifecycle-es show runners.db runner-0 *` in a directory where others name files: argparse quotes the
    # arguments it did not expect as they are.
    evil = "f\x1b]0;owned\x07\u202e"
    done = run(argv[0], fleet_log[0], *(arg.replace("EVIL", evil) for arg in argv[1:]))
    assert done.returncode == 64
    assert "f\\x1b]0;owned\\x07\\u202e" in done.stderr, done.stderr
    assert not set(done.stderr) & {"\x1b", "\x07", "\u202e"}, done.stderr

@pytest.mark.parametrize("argv", [
    ("events", "--after", "99999999999999999999"),
    ("events", "--after", "99999999999999999999", "-n", "5"),
    ("events", "--after", "9007199254740992", "-f"),
    ("show", "--at", "99999999999999999999"),
    ("show", "runner-0", "--at", "9007199254740992"),
    ("rebuild", "--jobs", "99999999999999999999"),
    ("audit", "--jobs", "257"),
    ("timeline", "-n", "99999999999999999999", "-o", "OUT"),
], ids=" ".join)
def test_a_seq_or_count_no_store_holds_is_bad_usage_naming_its_option(fleet_log: FleetLog, tmp_path: Path,
                                                                      argv: tuple[str, ...]) -> None:
    from fleets import store_bytes

    path, out = fleet_log[0], tmp_path / "out.svg"
    before = store_bytes(path)
    command, *rest = argv
    done = run(command, path, *(str(out) if arg == "OUT" else arg for arg in rest), timeout=60)
    assert done.returncode == 64 and done.stdout == "", done.stderr
    option = next(arg for arg in rest if arg.startswith("-") and arg != "-f")
    most = "256" if option == "--jobs" else "9007199254740991"  # processes are capped far below any seq
    assert f"error: argument {option}" in done.stderr and f"is more than {most}" in done.stderr, done.stderr
    assert store_bytes(path) == before and not out.exists()


@pytest.mark.parametrize("argv", [
    ("events", "--since", "0001-01-01T00:00:00+14:00"),
    ("events", "--until", "9999-12-31T23:59:59-14:00"),
    ("timeline", "--since", "0001-01-01T00:00:00+14:00", "-o", "OUT"),
    ("timeline", "--until", "9999-12-31T23:59:59-14:00", "-o", "OUT"),
], ids=" ".join)
def test_a_time_outside_the_years_iso_8601_spells_is_bad_usage_naming_its_option(
        fleet_log: FleetLog, tmp_path: Path, argv: tuple[str, ...]) -> None:
    path, out = fleet_log[0], tmp_path / "out.svg"
    command, option, value, *rest = argv
    done = run(command, path, option, value, *(str(out) if arg == "OUT" else arg for arg in rest), timeout=60)
    assert done.returncode == 64 and done.stdout == "", done.stderr
    assert f"error: argument {option}: '{value}' is outside the years 0001 to 9999" in done.stderr, done.stderr
    assert not out.exists()


# Every number an option takes, with what makes the command reach it: Python's int() and float() also read
# other scripts' digits, underscores, spaces and a '+', which the command line must not take for a number.
NUMBER_OPTIONS = [
    ("events", "--after"), ("events", "-n"), ("show", "--at"), ("timeline", "-n", "-o", "OUT"),
    ("audit", "--jobs"), ("rebuild", "--jobs"), ("host", "--stop-timeout-ms", "-r", "runner-0"),
    ("host", "--park-threshold-ms", "-r", "runner-0"), ("host", "--host-lease-ttl-ms", "-r", "runner-0"),
    ("host", "--host-lease-grace-ms", "-r", "runner-0"), ("host", "--checkpoint-every", "--sign", "KEY"),
    ("host", "--tick", "-r", "runner-0"), ("host", "--checkpoint-seconds", "--sign", "KEY"),
]
NOT_ASCII_NUMBERS = ["\u0663", "\uff13", "\u0968", "1_0", " 3", "3 ", "+3", "3\n", "\u0663\u202e"]


@pytest.mark.parametrize("value", NOT_ASCII_NUMBERS, ids=ascii)
@pytest.mark.parametrize("argv", NUMBER_OPTIONS, ids=" ".join)
def test_a_number_not_in_ascii_digits_is_bad_usage_naming_its_option_and_value(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: tuple[str, ...], value: str) -> None:
    from lifecycle_es.cli import main

    command, option, *rest = argv
    out = tmp_path / "out.svg"
    # No store: a number taken would go on to open it (exit 66), or serve it.
    args = [command, str(tmp_path / "absent.db"), option, value, *(str(out) if a == "OUT" else a for a in rest)]
    with pytest.raises(SystemExit) as exited:
        main(args)
    err = capsys.readouterr().err
    assert exited.value.code == 64, err
    # The option by its names, the value as repr shows it (a bidi override escaped), and what to write.
    named = rf"error: argument (\S+/)?{re.escape(option)}(/\S+)?: {re.escape(repr(value))} is not .*digits 0-9"
    assert re.search(named, err) and "\u202e" not in err, err
    assert not out.exists() and not (tmp_path / "absent.db").exists()


def test_the_metrics_port_and_the_watchdog_take_ascii_digits_only() -> None:
    from lifecycle_es.cli.metrics import parse_address
    from lifecycle_es.cli.notify import Notifier
    from lifecycle_es.errors import InvalidInputError

    assert parse_address("127.0.0.1:9464") == ("127.0.0.1", 9464)
    for port in ("\u0669\u0664\u0666\u0664", "\u00b2", "+9464", "9_464", "-1", "0", "65536"):
        with pytest.raises(InvalidInputError, match="--metrics must be ADDR:PORT"):
            parse_address(f"127.0.0.1:{port}")
    for usec in ("\u0664000000", "\u00b2", "+4000000", "-4000000", "4_000_000"):
        notifier = Notifier.from_environment({"NOTIFY_SOCKET": "/run/n", "WATCHDOG_USEC": usec})
        assert notifier is not None and notifier.watchdog_interval() is None, usec


def test_a_seq_that_is_no_number_is_shown_cut_short(fleet_log: FleetLog) -> None:
    done = run("show", fleet_log[0], "--at", "9" * 5000 + "x")
    assert done.returncode == 64 and "error: argument --at: '99999" in done.stderr
    assert "... is not an integer" in done.stderr
    assert len(done.stderr) < 400, done.stderr


# --- short options -----------------------------------------------------------------------------------


def test_short_options_are_the_long_ones(fleet_log: FleetLog, tmp_path: Path) -> None:
    path = fleet_log[0]
    for short, long in [
        (("events", "-r", "runner-1", "-n", "4", "-j"), ("events", "--runner", "runner-1", "--lines", "4", "--json")),
        (("show", "runner-0", "-j"), ("show", "runner-0", "--json")),
        (("timeline", "-r", "runner-0", "-n", "2", "-o", "-"), ("timeline", "--runner", "runner-0", "--last", "2",
                                                                 "--output", "-")),
    ]:
        by_short, by_long = run(short[0], path, *short[1:]), run(long[0], path, *long[1:])
        assert by_short.returncode == 0 and by_short.stdout, by_short.stderr
        assert (by_short.returncode, by_short.stdout) == (by_long.returncode, by_long.stdout)

    keyed = fleet_in_keyed(tmp_path)
    key_file = tmp_path / "store.key"
    key_file.write_text(KEY.hex())
    key_file.chmod(0o600)
    assert run("audit", keyed, "--json").returncode == 77
    assert run("audit", keyed, "-k", key_file, "--json").returncode == 0
    assert run("rebuild", keyed, "-k", key_file).returncode == 0
    assert run("seal", keyed, "-k", key_file).returncode == 0


def fleet_in_keyed(tmp_path: Path) -> Path:
    """A keyed fleet log of its own (rebuild and seal write to it)."""
    from fleets import build_fleet

    path = tmp_path / "keyed" / "fleet.db"
    path.parent.mkdir()
    build_fleet(path, key=KEY)
    return path


# --- events: the last N, a window of time ------------------------------------------------------------


def test_events_n_prints_the_last_n_of_what_is_selected(fleet_log: FleetLog, every_event: list[dict[str, Any]]) -> None:
    path = fleet_log[0]
    total = len(every_event)
    for count in (1, 5, total - 1, total, total + 5):
        assert json_lines(run("events", path, "-n", str(count), "-j")) == every_event[-count:]
    assert json_lines(run("events", path, "-n", "0", "-j")) == []
    assert json_lines(run("events", path, "-n", "all", "-j")) == every_event
    for runner in ("runner-0", "runner-1", "runner-2"):
        mine = [event for event in every_event if event["stream"] == runner]
        for count in (1, 3, len(mine) + 1):
            assert json_lines(run("events", path, "-r", runner, "-n", str(count), "-j")) == mine[-count:]
    for after in (0, 10, total - 2, total + 3):
        later = [event for event in every_event if event["seq"] > after]
        assert json_lines(run("events", path, "--after", str(after), "-n", "100", "-j")) == later
        assert json_lines(run("events", path, "--after", str(after), "-n", "2", "-j")) == later[-2:]
        theirs = [event for event in later if event["stream"] == "runner-0"]
        assert json_lines(run("events", path, "-r", "runner-0", "--after", str(after), "-n", "50", "-j")) == theirs
    text = run("events", path, "-n", "2")
    assert text.returncode == 0 and len(text.stdout.splitlines()) == 2
    assert text.stdout.splitlines()[-1].split()[0] == str(every_event[-1]["seq"])
    assert run("events", path, "-n", "-1").returncode == 64


@pytest.mark.parametrize("count", [2**63, 10**30], ids=["2**63", "10**30"])
def test_events_n_beyond_any_log_prints_every_event(fleet_log: FleetLog, every_event: list[dict[str, Any]],
                                                    count: int) -> None:
    path = fleet_log[0]
    assert json_lines(run("events", path, "-n", str(count), "-j")) == every_event
    assert json_lines(run("events", path, "-r", "runner-1", "-n", str(count), "-j")) == [
        event for event in every_event if event["stream"] == "runner-1"]
    with EventStore.open(path, read_only=True) as store:
        assert [r.seq for r in last_events(store, count, keep=lambda r: r.seq % 2 == 0)] == [
            event["seq"] for event in every_event if event["seq"] % 2 == 0]


def test_events_since_and_until_select_by_time(fleet_log: FleetLog, every_event: list[dict[str, Any]]) -> None:
    path = fleet_log[0]
    times = sorted({event["at"] for event in every_event})
    low, high = times[3], times[-4]
    inside = [event for event in every_event if low <= event["at"] <= high]
    assert 0 < len(inside) < len(every_event)
    assert json_lines(run("events", path, "--since", low, "--until", high, "-j")) == inside
    assert json_lines(run("events", path, "--since", low, "--until", high, "-n", "2", "-j")) == inside[-2:]
    theirs = [event for event in inside if event["stream"] == "runner-0"]
    assert json_lines(run("events", path, "-r", "runner-0", "--since", low, "--until", high, "-j")) == theirs
    assert json_lines(run("events", path, "-r", "runner-0", "--since", low, "-n", "3", "-j")) == [
        event for event in every_event if event["stream"] == "runner-0" and event["at"] >= low][-3:]
    # The same moment an hour east of UTC, and a date alone (its midnight, UTC)
    east = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(parse_iso_ms(low) // 1000 + 3600)) + ".000+01:00"
    assert json_lines(run("events", path, "--since", east, "--until", high, "-j")) == inside
    assert json_lines(run("events", path, "--since", "1999-12-31", "-j")) == every_event
    assert json_lines(run("events", path, "--until", "1999-12-31", "-j")) == []
    never = path.parent / "never.svg"
    for command in (("events",), ("timeline", "-o", str(never))):
        done = run(command[0], path, "--since", high, "--until", low, *command[1:])
        assert done.returncode == 64 and not never.exists()
        assert one_error_line(done) == (f"lifecycle-es {command[0]}: error: --since {high} is after --until {low}: "
                                        "the window holds nothing; give --since the earlier time")
    assert run("events", path, "-f", "--until", high).returncode == 64  # a follow has no end in time
    assert run("events", path, "--since", "yesterday").returncode == 64



def test_a_since_between_two_milliseconds_starts_after_the_earlier_one(fleet_log: FleetLog,
                                                                       every_event: list[dict[str, Any]]) -> None:
    # The store writes times to the millisecond; a --since half a millisecond after an event's at is after
    # that event, and a --until half a millisecond after it is not before it.
    path = fleet_log[0]
    at = every_event[5]["at"]
    later = at[:-1] + "5Z"  # 2026-01-01T00:00:05.000Z -> 2026-01-01T00:00:05.0005Z
    assert json_lines(run("events", path, "--since", later, "-j")) == [
        event for event in every_event if event["at"] > at]
    assert json_lines(run("events", path, "--until", later, "-j")) == [
        event for event in every_event if event["at"] <= at]

def test_a_time_window_is_found_by_bisection_not_by_reading_the_log(fleet_log: FleetLog,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    path = fleet_log[0]
    with EventStore.open(path, read_only=True) as store:
        head = store.head().seq
        everything = list(store.read())
        looked: list[int] = []
        event_at = store.event_at
        monkeypatch.setattr(store, "event_at", lambda seq: looked.append(seq) or event_at(seq))
        times = sorted({r.at for r in everything})
        for since, until in ((times[5], times[-5]), (times[0], None), (None, times[len(times) // 2]),
                             (times[-1], None), ("2000-01-01T00:00:00.000Z", "2000-01-02T00:00:00.000Z")):
            looked.clear()
            inside = [r.seq for r in everything
                      if (since is None or r.at >= since) and (until is None or r.at <= until)]
            first, last = seq_window(store, since and parse_iso_ms(since), until and parse_iso_ms(until), head)
            assert list(range(first, last + 1)) == inside, (since, until)
            assert len(looked) <= 2 * (head.bit_length() + 1) < head
    # The command reads the window, not the log from its start.
    since = times[-3]
    listed = [json.loads(line) for line in run("events", path, "--since", since, "-j").stdout.splitlines()]
    assert [event["seq"] for event in listed] == [r.seq for r in everything if r.at >= since]


def test_last_events_reads_back_from_the_head_not_the_whole_log(tmp_path_factory: pytest.TempPathFactory,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    path = long_in(tmp_path_factory)
    with EventStore.open(path, read_only=True) as store:
        head = store.head().seq
        everything = list(store.read())
        fetched: list[int] = []
        backend = store.backend

        def counting(real: Any) -> Any:
            def counted(*args: Any, **kwargs: Any) -> Any:
                for rows in real(*args, **kwargs):
                    fetched.append(len(rows))
                    yield rows
            return counted

        for name in ("pages", "stream_pages"):
            monkeypatch.setattr(backend, name, counting(getattr(backend, name)))

        assert [r.seq for r in last_events(store, 10)] == list(range(head - 9, head + 1))
        assert sum(fetched) == 10
        fetched.clear()
        mine = [r for r in everything if r.stream == "runner-3"]
        assert last_events(store, 10, runner="runner-3") == mine[-10:]
        assert sum(fetched) == 10
        fetched.clear()
        sparse = [r for r in everything if r.seq % 7 == 0]
        assert last_events(store, 10, keep=lambda r: r.seq % 7 == 0) == sparse[-10:]
        assert sum(fetched) < 10 * 7 * 2 + 10  # chunks double: at most twice what holds the ten
        fetched.clear()
        assert last_events(store, 5, after=head - 3) == everything[-3:]
        assert sum(fetched) == 3
    assert [json.loads(line)["seq"] for line in run("events", path, "-n", "3", "-j").stdout.splitlines()] == [
        head - 2, head - 1, head]


def test_the_last_events_of_a_stream_that_lost_a_row_are_each_printed_once(tmp_path: Path) -> None:
    path, start = tmp_path / "edited.db", parse_iso_ms("2026-01-01T00:00:00Z")
    with EventStore.open(path) as store:
        store.append_unchecked("runner-1", [RunnerInitialized(
            schema=RUNNER_SCHEMA, runner_id="runner-1", target="local", base_dir="/srv/runner-1",
            resources=Resources(cpu_seconds=600, memory_bytes=1 << 30), post_session_hook_digest=HOOK)],
            at=iso_ms(start))
        proxy = ProxyAuthority(id="proxy-1", revision=1, issued_at=iso_ms(start), expires_at=iso_ms(start + 3_600_000))
        for n in range(1, 20):  # versions 2 to 20, a second apart
            store.append_unchecked("runner-1", [LeaseAcquired(
                lease_id=f"lease-{n}", session_id="s", lease_generation=1, issued_at=iso_ms(start),
                expires_at=iso_ms(start + 600_000), proxy_authority=proxy)], at=iso_ms(start + n * 1000))
    attack(path, ("DELETE FROM events WHERE version = 10", ()))  # a stream whose versions skip one
    until = iso_ms(start + 17_000)  # version 18's time: the newest chunk keeps 16 to 18, the next reads past its gap
    listed = [event["version"] for event in json_lines(run("events", path, "-r", "runner-1", "--until", until, "-j"))]
    assert listed == [*range(1, 10), *range(11, 19)]
    assert [event["version"] for event in json_lines(run("events", path, "-r", "runner-1", "-n", "5", "--until", until,
                                                         "-j"))] == listed[-5:]
    with EventStore.open(path, read_only=True) as store:
        assert [r.version for r in last_events(store, 5, runner="runner-1", head=18)] == listed[-5:]


def test_window_compares_times_as_the_store_writes_them() -> None:
    assert window(None, None) is None
    keep = window(parse_iso_ms("2026-03-02T10:00:00Z"), parse_iso_ms("2026-03-02T10:30:00Z"))
    assert keep is not None

    class At:
        def __init__(self, at: str) -> None:
            self.at = at

    assert [keep(At(iso_ms(parse_iso_ms(t)))) for t in (  # type: ignore[arg-type]
        "2026-03-02T09:59:59.999Z", "2026-03-02T10:00:00Z", "2026-03-02T10:30:00Z", "2026-03-02T10:30:00.001Z")
    ] == [False, True, True, False]
    before_epoch = window(-10**15, None)  # a bound outside the years a store writes is held to them
    assert before_epoch is not None and before_epoch(At("1970-01-01T00:00:00.000Z"))  # type: ignore[arg-type]
    # An end before the first time a store can stamp, or a start after its last, selects nothing at all: not the
    # events stamped at that first (a clock at 0) or last millisecond.
    first, last = At("1970-01-01T00:00:00.000Z"), At("9999-12-31T23:59:59.999Z")
    for since_ms, until_ms in ((None, -1), (None, -10**15), (LAST_MS + 1, None)):
        outside = window(since_ms, until_ms)
        assert outside is not None and not outside(first) and not outside(last)  # type: ignore[arg-type]


def test_a_since_raised_past_the_last_millisecond_is_refused_as_after_until(tmp_path: Path) -> None:
    path = tmp_path / "empty.db"
    EventStore.open(path).close()
    done = run("events", path, "--since", "9999-12-31T23:59:59.9999Z", "--until", "9999-12-31T23:59:59.999Z")
    assert done.returncode == 64 and "is after --until" in done.stderr, (done.returncode, done.stderr)


# --- events -f: journalctl's way ---------------------------------------------------------------------


def append_lease(path: Path, runner: str, session: str) -> int:
    """Acquire a lease on `runner` as another writer of the log would (the rules' own way); its seq."""
    now = time.time_ns() // 1_000_000
    with EventStore.open(path) as store:
        state = load(store, runner).state
        assert state is not None
        lifecycle = RunnerLifecycle(store, runner_id=runner, target=state.target, base_dir=state.base_dir,
                                    resources=state.resources, post_session_hook_digest=state.post_session_hook_digest)
        snap = lifecycle.snapshot()
        proxy = ProxyAuthority(id=snap.proxy_authority.id, revision=snap.proxy_authority.revision,
                               issued_at=iso_ms(now - 1000), expires_at=iso_ms(now + 600_000))
        lifecycle.acquire_lease(session_id=session, expected_generation=snap.generation, proxy_authority=proxy)
        return store.head().seq


class Follower:
    """``lifecycle-es events ARGS`` running in its own process; its stdout read a line at a time, bounded."""

    def __init__(self, *args: str | Path) -> None:
        assert CLI is not None
        self.proc = subprocess.Popen([CLI, "events", *map(str, args)], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, bufsize=0)
        self.pending = b""

    def lines(self, count: int, timeout_s: float = 60) -> list[dict[str, Any]]:
        """The next `count` JSON lines; fails the test if they do not come within `timeout_s` (a hang bound)."""
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout_s
        while self.pending.count(b"\n") < count:
            ready, _, _ = select.select([self.proc.stdout], [], [], max(0.0, deadline - time.monotonic()))
            assert ready, f"the follower printed {self.pending.count(NEWLINE)} of {count} lines within {timeout_s} s"
            chunk = os.read(self.proc.stdout.fileno(), 65536)
            assert chunk, f"the follower ended with {self.proc.wait()}: {self.proc.communicate()[1]!r}"
            self.pending += chunk
        *taken, self.pending = self.pending.split(b"\n", count)
        return [json.loads(line) for line in taken]

    def stop(self, signum: int = signal.SIGTERM) -> tuple[int, bytes, bytes]:
        """Signal it; its exit code and whatever else it printed."""
        self.proc.send_signal(signum)
        out, err = self.proc.communicate(timeout=60)
        return self.proc.returncode, self.pending + out, err

    def close(self) -> None:
        """Kill it if a failed test left it running."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def test_follow_alone_prints_the_last_ten_then_what_another_process_commits(
        fleet_log: FleetLog, every_event: list[dict[str, Any]], tmp_path: Path) -> None:
    path = copy_store(fleet_log[0], tmp_path / "followed.db", seal=False)
    follower = Follower(path, "-f", "-j")
    try:
        assert follower.lines(10) == every_event[-10:]
        seq = append_lease(path, "runner-1", "s-late")
        (late,) = follower.lines(1)
        assert (late["seq"], late["stream"], late["type"]) == (seq, "runner-1", "LeaseAcquired")
        code, rest, err = follower.stop(signal.SIGTERM)
        assert (code, rest) == (0, b""), err
        assert b"Traceback" not in err
    finally:
        follower.close()


def test_follow_with_n_prints_n_then_follows_one_runner_across_processes(
        fleet_log: FleetLog, every_event: list[dict[str, Any]], tmp_path: Path) -> None:
    path = copy_store(fleet_log[0], tmp_path / "followed.db", seal=False)
    mine = [event for event in every_event if event["stream"] == "runner-1"]
    follower = Follower(path, "-n", "3", "-f", "-r", "runner-1", "-j")
    try:
        assert follower.lines(3) == mine[-3:]
        append_lease(path, "runner-0", "s-other")  # another runner: not this follower's
        seq = append_lease(path, "runner-1", "s-mine")
        (late,) = follower.lines(1)
        assert (late["seq"], late["stream"]) == (seq, "runner-1")
        code, rest, err = follower.stop(signal.SIGINT)
        assert (code, rest) == (0, b""), err
    finally:
        follower.close()


def test_follow_with_n_0_prints_only_what_is_committed_later(fleet_log: FleetLog, tmp_path: Path) -> None:
    path = copy_store(fleet_log[0], tmp_path / "followed.db", seal=False)
    follower = Follower(path, "-f", "-n", "0", "-j")
    try:
        # Nothing says when it has read the head, so commit until it prints: the first line it prints is
        # one committed here, never one of the log's old events.
        committed: list[int] = []
        while not select.select([follower.proc.stdout], [], [], 0.3)[0] and len(committed) < 200:
            committed.append(append_lease(path, "runner-0", f"s-{len(committed)}"))
        (first,) = follower.lines(1)
        assert first["seq"] in committed and first["seq"] > fleet_log[1]["head"]
        assert follower.stop()[0] == 0
    finally:
        follower.close()


@pytest.mark.parametrize("start", [("--after", "AFTER"), ("--since", "SINCE")], ids=" ".join)
def test_follow_starts_where_n_after_or_since_says(fleet_log: FleetLog, every_event: list[dict[str, Any]],
                                                  tmp_path: Path, start: tuple[str, str]) -> None:
    path = copy_store(fleet_log[0], tmp_path / "followed.db", seal=False)
    after, since = every_event[2]["seq"], every_event[-15]["at"]
    first = {"AFTER": every_event[3:],
             "SINCE": [event for event in every_event if event["at"] >= since]}[start[1]]
    assert len(first) != 10
    value = {"AFTER": str(after), "SINCE": since}[start[1]]
    follower = Follower(path, "-f", "-j", start[0], value)
    try:
        assert follower.lines(len(first)) == first
        seq = append_lease(path, "runner-0", "s-late")
        assert [event["seq"] for event in follower.lines(1)] == [seq]
        code, rest, _ = follower.stop()
        assert (code, rest) == (0, b"")
    finally:
        follower.close()


def test_follow_that_printed_only_the_tail_still_sees_the_log_cut_back_under_it(fleet_log: FleetLog,
                                                                                tmp_path: Path) -> None:
    # It printed the last 2 events and has yielded nothing since: the log it printed them from is cut back
    # by 3 and grows by 2, so the head never again reaches what it printed. Without the check it waits on,
    # then prints the new history's events past the old head as if nothing had happened.
    path = copy_store(fleet_log[0], tmp_path / "followed.db", seal=False)
    head = fleet_log[1]["head"]
    follower = Follower(path, "-n", "2", "-f", "-j")
    try:
        assert [event["seq"] for event in follower.lines(2)] == [head - 1, head]
        attack(path, ("DELETE FROM events WHERE seq > ?", (head - 3,)))
        assert [append_lease(path, "runner-0", f"s-{n}") for n in range(2)] == [head - 2, head - 1]
        assert follower.proc.wait(timeout=60) == 65
        _, rest, err = follower.stop()
        assert rest == b"" and b"Traceback" not in err
        assert f"head went back from seq {head} to".encode() in err, err
    finally:
        follower.close()


def test_follow_that_printed_only_the_tail_sees_it_rewritten_by_a_restore_of_the_same_length(
        fleet_log: FleetLog, tmp_path: Path) -> None:
    # An older copy whose last two events differ is restored into the file through SQLite (its backup API: one
    # transaction, the same length), then the log grows: only the hash at the seq it printed last tells.
    path = copy_store(fleet_log[0], tmp_path / "followed.db", seal=False)
    other = copy_store(fleet_log[0], tmp_path / "other.db", seal=False)
    head = fleet_log[1]["head"]
    attack(other, ("DELETE FROM events WHERE seq > ?", (head - 2,)))
    assert [append_lease(other, "runner-1", f"s-other-{n}") for n in range(2)] == [head - 1, head]
    follower = Follower(path, "-n", "2", "-f", "-j")
    try:
        assert [event["seq"] for event in follower.lines(2)] == [head - 1, head]
        source, target = apsw.Connection(str(other)), apsw.Connection(str(path))
        try:
            with target.backup("main", source, "main") as backup:
                backup.step()
        finally:
            source.close()
            target.close()
        assert [append_lease(path, "runner-1", f"s-{n}") for n in range(2)] == [head + 1, head + 2]
        assert follower.proc.wait(timeout=60) == 65
        _, rest, err = follower.stop()
        assert rest == b"" and b"Traceback" not in err
        assert f"the event at seq {head} changed while it was followed".encode() in err, err
    finally:
        follower.close()


# --- exit codes: every one the command line can return is documented -----------------------------------


@pytest.mark.parametrize("page", ["README.md", "docs/05-audit.md"])
def test_every_exit_code_is_in_the_readme_and_the_audit_page(page: str) -> None:
    from lifecycle_es.cli import exits

    codes = {getattr(exits, name) for name in exits.__all__ if name.startswith("EXIT_")}
    assert {0, 64, 65, 66, 70, 73, 74, 75, 76, 77, 130} <= codes
    text = (Path(__file__).resolve().parents[2] / page).read_text()
    documented = {int(code) for code in re.findall(r"^\| (\d+) \| \S", text, flags=re.M)}
    assert documented == codes
