"""Issue 7 item 4: every argument of every public entry point refuses malformed input the same way.

Hypothesis picks one argument of a call whose other arguments are valid, and feeds it a wrong type,
an out-of-range or boundary integer, NaN or infinity, a bool or a float where an int belongs, a
malformed, naive or far-future (year 10000) timestamp, or an id holding ``/``, ``..``, NUL, a
newline, a Unicode look-alike or 257 characters. The call must raise `InvalidInputError` (which is
also a ValueError) whose ``field`` names that argument (dotted for a nested one), and the store file
and its WAL must be byte-identical afterwards: a refused input never reaches the log.

The rules hold a recorded event to the very same checks (issue 10, item 4): a value a command refuses,
written into the log with a valid chain, fails the replay at its seq with the command's own message.

Bounded: a fixed number of examples per entry point, so the module runs well under a minute.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from fractions import Fraction
from pathlib import Path
from typing import Any

import msgspec
import pytest
from forging import forge
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import projections
from lifecycle_es import (
    EventStore,
    IntegrityError,
    InvalidInputError,
    LeaseReceipt,
    LifecycleError,
    ProxyAuthority,
    Resources,
    RunnerLifecycle,
    assert_lease_authority,
    lifecycle_profile_from_lease,
)
from lifecycle_es.canonical import receipt_digest
from lifecycle_es.events import (
    RUNNER_SCHEMA,
    DrainExpired,
    DrainRequested,
    Event,
    HookAuthorized,
    LeaseAcquired,
    LeaseParked,
    LeaseSettled,
    RunnerInitialized,
    UnitExited,
    UnitRecord,
    UnitSignalled,
    UnitStarted,
    UnitStarting,
    UnitStopped,
    UnitWakeRecorded,
)
from lifecycle_es.testing import FakeClock

T0 = 1_700_000_000_000
MAX_SAFE = 2**53 - 1
MAX_EPOCH_MS = 253_402_300_799_999  # 9999-12-31T23:59:59.999Z, the last instant with a four-digit year
MIB = 1024 * 1024
GIB = 1024 * MIB
HOOK = "sha256:" + "a" * 64
RESULT = "sha256:" + "b" * 64
SETTINGS = settings(max_examples=int(os.environ.get("LIFECYCLE_ES_REFUSED_EXAMPLES", "60")), deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])

Bad = st.SearchStrategy[tuple[object, str]]


def iso(epoch_ms: int) -> str:
    moment = datetime(1970, 1, 1, tzinfo=UTC) + timedelta(milliseconds=epoch_ms)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


# --- bad values ---------------------------------------------------------------------------------------

# Things that are not strings (nor None, which several arguments take to mean "the default").
NOT_STRINGS = st.one_of(st.booleans(), st.integers(), st.floats(allow_nan=True, allow_infinity=True),
                        st.binary(max_size=8), st.lists(st.integers(), max_size=2), st.just(object()),
                        st.just(Decimal("1")))
NOT_MAPPINGS = st.one_of(NOT_STRINGS, st.none(), st.text(max_size=8),
                         st.tuples(st.text(max_size=3), st.integers()))

ID_ALPHABET = "abcXYZ019._:@+-"
ID_TAIL = st.text(alphabet=ID_ALPHABET, max_size=12)
# Each breaks the seed's id pattern: path pieces, control characters, look-alikes of allowed letters.
ID_BREAKERS = ["/", "\\", "\0", "\n", "\r", "\t", " ", "\u0430", "\u0410", "\uff41", "\u200b", "\u00e9", "$", "*",
               "#", "%", "'", '"', "\u0660"]
BAD_IDS = st.one_of(
    st.just(""),
    st.just(".."),
    ID_TAIL.map(lambda tail: "../" + tail),
    st.builds(lambda head, bad, tail: "a" + head + bad + tail, ID_TAIL, st.sampled_from(ID_BREAKERS), ID_TAIL),
    st.builds(lambda lead, tail: lead + tail, st.sampled_from("._:@+-"), ID_TAIL),
    st.integers(257, 400).map(lambda n: "a" * n),
    st.just("r\u0430nner-1"),  # CYRILLIC SMALL LETTER A (U+0430) in place of the Latin one
    NOT_STRINGS,
    st.none(),
)

HEX = "0123456789abcdef"
HEX64 = st.text(alphabet=HEX, min_size=64, max_size=64)
BAD_DIGESTS = st.one_of(
    st.text(alphabet=HEX, max_size=70).filter(lambda h: len(h) != 64).map(lambda h: "sha256:" + h),
    HEX64.filter(lambda h: h != h.upper()).map(lambda h: "sha256:" + h.upper()),
    HEX64,
    HEX64.map(lambda h: "SHA256:" + h),
    HEX64.map(lambda h: "sha512:" + h),
    HEX64.map(lambda h: "sha256:" + h + "\n"),
    HEX64.map(lambda h: "sha256:" + h[:-1] + "g"),
    NOT_STRINGS,
    st.none(),
)


def bad_ints(low: int, high: int = MAX_SAFE) -> st.SearchStrategy[object]:
    """Everything an integer argument bounded to [low, high] must refuse, boundaries first."""
    inside = st.integers(low, min(high, low + 10_000))
    return st.one_of(
        st.just(low - 1), st.just(high + 1),
        st.integers(max_value=low - 1), st.integers(min_value=high + 1),
        st.booleans(),
        st.floats(allow_nan=True, allow_infinity=True),
        inside.map(float),  # a float for an int, even a whole one in range
        inside.map(str),
        inside.map(Decimal), inside.map(Fraction),
        st.none(),
    )


BAD_TIMESTAMPS = st.one_of(
    st.text(max_size=30).filter(lambda text: not any(char.isdigit() for char in text)),
    st.sampled_from([
        "10000-01-01T00:00:00.000Z",  # year 10000: beyond what ISO-8601's four digits (and the seed's range) hold
        "+010000-01-01T00:00:00.000Z",
        "2023-11-14T22:13:20",  # no offset: naive
        "2023-11-14T22:13:20.000",
        "2023-11-14",
        "1969-12-31T23:59:59.999Z",  # before the epoch
        "2023-13-01T00:00:00.000Z",
        "2023-11-14T25:00:00.000Z",
        "Tue, 14 Nov 2023 22:13:20 GMT",
        "1700000000000",
        "2023-11-14T22:13:20.000Z" + " " * 60,
        "2023-11-14T22:13:20.000\u0396",
    ]),
    st.datetimes(),  # naive datetimes
    st.datetimes(min_value=datetime(2000, 1, 1)).map(lambda moment: moment.date()),
    st.just(date(2023, 11, 14)),
    st.integers(), st.floats(allow_nan=True), st.none(), st.binary(max_size=8),
)


def plain(values: st.SearchStrategy[object]) -> Callable[[str], Bad]:
    """A bad-value maker whose error must name the argument itself."""
    return lambda name: values.map(lambda value: (value, name))


def choice(values: list[object]) -> Callable[[str], Bad]:
    return plain(st.sampled_from(values))


def broken_mapping(good: dict[str, object], bad_fields: dict[str, st.SearchStrategy[object]],
                   extra_keys: list[str]) -> Callable[[str], Bad]:
    """A mapping argument: not a mapping, the wrong keys, or one field bad (its error names ``arg.field``)."""

    def make(name: str) -> Bad:
        keys = st.sets(st.sampled_from([*good, *extra_keys])).filter(lambda chosen: chosen != set(good))
        wrong_keys = keys.map(lambda chosen: ({key: good.get(key, 1) for key in chosen}, name))
        one_bad = st.sampled_from(sorted(bad_fields)).flatmap(
            lambda field: bad_fields[field].map(lambda value: ({**good, field: value}, f"{name}.{field}")))
        return st.one_of(NOT_MAPPINGS.map(lambda value: (value, name)), wrong_keys, one_bad)

    return make


def proxies(min_revision: int) -> Callable[[str], Bad]:
    good = {"id": "proxy-1", "revision": min_revision, "issued_at": iso(T0), "expires_at": iso(T0 + 600_000)}
    return broken_mapping(good, {"id": BAD_IDS, "revision": bad_ints(min_revision), "issued_at": BAD_TIMESTAMPS,
                                 "expires_at": BAD_TIMESTAMPS}, ["issuedAt", "expiresAt", "extra"])


RESOURCE_MAPPINGS = broken_mapping({"cpu_seconds": 600, "memory_bytes": GIB},
                                   {"cpu_seconds": bad_ints(1, 86_400), "memory_bytes": bad_ints(64 * MIB, 64 * GIB)},
                                   ["cpuSeconds", "memoryBytes"])
IDS = plain(BAD_IDS)
DIGESTS = plain(BAD_DIGESTS)
GENERATIONS = plain(bad_ints(1))
NOT_CALLABLE = plain(st.one_of(NOT_STRINGS, st.text(max_size=5)))


# What Python makes of a command-line byte that is not UTF-8 (a lone low surrogate), and other lone surrogates.
NOT_UTF8 = st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF)


class BytesPath:
    """A path-like object whose path is bytes: not a text path."""

    def __fspath__(self) -> bytes:
        return b"/tmp/base"


BASE_DIRS = plain(st.one_of(
    NOT_STRINGS.filter(lambda value: not isinstance(value, bytes | str)), st.binary(min_size=1, max_size=8),
    st.none(), st.just(""), st.text(max_size=10).map(lambda text: "/base\0" + text),
    st.integers(4097, 4200).map(lambda n: "/" + "b" * n), st.just(BytesPath()),
    # A lone surrogate (an undecodable byte smuggled in by surrogateescape) has no UTF-8 form.
    st.sampled_from(["/base/\udc80", "relative/\ud800/dir"]),
))


# --- the store under test -------------------------------------------------------------------------------


@dataclass
class Rig:
    """A store with one accepting runner holding one active lease, whose unit's start its host announced;
    shared by every example of the module."""

    path: str
    store: EventStore
    lifecycle: RunnerLifecycle
    receipt: LeaseReceipt
    base_dir: str
    clock: FakeClock

    def fingerprint(self) -> tuple[str | None, ...]:
        """The sha256 of the store file and of its WAL (None when there is no WAL)."""
        digests: list[str | None] = []
        for suffix in ("", "-wal"):
            try:
                digests.append(hashlib.sha256(Path(self.path + suffix).read_bytes()).hexdigest())
            except FileNotFoundError:
                digests.append(None)
        return tuple(digests)

    def options(self) -> dict[str, Any]:
        return {"runner_id": "runner-1", "target": "local", "base_dir": self.base_dir, "resources": RESOURCES_OK,
                "post_session_hook_digest": HOOK, "now": self.clock}


RESOURCES_OK = Resources(cpu_seconds=600, memory_bytes=GIB)
# A rotation or reclaim at the runner's next revision (it is at 1): valid but for the argument broken.
NEXT_PROXY = ProxyAuthority(id="proxy-1", revision=2, issued_at=iso(T0), expires_at=iso(T0 + 600_000))


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    root = tmp_path_factory.mktemp("refused")
    base_dir = root / "base"
    base_dir.mkdir()
    clock = FakeClock(T0)
    path = str(root / "runners.db")
    with EventStore.open(path, now=clock) as store:
        lifecycle = RunnerLifecycle(store, runner_id="runner-1", target="local", base_dir=str(base_dir),
                                    resources=RESOURCES_OK, post_session_hook_digest=HOOK, now=clock)
        lifecycle.initialize()
        proxy = ProxyAuthority(id="proxy-1", revision=1, issued_at=iso(T0), expires_at=iso(T0 + 600_000))
        receipt = lifecycle.acquire_lease(session_id="session-1", expected_generation=1, proxy_authority=proxy)
        lifecycle.record_host_facts([announced_start(receipt.lease.id, str(base_dir))])
        yield Rig(path, store, lifecycle, receipt, str(base_dir), clock)


def announced_start(lease_id: str, base_dir: str) -> UnitStarting:
    return UnitStarting(lease_id=lease_id, lease_generation=1, mode="child", run_dir=f"{base_dir}/{lease_id}",
                        command=("/bin/true",))


def check_refused(rig: Rig, data: st.DataObject, call: Callable[..., object], valid: dict[str, object],
                  bad: dict[str, Callable[[str], Bad]]) -> None:
    """Break one argument of `call` and expect InvalidInputError naming it, with the store untouched."""
    name = data.draw(st.sampled_from(sorted(bad)), label="argument")
    value, field = data.draw(bad[name](name), label="value and field")
    before = rig.fingerprint()
    with pytest.raises(InvalidInputError) as info:
        call(**{**valid, name: value})
    assert isinstance(info.value, ValueError)
    assert info.value.field == field, f"{name}={value!r} raised for field {info.value.field!r}: {info.value}"
    assert rig.fingerprint() == before, "a refused input changed the store file"


# --- one test per entry point ---------------------------------------------------------------------------


@SETTINGS
@given(data=st.data())
def test_runner_lifecycle_constructor_refuses_bad_input(rig: Rig, data: st.DataObject) -> None:
    valid = {"store": rig.store, **rig.options(), "random_id": lambda: "0001",
             "preflight_base_dir": lambda path: None, "snapshot_every": 64}
    check_refused(rig, data, RunnerLifecycle, valid, {
        "store": plain(st.one_of(NOT_MAPPINGS, st.just(rig.path))),
        "runner_id": IDS,
        "target": plain(st.one_of(st.text(max_size=10).filter(lambda t: t not in ("local", "wsl", "ssh", "container")),
                                  NOT_STRINGS, st.none(), st.just("LOCAL"), st.just("loca\u0301"))),
        "base_dir": BASE_DIRS,
        "resources": RESOURCE_MAPPINGS,
        "post_session_hook_digest": DIGESTS,
        "now": NOT_CALLABLE,
        "random_id": NOT_CALLABLE,
        "preflight_base_dir": NOT_CALLABLE,
        # None is the size-aware default interval, so it is the one non-int snapshot_every accepts.
        "snapshot_every": plain(bad_ints(1).filter(lambda value: value is not None)),
    })


@SETTINGS
@given(data=st.data())
def test_acquire_lease_refuses_bad_input(rig: Rig, data: st.DataObject) -> None:
    valid = {"session_id": "session-new", "expected_generation": 1, "ttl_ms": 60_000,
             "proxy_authority": ProxyAuthority(id="proxy-1", revision=1, issued_at=iso(T0),
                                               expires_at=iso(T0 + 600_000))}
    check_refused(rig, data, rig.lifecycle.acquire_lease, valid, {
        "session_id": IDS, "expected_generation": GENERATIONS, "ttl_ms": plain(bad_ints(1_000, 86_400_000)),
        "proxy_authority": proxies(1),
    })


@SETTINGS
@given(data=st.data())
def test_assert_poll_refuses_bad_input(rig: Rig, data: st.DataObject) -> None:
    valid = {"lease_id": rig.receipt.lease.id, "lease_generation": 1, "proxy_authority_id": "proxy-1",
             "proxy_authority_revision": 1}
    check_refused(rig, data, rig.lifecycle.assert_poll, valid, {
        "lease_id": IDS, "lease_generation": GENERATIONS, "proxy_authority_id": IDS,
        "proxy_authority_revision": plain(bad_ints(0)),
    })


@SETTINGS
@given(data=st.data())
def test_rotate_proxy_authority_refuses_bad_input(rig: Rig, data: st.DataObject) -> None:
    # The runner is at revision 1, so a rotation needs at least 2: revision 1 is a refused boundary.
    check_refused(rig, data, rig.lifecycle.rotate_proxy_authority,
                  {"expected_generation": 1, "proxy_authority": NEXT_PROXY},
                  {"expected_generation": GENERATIONS, "proxy_authority": proxies(2)})


@SETTINGS
@given(data=st.data())
def test_refresh_lease_authority_refuses_bad_input(rig: Rig, data: st.DataObject) -> None:
    valid = {"lease_id": rig.receipt.lease.id, "lease_generation": 1, "expected_generation": 1,
             "proxy_authority": ProxyAuthority(id="proxy-1", revision=1, issued_at=iso(T0),
                                               expires_at=iso(T0 + 600_000))}
    check_refused(rig, data, rig.lifecycle.refresh_lease_authority, valid, {
        "lease_id": IDS, "lease_generation": GENERATIONS, "expected_generation": GENERATIONS,
        "proxy_authority": proxies(1),
    })


@SETTINGS
@given(data=st.data())
def test_request_drain_refuses_bad_input(rig: Rig, data: st.DataObject) -> None:
    check_refused(rig, data, rig.lifecycle.request_drain,
                  {"expected_generation": 1, "timeout_ms": 1_000, "signal": "SIGTERM"},
                  {"expected_generation": GENERATIONS, "timeout_ms": plain(bad_ints(1, 600_000)),
                   "signal": plain(st.one_of(st.text(max_size=8).filter(lambda s: s != "SIGTERM"), NOT_STRINGS,
                                             st.none(), st.sampled_from(["SIGKILL", "sigterm", "SIGTERM\0", 15])))})


@SETTINGS
@given(data=st.data())
def test_settle_lease_refuses_bad_input(rig: Rig, data: st.DataObject) -> None:
    check_refused(rig, data, rig.lifecycle.settle_lease,
                  {"lease_id": rig.receipt.lease.id, "lease_generation": 1, "result_digest": RESULT},
                  {"lease_id": IDS, "lease_generation": GENERATIONS, "result_digest": DIGESTS})


@SETTINGS
@given(data=st.data())
def test_park_lease_refuses_bad_input(rig: Rig, data: st.DataObject) -> None:
    reasons = ("checkout-failure", "lost-poll", "resource-limit")
    check_refused(rig, data, rig.lifecycle.park_lease,
                  {"lease_id": rig.receipt.lease.id, "lease_generation": 1, "result_digest": RESULT,
                   "reason": "lost-poll"},
                  {"lease_id": IDS, "lease_generation": GENERATIONS, "result_digest": DIGESTS,
                   "reason": plain(st.one_of(st.text(max_size=16).filter(lambda r: r not in reasons), NOT_STRINGS,
                                             st.none(), st.sampled_from(["Lost-Poll", "lost_poll", "lost-poll "])))})


@SETTINGS
@given(data=st.data())
def test_generation_only_commands_refuse_bad_input(rig: Rig, data: st.DataObject) -> None:
    command = data.draw(st.sampled_from(["park_expired_drain", "complete_reclaim"]), label="command")
    check_refused(rig, data, getattr(rig.lifecycle, command), {"expected_generation": 1},
                  {"expected_generation": GENERATIONS})


@SETTINGS
@given(data=st.data())
def test_begin_reclaim_refuses_bad_input(rig: Rig, data: st.DataObject) -> None:
    check_refused(rig, data, rig.lifecycle.begin_reclaim, {"expected_generation": 1, "proxy_authority": NEXT_PROXY},
                  {"expected_generation": GENERATIONS, "proxy_authority": proxies(2)})


@SETTINGS
@given(data=st.data())
def test_authorize_post_session_hook_refuses_bad_input(rig: Rig, data: st.DataObject) -> None:
    valid = {"expected_runner_generation": 1, "lease_id": rig.receipt.lease.id, "lease_generation": 1,
             "result_digest": RESULT, "hook_digest": HOOK}
    check_refused(rig, data, rig.lifecycle.authorize_post_session_hook, valid, {
        "expected_runner_generation": GENERATIONS, "lease_id": IDS, "lease_generation": GENERATIONS,
        "result_digest": DIGESTS, "hook_digest": DIGESTS,
    })


BAD_CLOCK_READINGS = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True), st.booleans(), st.just(float(T0)), st.just(T0 + 0.5),
    st.integers(max_value=-1), st.integers(min_value=MAX_EPOCH_MS + 1), st.none(), st.just(str(T0)),
    st.just(Decimal(T0)),
)


@SETTINGS
@given(data=st.data())
def test_a_clock_reading_that_is_not_epoch_ms_is_refused(rig: Rig, data: st.DataObject) -> None:
    reading = data.draw(BAD_CLOCK_READINGS, label="now()")
    lifecycle = RunnerLifecycle(rig.store, **{**rig.options(), "now": lambda: reading})
    lease = rig.receipt.lease
    proxy = ProxyAuthority(id="proxy-1", revision=1, issued_at=iso(T0), expires_at=iso(T0 + 600_000))
    commands: dict[str, Callable[[], object]] = {
        "acquire_lease": lambda: lifecycle.acquire_lease(session_id="session-new", expected_generation=1,
                                                         proxy_authority=proxy),
        "request_drain": lambda: lifecycle.request_drain(expected_generation=1),
        "settle_lease": lambda: lifecycle.settle_lease(lease_id=lease.id, lease_generation=1, result_digest=RESULT),
        "assert_poll": lambda: lifecycle.assert_poll(lease_id=lease.id, lease_generation=1,
                                                     proxy_authority_id="proxy-1", proxy_authority_revision=1),
        "refresh_lease_authority": lambda: lifecycle.refresh_lease_authority(
            lease_id=lease.id, lease_generation=1, expected_generation=1, proxy_authority=proxy),
        "assert_lease_authority": lambda: assert_lease_authority(lifecycle_profile_from_lease(rig.receipt), "local",
                                                                 now=lambda: reading),
    }
    command = data.draw(st.sampled_from(sorted(commands)), label="command")
    before = rig.fingerprint()
    with pytest.raises(InvalidInputError) as info:
        commands[command]()
    assert info.value.field == "now"
    assert rig.fingerprint() == before


@SETTINGS
@given(value=st.one_of(NOT_STRINGS, st.none(), BAD_IDS.filter(lambda v: isinstance(v, str)).map(lambda v: "/" + v),
                       st.just("x" * 300)))
def test_a_random_id_that_makes_no_lease_id_is_refused(rig: Rig, value: object) -> None:
    lifecycle = RunnerLifecycle(rig.store, **{**rig.options(), "random_id": lambda: value})
    before = rig.fingerprint()
    with pytest.raises(InvalidInputError) as info:
        lifecycle.acquire_lease(session_id="session-new", expected_generation=1,
                                proxy_authority={"id": "proxy-1", "revision": 1, "issued_at": iso(T0),
                                                 "expires_at": iso(T0 + 600_000)})
    assert info.value.field == "random_id"
    assert rig.fingerprint() == before


@SETTINGS
@given(data=st.data())
def test_proxy_authority_refuses_bad_input(rig: Rig, data: st.DataObject) -> None:
    valid = {"id": "proxy-1", "revision": 1, "issued_at": iso(T0), "expires_at": iso(T0 + 600_000)}
    bad = {"id": BAD_IDS, "revision": bad_ints(1), "issued_at": BAD_TIMESTAMPS, "expires_at": BAD_TIMESTAMPS}
    check_refused(rig, data, ProxyAuthority, valid,
                  {name: (lambda name, values=values: values.map(lambda v: (v, f"proxy_authority.{name}")))
                   for name, values in bad.items()})


@SETTINGS
@given(data=st.data())
def test_resources_refuse_bad_input(rig: Rig, data: st.DataObject) -> None:
    check_refused(rig, data, Resources, {"cpu_seconds": 600, "memory_bytes": GIB}, {
        "cpu_seconds": lambda name: bad_ints(1, 86_400).map(lambda v: (v, "resources.cpu_seconds")),
        "memory_bytes": lambda name: bad_ints(64 * MIB, 64 * GIB).map(lambda v: (v, "resources.memory_bytes")),
    })


@SETTINGS
@given(data=st.data())
def test_event_store_open_refuses_bad_input(rig: Rig, data: st.DataObject) -> None:
    def open_and_close(**kwargs: Any) -> None:
        EventStore.open(**kwargs).close()

    valid = {"path": rig.path, "key": None, "durability": "full", "busy_timeout_ms": 5_000, "now": None, "vfs": None,
             "seal": None, "read_only": False}
    check_refused(rig, data, open_and_close, valid, {
        "path": plain(st.one_of(NOT_STRINGS.filter(lambda v: not isinstance(v, bytes)), st.none(), st.just(""),
                                st.binary(min_size=1, max_size=8), st.just(BytesPath()),
                                st.text(max_size=8).map(lambda t: rig.path + "\0" + t),
                                NOT_UTF8.map(lambda t: rig.path + t))),
        "key": plain(st.one_of(st.binary(max_size=40).filter(lambda k: len(k) != 32), st.integers(), st.booleans(),
                               st.text(min_size=32, max_size=32), st.binary(min_size=31, max_size=31).map(bytearray))),
        "durability": plain(st.one_of(st.text(max_size=8).filter(lambda d: d not in ("full", "normal")), NOT_STRINGS,
                                      st.none(), st.sampled_from(["FULL", "off", "normal\0"]))),
        "busy_timeout_ms": plain(bad_ints(0, 3_600_000)),
        "now": NOT_CALLABLE,
        "vfs": plain(NOT_STRINGS),
        "seal": plain(st.one_of(NOT_STRINGS.filter(lambda v: not isinstance(v, bytes)), st.just(""),
                                st.text(max_size=8).map(lambda t: rig.path + ".seal\0" + t),
                                NOT_UTF8.map(lambda t: rig.path + ".seal" + t))),
        "read_only": plain(st.one_of(st.integers(), st.text(max_size=5), st.none(), st.floats())),
    })


@SETTINGS
@given(value=st.one_of(NOT_MAPPINGS, st.dictionaries(st.text(max_size=5), st.integers(), max_size=3)))
def test_lifecycle_profile_from_lease_refuses_bad_input(rig: Rig, value: object) -> None:
    with pytest.raises(InvalidInputError) as info:
        lifecycle_profile_from_lease(value)  # type: ignore[arg-type]
    assert info.value.field == "receipt"


def _profile_breakers(good: dict[str, Any]) -> Callable[[str], Bad]:
    def make(name: str) -> Bad:
        def with_field(path: tuple[str, ...], value: object) -> dict[str, Any]:
            changed = msgspec.json.decode(msgspec.json.encode(good))
            target = changed
            for key in path[:-1]:
                target = target[key]
            target[path[-1]] = value
            return changed

        relative = st.sampled_from(["runners.db", "./runners.db", "", "/a\0b", "/" + "a" * 4097]).map(
            lambda path: (with_field(("authority_file",), path), "profile.authority_file"))
        bad_runner = BAD_IDS.filter(lambda v: isinstance(v, str)).map(
            lambda value: (with_field(("runner_id",), value), "profile.runner_id"))
        # Fields of the wrong type fail the profile's own schema: the error names the profile.
        wrong_type = st.sampled_from([("generation",), ("lease", "generation"), ("resources", "cpu_seconds"),
                                      ("proxy_authority", "revision"), ("lease",)]).flatmap(
            lambda path: st.one_of(st.just("1"), st.just(1.5), st.just(None), st.just([1])).map(
                lambda value: (with_field(path, value), name)))
        missing = st.sampled_from(sorted(good)).map(
            lambda key: ({k: v for k, v in good.items() if k != key}, name))
        return st.one_of(NOT_MAPPINGS.map(lambda value: (value, name)), relative, bad_runner, wrong_type, missing)

    return make


@SETTINGS
@given(data=st.data())
def test_assert_lease_authority_refuses_bad_input(rig: Rig, data: st.DataObject) -> None:
    good = msgspec.to_builtins(lifecycle_profile_from_lease(rig.receipt))
    check_refused(rig, data, assert_lease_authority, {"profile": good, "target": "local", "now": rig.clock}, {
        "profile": _profile_breakers(good),
        "target": plain(st.one_of(st.text(max_size=8).filter(lambda t: t not in ("local", "wsl", "ssh", "container")),
                                  NOT_STRINGS, st.none())),
        "now": NOT_CALLABLE,
    })


def test_the_rig_accepts_its_valid_arguments(rig: Rig) -> None:
    # Every refused example above changes one argument of these calls; unchanged, they go through,
    # so a refusal is due to the argument changed and not to the rest.
    proxy = ProxyAuthority(id="proxy-1", revision=1, issued_at=iso(T0), expires_at=iso(T0 + 600_000))
    lease = rig.receipt.lease
    assert rig.lifecycle.assert_poll(lease_id=lease.id, lease_generation=1, proxy_authority_id="proxy-1",
                                     proxy_authority_revision=1).lease_id == lease.id
    assert rig.lifecycle.refresh_lease_authority(lease_id=lease.id, lease_generation=1, expected_generation=1,
                                                 proxy_authority=proxy).runner_generation == 1
    profile = msgspec.to_builtins(lifecycle_profile_from_lease(rig.receipt))
    assert assert_lease_authority(profile, "local", now=rig.clock).lease_id == lease.id
    for every in (64, None):
        RunnerLifecycle(rig.store, **rig.options(), random_id=lambda: "0001", preflight_base_dir=lambda path: None,
                        snapshot_every=every)
    EventStore.open(rig.path, key=None, durability="full", busy_timeout_ms=5_000, now=None, vfs=None, seal=None,
                    read_only=False).close()
    assert Resources(cpu_seconds=600, memory_bytes=GIB).cpu_seconds == 600
    # The host facts' valid values, the announced start made again after its UnitStarted took it.
    facts = {name: built(fact, fields) for name, (fact, fields, _) in host_facts(rig).items()}
    rig.lifecycle.record_host_facts([facts["UnitStarted"], announced_start(lease.id, rig.base_dir),
                                     facts["UnitSignalled"], facts["UnitWakeRecorded"]])
    assert rig.lifecycle.state().units_starting[0].lease_id == lease.id


# --- host facts -----------------------------------------------------------------------------------------

HOST_LABELS = st.one_of(st.just(""), st.just("h" * 256),
                        st.sampled_from(["host 1", "host\n", "h\0", "h\u00e9", "\u202e"]), NOT_STRINGS, st.none())
NOT_NONE = st.one_of(st.text(max_size=8), NOT_STRINGS)
BAD_COMMANDS = st.one_of(
    st.text(max_size=8), st.none(), st.integers(), st.binary(max_size=4),
    st.sampled_from([("a",) * 257, ("a" * 8193,), ("/bin/sh", "a\0b"), ("/bin/sh", 1), ("/bin/sh", b"x"), ("",),
                     ("/bin/sh", "\udc80")]),
)


def members_not_of(*allowed: str) -> st.SearchStrategy[object]:
    near = [variant for word in allowed for variant in (word.lower(), word.upper(), word + "\n", " " + word, word[:-1])
            if variant not in allowed]  # an upper-case word is its own upper case
    return st.one_of(st.sampled_from([*near, "", "evil"]), NOT_STRINGS, st.none(), st.text(max_size=8).filter(
        lambda text: text not in allowed))


def host_facts(rig: Rig) -> dict[str, tuple[type[Event], dict[str, object], dict[str, Callable[[str], Bad]]]]:
    """Each kind of unit fact: its valid fields for the rig's lease (``handle.x`` for the handle's), and
    the bad values of each field."""
    lease_id = rig.receipt.lease.id
    run_dir = f"{rig.base_dir}/{lease_id}"
    run_dirs = plain(st.one_of(
        st.sampled_from([f"relative/{lease_id}", f"{run_dir}/.", f"{rig.base_dir}/x/../{lease_id}", f"{rig.base_dir}/x",
                         f"{rig.base_dir}//{lease_id}", f"/\0/{lease_id}", f"/\udc80/{lease_id}", "", "/"]),
        st.integers(4097, 4200).map(lambda n: "/" + "d" * n + "/" + lease_id), NOT_STRINGS, st.none()))
    return {
        "UnitStarting": (UnitStarting, {"lease_id": lease_id, "lease_generation": 1, "mode": "child",
                                        "run_dir": run_dir, "unit": None, "command": ("/bin/true",)},
                         {"lease_id": IDS, "lease_generation": GENERATIONS, "mode": plain(members_not_of("child")),
                          "run_dir": run_dirs, "unit": plain(NOT_NONE), "command": plain(BAD_COMMANDS)}),
        "UnitStarted": (UnitStarted, {"lease_id": lease_id, "lease_generation": 1, "handle.mode": "child",
                                      "handle.host": "host-1", "handle.boot_id": "boot-1", "handle.run_dir": run_dir,
                                      "handle.pid": 4242, "handle.start_ticks": 7, "handle.unit": None},
                        {"lease_id": IDS, "lease_generation": GENERATIONS,
                         "handle.mode": plain(st.one_of(st.just("systemd"), members_not_of("child"))),
                         "handle.run_dir": run_dirs, "handle.host": plain(HOST_LABELS),
                         "handle.boot_id": plain(HOST_LABELS), "handle.pid": plain(bad_ints(2, 4_194_304)),
                         "handle.start_ticks": plain(bad_ints(0)), "handle.unit": plain(NOT_NONE)}),
        "UnitSignalled": (UnitSignalled, {"lease_id": lease_id, "signal": "SIGTERM", "reason": "drain"},
                          {"lease_id": IDS, "signal": plain(members_not_of("SIGTERM", "SIGKILL")),
                           "reason": plain(members_not_of("drain", "drain-deadline"))}),
        "UnitExited": (UnitExited, {"lease_id": lease_id, "code": 0, "signal": None, "outcome": "settled"},
                       {"lease_id": IDS, "code": plain(bad_ints(0, 255).filter(lambda code: code is not None)),
                        "signal": plain(st.one_of(st.sampled_from(["KILL", "sigkill", "SIG", "SIG" + "A" * 17,
                                                                   "SIGKILL\n", ""]), NOT_STRINGS)),
                        "outcome": plain(members_not_of("settled", "lost-poll", "resource-limit",
                                                        "checkout-failure"))}),
        "UnitStopped": (UnitStopped, {"lease_id": lease_id, "reason": "stopped", "signals": ("SIGTERM", "SIGKILL")},
                        {"lease_id": IDS, "reason": plain(st.one_of(members_not_of("stopped", "lease-ended"),
                                                                    st.just("x" * 100_000))),
                         "signals": plain(st.one_of(
                             st.sampled_from([("SIGHUP",), ("SIGTERM", "SIGTERM"), ("SIGTERM", "SIGKILL", "SIGHUP"),
                                              ("sigterm",), (None,), ("SIGKILL\n",), (("SIGTERM",),), "SIGTERM",
                                              ["SIGTERM"]]),
                             st.tuples(members_not_of("SIGTERM", "SIGKILL")), NOT_STRINGS, st.none()))}),
        "UnitWakeRecorded": (UnitWakeRecorded, {"lease_id": lease_id, "wake_at": T0},
                             {"lease_id": IDS, "wake_at": plain(bad_ints(0, MAX_EPOCH_MS))}),
    }


def built(fact: type[Event], fields: dict[str, Any]) -> Event:
    """A fact from its fields, those named ``handle.x`` making its handle."""
    handle = {name.removeprefix("handle."): value for name, value in fields.items() if name.startswith("handle.")}
    rest = {name: value for name, value in fields.items() if not name.startswith("handle.")}
    return fact(**rest, **({"handle": UnitRecord(**handle)} if handle else {}))


@SETTINGS
@given(data=st.data())
def test_record_host_facts_refuses_bad_input(rig: Rig, data: st.DataObject) -> None:
    kind = data.draw(st.sampled_from(sorted(host_facts(rig))), label="fact")
    fact, valid, bad = host_facts(rig)[kind]

    def record(**fields: Any) -> None:
        rig.lifecycle.record_host_facts([built(fact, fields)])

    check_refused(rig, data, record, valid, bad)


# --- one validation: the replay holds a recorded event to its command's checks ----------------------------

DIGEST = "sha256:" + "d" * 64


@dataclass
class Leased:
    """A fresh store whose runner holds one active lease and announced its unit's start."""

    store: EventStore
    lifecycle: RunnerLifecycle
    lease_id: str
    base_dir: str
    at_ms: int


