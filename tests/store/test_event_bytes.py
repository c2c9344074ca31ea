"""An event's stored bytes are ``canonical_bytes(msgspec.to_builtins(event))``, and a float is refused anywhere.

`events.encode` writes the Struct with the sorted encoder directly and looks for floats by the field
values' types (a Struct does not check its field types when built). These tests hold it to the
definition it replaced: the same bytes for every event, and an InvalidInputError wherever the old path
raised one, at the top level, inside a nested value or inside a tuple.
"""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lifecycle_es import InvalidInputError
from lifecycle_es.canonical import canonical_bytes, iso_ms
from lifecycle_es.events import (
    EVENT_TYPES,
    DrainExpired,
    LeaseAcquired,
    LeaseSettled,
    RunnerInitialized,
    UnitExited,
    UnitRecord,
    UnitStarted,
    UnitStarting,
    encode,
)
from lifecycle_es.testing.values import proxy_authorities, resources
from lifecycle_es.values import ProxyAuthority, Resources

T0 = 1_767_225_600_000
AUTHORITY = ProxyAuthority(id="proxy-1", revision=1, issued_at=iso_ms(T0), expires_at=iso_ms(T0 + 60_000))
RESOURCES = Resources(cpu_seconds=60, memory_bytes=1 << 30)

st.register_type_strategy(ProxyAuthority, proxy_authorities(T0))
st.register_type_strategy(Resources, resources())


def reference(event: Any) -> bytes:
    return canonical_bytes(msgspec.to_builtins(event))


@settings(max_examples=500, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.sampled_from(sorted(EVENT_TYPES.values(), key=lambda cls: cls.__name__)).flatmap(st.from_type))
def test_encode_is_the_canonical_bytes_of_the_builtins(event: Any) -> None:
    assert encode(event) == reference(event)


FLOATS = (1.5, 1.0, float("nan"), float("inf"), -0.0)


def wrong_events(value: float) -> list[Any]:
    """Events holding `value` where an int, a str, a tuple item or a nested value belongs."""
    return [
        LeaseSettled(lease_id="lease-1", lease_generation=value, result_digest="sha256:" + "0" * 64),  # type: ignore[arg-type]
        LeaseSettled(lease_id=value, lease_generation=1, result_digest="sha256:" + "0" * 64),  # type: ignore[arg-type]
        DrainExpired(lease_ids=("lease-1", value), deadline_at=iso_ms(T0)),  # type: ignore[arg-type]
        DrainExpired(lease_ids=["lease-1", [value]], deadline_at=iso_ms(T0)),  # type: ignore[arg-type]
        UnitExited(lease_id="lease-1", code=value, signal=None, outcome="exited"),  # type: ignore[arg-type]
        UnitStarted(lease_id="lease-1", lease_generation=1,
                    handle=UnitRecord(mode="child", host="h", boot_id="b", run_dir="/r", pid=value)),  # type: ignore[arg-type]
        UnitStarting(lease_id="lease-1", lease_generation=1, mode="child", run_dir="/r",
                     command=("python", {"x": value})),  # type: ignore[arg-type]
        RunnerInitialized(schema="s", runner_id="r", target="local", base_dir="/b", resources=RESOURCES,
                          post_session_hook_digest={"nested": (value,)}),  # type: ignore[arg-type]
    ]


@pytest.mark.parametrize("value", FLOATS, ids=repr)
def test_a_float_anywhere_in_an_event_is_refused_as_before(value: float) -> None:
    for event in wrong_events(value):
        with pytest.raises(InvalidInputError):
            reference(event)
        with pytest.raises(InvalidInputError, match="integers only"):
            encode(event)


def test_a_value_msgspec_cannot_encode_raises_as_before() -> None:
    class Seconds(float):
        pass

    for value in (Seconds(2), object()):
        event = LeaseSettled(lease_id="lease-1", lease_generation=value, result_digest="sha256:" + "0" * 64)  # type: ignore[arg-type]
        with pytest.raises(TypeError):
            reference(event)
        with pytest.raises(TypeError):
            encode(event)


def test_the_nested_values_let_by_unlooked_refuse_floats_when_built() -> None:
    # encode trusts ProxyAuthority and Resources to hold no float: they refuse one however they are made.
    with pytest.raises(InvalidInputError):
        ProxyAuthority(id="proxy-1", revision=1.0, issued_at=iso_ms(T0), expires_at=iso_ms(T0))  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError):
        msgspec.structs.replace(AUTHORITY, revision=2.0)
    with pytest.raises(InvalidInputError):
        Resources(cpu_seconds=60.0, memory_bytes=1 << 30)  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError):
        msgspec.structs.replace(RESOURCES, memory_bytes=float(1 << 30))
    event = LeaseAcquired(lease_id="lease-1", session_id="s-1", lease_generation=1, issued_at=iso_ms(T0),
                          expires_at=iso_ms(T0 + 1000), proxy_authority=AUTHORITY)
    assert encode(event) == reference(event)


def test_non_events_are_refused() -> None:
    for value in ({"type": "ReclaimCompleted", "generation": 1}, AUTHORITY, None):
        with pytest.raises(InvalidInputError, match="lifecycle_es events"):
            encode(value)  # type: ignore[arg-type]


def test_an_aware_datetime_is_its_exact_millisecond() -> None:
    # datetime.timestamp() * 1000 is a float: 536870.911 s came out as 536870910 ms.
    from datetime import UTC, datetime, timedelta

    from lifecycle_es.canonical import timestamp

    epoch = datetime(1970, 1, 1, tzinfo=UTC)
    for ms in (0, 536_870_911, T0 + 1, 253_402_300_799_999):
        assert timestamp(epoch + timedelta(milliseconds=ms), "at") == iso_ms(ms)


@pytest.mark.parametrize("bad_at", [0, 1, 2])
def test_a_batch_encodes_as_its_events_do_and_fails_at_its_first_bad_one(bad_at: int) -> None:
    from lifecycle_es.events import encode_all, type_of

    digest = "sha256:" + "0" * 64
    good = [LeaseSettled(lease_id=f"lease-{n}", lease_generation=1, result_digest=digest) for n in range(3)]
    assert encode_all(good) == [(type_of(event), encode(event)) for event in good]
    spoiled: list[Any] = list(good)
    spoiled[bad_at] = "not an event"
    spoiled[min(bad_at + 1, 2)] = wrong_events(1.5)[0] if bad_at < 2 else spoiled[2]
    with pytest.raises(InvalidInputError, match="lifecycle_es events"):
        encode_all(spoiled)
    floated: list[Any] = list(good)
    floated[bad_at] = wrong_events(1.5)[0]
    if bad_at < 2:
        floated[bad_at + 1] = "not an event"
    with pytest.raises(InvalidInputError, match="integers only"):
        encode_all(floated)


def test_canonical_bytes_refuses_a_float_at_any_depth() -> None:
    for value in ({"a": {"b": [1, 2.5]}}, {"a": (1, {"c": float("nan")})}, [1, "x", None, [True, -0.0]], 1e3,
                  {"x": "y", "z": {"w": [{"v": float("inf")}]}}):
        with pytest.raises(InvalidInputError, match="integers only"):
            canonical_bytes(value)
    assert canonical_bytes({"b": [1, {"c": None}], "a": (True, "x")}) == b'{"a":[true,"x"],"b":[1,{"c":null}]}'