@pytest.fixture
def leased(tmp_path: Path, store_target: str) -> Iterator[Leased]:
    """On both backends: the replay's checks of a forged event are the same on a file and on a server."""
    clock = FakeClock(T0)
    base_dir = tmp_path / "base"
    base_dir.mkdir()
    with EventStore.open(store_target, now=clock) as store:
        lifecycle = RunnerLifecycle(store, runner_id="runner-1", target="local", base_dir=str(base_dir),
                                    resources=RESOURCES_OK, post_session_hook_digest=HOOK, now=clock)
        lifecycle.initialize()
        proxy = ProxyAuthority(id="proxy-1", revision=1, issued_at=iso(T0), expires_at=iso(T0 + 600_000))
        lease_id = lifecycle.acquire_lease(session_id="session-1", expected_generation=1,
                                           proxy_authority=proxy).lease.id
        lifecycle.record_host_facts([announced_start(lease_id, str(base_dir))])
        yield Leased(store, lifecycle, lease_id, str(base_dir), T0)


def _runner(target: str = "local", hook: str = HOOK) -> Callable[[Leased], object]:
    return lambda env: RunnerLifecycle(env.store, runner_id="runner-2", target=target, base_dir=env.base_dir,
                                       resources=RESOURCES_OK, post_session_hook_digest=hook)


def _initialized(target: str = "local", hook: str = HOOK) -> Callable[[Leased], tuple[str, list[Event]]]:
    return lambda env: ("runner-2", [RunnerInitialized(schema=RUNNER_SCHEMA, runner_id="runner-2", target=target,
                                                       base_dir=env.base_dir, resources=RESOURCES_OK,
                                                       post_session_hook_digest=hook)])


def _on_runner(make: Callable[[Leased], Event]) -> Callable[[Leased], tuple[str, list[Event]]]:
    return lambda env: ("runner-1", [make(env)])


def _fact(make: Callable[[Leased], Event]) -> Callable[[Leased], object]:
    return lambda env: env.lifecycle.record_host_facts([make(env)])


ONE_VALIDATION = [
    pytest.param(_runner(target="mars"), _initialized(target="mars"), "target", id="target-mars"),
    pytest.param(_runner(hook="garbage"), _initialized(hook="garbage"), "post_session_hook_digest",
                 id="hook-digest-garbage"),
    pytest.param(
        lambda env: env.lifecycle.acquire_lease(session_id="session\n\0", expected_generation=1, proxy_authority={
            "id": "proxy-1", "revision": 1, "issued_at": iso(env.at_ms), "expires_at": iso(env.at_ms + 600_000)}),
        _on_runner(lambda env: LeaseAcquired(
            lease_id="lease-forged", session_id="session\n\0", lease_generation=1, issued_at=iso(env.at_ms),
            expires_at=iso(env.at_ms + 60_000), proxy_authority=ProxyAuthority(
                id="proxy-1", revision=1, issued_at=iso(env.at_ms), expires_at=iso(env.at_ms + 600_000)))),
        "session_id", id="session-id-newline-nul"),
    pytest.param(lambda env: env.lifecycle.settle_lease(lease_id=env.lease_id, lease_generation=1,
                                                        result_digest="not-a-digest"),
                 _on_runner(lambda env: LeaseSettled(lease_id=env.lease_id, lease_generation=1,
                                                     result_digest="not-a-digest")),
                 "result_digest", id="settled-not-a-digest"),
    pytest.param(lambda env: env.lifecycle.park_lease(lease_id=env.lease_id, lease_generation=1, result_digest="",
                                                      reason="lost-poll"),
                 _on_runner(lambda env: LeaseParked(lease_id=env.lease_id, lease_generation=1, result_digest="",
                                                    reason="lost-poll")),
                 "result_digest", id="parked-empty-digest"),
    pytest.param(lambda env: env.lifecycle.request_drain(expected_generation=1, signal="SIGKILL"),
                 _on_runner(lambda env: DrainRequested(signal="SIGKILL", requested_at=iso(env.at_ms),
                                                       deadline_at=iso(env.at_ms + 1_000), generation=2)),
                 "signal", id="drain-sigkill"),
    pytest.param(_fact(lambda env: UnitExited(lease_id=env.lease_id, code=-5, signal=None, outcome="settled")),
                 _on_runner(lambda env: UnitExited(lease_id=env.lease_id, code=-5, signal=None, outcome="settled")),
                 "code", id="exit-code-negative"),
    pytest.param(_fact(lambda env: UnitExited(lease_id=env.lease_id, code=0, signal=None, outcome="banana")),
                 _on_runner(lambda env: UnitExited(lease_id=env.lease_id, code=0, signal=None, outcome="banana")),
                 "outcome", id="exit-outcome-banana"),
    pytest.param(_fact(lambda env: msgspec.structs.replace(announced_start(env.lease_id, env.base_dir), mode="evil")),
                 _on_runner(lambda env: msgspec.structs.replace(announced_start(env.lease_id, env.base_dir),
                                                                mode="evil")),
                 "mode", id="unit-mode-evil"),
    pytest.param(_fact(lambda env: UnitStarted(lease_id=env.lease_id, lease_generation=1, handle=UnitRecord(
        mode="child", host="h", boot_id="b", run_dir=f"{env.base_dir}/{env.lease_id}", pid=1, start_ticks=1))),
                 _on_runner(lambda env: UnitStarted(lease_id=env.lease_id, lease_generation=1, handle=UnitRecord(
                     mode="child", host="h", boot_id="b", run_dir=f"{env.base_dir}/{env.lease_id}", pid=1,
                     start_ticks=1))),
                 "handle.pid", id="unit-pid-1"),
    pytest.param(_fact(lambda env: UnitStopped(lease_id=env.lease_id, reason="stopped",
                                               signals=("SIGTERM", "SIGKILL", "SIGKILL"))),
                 _on_runner(lambda env: UnitStopped(lease_id=env.lease_id, reason="stopped",
                                                    signals=("SIGTERM", "SIGKILL", "SIGKILL"))),
                 "signals", id="stop-signals-three"),
]


@pytest.mark.parametrize(("command", "forged", "field"), ONE_VALIDATION)
def test_a_recorded_event_is_held_to_its_commands_checks(
        leased: Leased, command: Callable[[Leased], object], forged: Callable[[Leased], tuple[str, list[Event]]],
        field: str) -> None:
    head = leased.store.head()
    with pytest.raises(InvalidInputError) as refused:
        command(leased)
    assert refused.value.field == field and leased.store.head() == head
    stream, events = forged(leased)
    leased.store.close()
    (seq,) = forge(leased.store.path, stream, events, iso(leased.at_ms))
    with EventStore.open(leased.store.path, read_only=True) as store, pytest.raises(IntegrityError) as replayed:
        projections.replay(store)
    assert (replayed.value.seq, replayed.value.stream) == (seq, stream)
    # The command's own words: the replay refused the value with the same check.
    assert str(refused.value) in replayed.value.reason


@pytest.mark.parametrize("base_dir", ["srv/runner", "/srv/../etc/runner", "/srv/runner/", "//srv//runner"])
def test_a_recorded_base_dir_must_be_one_the_commands_resolve_to(leased: Leased, base_dir: str) -> None:
    # A command resolves whatever it is given (os.path.abspath); a recorded one must be resolved already.
    leased.store.close()
    (seq,) = forge(leased.store.path, "runner-2", [RunnerInitialized(
        schema=RUNNER_SCHEMA, runner_id="runner-2", target="local", base_dir=base_dir, resources=RESOURCES_OK,
        post_session_hook_digest=HOOK)], iso(leased.at_ms))
    with EventStore.open(leased.store.path, read_only=True) as store, pytest.raises(IntegrityError) as replayed:
        projections.replay(store)
    assert replayed.value.seq == seq and "runner base_dir is invalid" in replayed.value.reason


def _hook(env: Leased, hook: str = "garbage") -> list[Event]:
    from lifecycle_es.runner import HOOK_DOMAIN, hook_receipt_material

    material = hook_receipt_material(runner_id="runner-1", runner_generation=3, lease_id=env.lease_id,
                                     lease_generation=1, result_digest=DIGEST, hook_digest=hook)
    return [HookAuthorized(lease_id=env.lease_id, lease_generation=1, runner_generation=3, result_digest=DIGEST,
                           hook_digest=hook, receipt_digest=receipt_digest(HOOK_DOMAIN, material))]


@pytest.mark.parametrize(("prepare", "forged", "words"), [
    # Settled, then a drain with nothing active parks the runner at once (generation 3): a hook may be
    # authorized, but only for the runner's recorded hook digest, whatever receipt the event carries.
    pytest.param(lambda env: (env.lifecycle.settle_lease(lease_id=env.lease_id, lease_generation=1,
                                                         result_digest=DIGEST),
                              env.lifecycle.request_drain(expected_generation=1)),
                 _hook, "post-session hook fence is stale", id="hook-digest-not-the-runners"),
    # Draining past its deadline: the leases an expired drain parks are exactly the active ones.
    pytest.param(lambda env: env.lifecycle.request_drain(expected_generation=1, timeout_ms=1),
                 lambda env: [DrainExpired(lease_ids=("../../etc",),
                                           deadline_at=env.lifecycle.state().drain.deadline_at)],  # type: ignore[union-attr]
                 "not the runner's active leases", id="drain-expired-lease-ids"),
    # The replay names the one cause a command would (a forged value shown quoted, on the one line).
    pytest.param(lambda env: None, lambda env: [LeaseSettled(lease_id="lease-x\nforged", lease_generation=1,
                                                             result_digest=DIGEST)],
                 "the runner has no lease 'lease-x\\nforged'", id="settled-lease-id-with-a-newline"),
    pytest.param(lambda env: None, lambda env: [LeaseAcquired(
        lease_id="lease-forged", session_id="session-forged", lease_generation=1, issued_at=iso(env.at_ms),
        expires_at=iso(env.at_ms + 60_000), proxy_authority=ProxyAuthority(
            id="proxy-1", revision=1, issued_at=iso(env.at_ms), expires_at=iso(env.at_ms + 600_000)))],
                 f"lease ttl_ms is invalid: issued_at {iso(T0)} is not the time of its event, {iso(T0 + 1_000)}",
                 id="acquired-issued-before-its-event"),
    pytest.param(lambda env: None, lambda env: [DrainRequested(signal="SIGTERM", requested_at=iso(env.at_ms + 1_000),
                                                               deadline_at=iso(env.at_ms + 2_000), generation=5)],
                 "drain generation is stale: expected_generation is 4 but the runner is at generation 1",
                 id="drain-generation-skipped"),
    pytest.param(lambda env: env.lifecycle.settle_lease(lease_id=env.lease_id, lease_generation=1,
                                                        result_digest=DIGEST),
                 lambda env: _hook(env, HOOK)[:1],
                 "hook fence is stale: the runner is accepting; hooks are authorized while it is draining or parked",
                 id="hook-while-accepting"),
])
def test_fields_a_rule_compares_with_the_state_are_bound_by_it(
        leased: Leased, prepare: Callable[[Leased], object], forged: Callable[[Leased], list[Event]],
        words: str) -> None:
    prepare(leased)
    events = forged(leased)
    leased.store.close()
    (seq,) = forge(leased.store.path, "runner-1", events, iso(leased.at_ms + 1_000))
    with EventStore.open(leased.store.path, read_only=True) as store, pytest.raises(IntegrityError) as replayed:
        projections.replay(store)
    assert replayed.value.seq == seq and words in replayed.value.reason
    assert "\n" not in str(replayed.value)


def test_a_runner_is_recorded_in_its_own_stream(leased: Leased) -> None:
    from lifecycle_es.runner import start

    event = RunnerInitialized(schema=RUNNER_SCHEMA, runner_id="runner-1", target="local", base_dir=leased.base_dir,
                              resources=RESOURCES_OK, post_session_hook_digest=HOOK)
    assert start(event, iso(T0), "runner-1").runner_id == "runner-1"
    with pytest.raises(LifecycleError, match="stream of another"):
        start(event, iso(T0), "runner-2")
