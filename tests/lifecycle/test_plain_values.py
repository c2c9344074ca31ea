"""Values that pass a check as one thing and are stored as another: subclasses of str, int and float.

A subclass of str can answer ``==``, ``hash``, ``str()`` and ``encode()`` otherwise than its characters do,
and one of int or float can compare as any number: a check that takes such a value as an id, a choice or a
bound passes what the store then writes, hashes or compares as something else (a park reason that equals
every reason is stored as its own characters, which the rules then refuse on replay). So every id, digest,
target, choice, path and number a caller passes must be of the plain type itself: anything else is
InvalidInputError naming the field and saying a plain value is needed, and nothing is appended.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from hosts.checkpointing import Checkpointer
from hosts.local import LocalHost
from lifecycle_es import EventStore, InvalidInputError, RunnerLifecycle, audit
from lifecycle_es.canonical import iso_ms
from lifecycle_es.events import ReclaimCompleted
from lifecycle_es.testing import RUNNER_DEFAULTS, FakeClock
from lifecycle_es.values import TARGETS, safe_choice, safe_digest, safe_id, safe_number, safe_target

DIGEST = "sha256:" + "a" * 64


class Liar(str):
    """A str whose characters say one thing and whose answers say another."""

    def __eq__(self, other: object) -> bool:
        return True

    def __hash__(self) -> int:
        return hash(self.told)

    def __str__(self) -> str:
        return self.told

    def encode(self, *args: Any, **kwargs: Any) -> bytes:
        return self.told.encode()

    told = "runner-b"


class Honest(str):
    """A str subclass that changes nothing: still refused, since nothing says it would not."""


class Count(int):
    """An int that claims to lie within every bound."""

    def __le__(self, other: object) -> bool:
        return True

    def __ge__(self, other: object) -> bool:
        return True

    def __lt__(self, other: object) -> bool:
        return False

    def __gt__(self, other: object) -> bool:
        return False


class Seconds(float):
    """A float subclass."""


def refused(field: str, call: Callable[[], Any]) -> InvalidInputError:
    with pytest.raises(InvalidInputError) as info:
        call()
    assert info.value.field == field, info.value
    assert "plain" in str(info.value), info.value
    return info.value


@pytest.mark.parametrize("kind", [Liar, Honest])
@pytest.mark.parametrize(("check", "value"), [
    (lambda value: safe_id(value, "stream"), "runner-a"),
    (lambda value: safe_digest(value, "stream"), DIGEST),
    (lambda value: safe_target(value, "stream"), "local"),
    (lambda value: safe_choice(value, "stream", ("full", "normal")), "full"),
], ids=["id", "digest", "target", "choice"])
def test_a_str_subclass_is_no_id_digest_target_or_choice(check: Callable[[object], str], value: str,
                                                         kind: type[str]) -> None:
    assert check(value) == value
    error = refused("stream", lambda: check(kind(value)))
    assert kind.__name__ in str(error) and "runner-b" not in str(error)


@pytest.mark.parametrize("value", [Count(5), Seconds(5.0)])
def test_a_number_subclass_is_no_number(value: object) -> None:
    assert safe_number(5, "linger_ms", 0, 100) == 5.0
    refused("linger_ms", lambda: safe_number(value, "linger_ms", 0, 100))


def log(store: EventStore) -> list[tuple[Any, ...]]:
    return [recorded.row() for recorded in store.read()]


@pytest.fixture
def lifecycle(store: EventStore, tmp_path: Path, clock: FakeClock) -> Iterator[RunnerLifecycle]:
    made = RunnerLifecycle(store, **{**RUNNER_DEFAULTS, "base_dir": str(tmp_path)}, now=clock)  # type: ignore[arg-type]
    made.initialize()
    yield made


def test_a_stream_name_that_lies_is_refused_and_appends_nothing(store: EventStore, lifecycle: RunnerLifecycle,
                                                               clock: FakeClock) -> None:
    before = log(store)
    event = ReclaimCompleted(generation=2)
    for append in (store.append, store.append_unchecked):
        refused("stream", lambda append=append: append(Liar("runner-a"), [event]))  # type: ignore[misc]
    assert log(store) == before


def test_a_park_reason_that_equals_every_reason_is_refused(store: EventStore, lifecycle: RunnerLifecycle) -> None:
    lease = lifecycle.acquire_lease(session_id="s-1", expected_generation=1, proxy_authority={
        "id": "proxy-1", "revision": 1, "issued_at": iso_ms(lifecycle.clock()),
        "expires_at": iso_ms(lifecycle.clock() + 60_000)}).lease
    before = log(store)

    class Reason(Liar):
        told = "lost-poll"

    refused("reason", lambda: lifecycle.park_lease(lease_id=lease.id, lease_generation=1, result_digest=DIGEST,
                                                   reason=Reason("stolen")))
    assert log(store) == before


@pytest.mark.parametrize("field", ["runner_id", "target", "post_session_hook_digest", "base_dir"])
def test_a_runner_named_by_str_subclasses_is_refused(store: EventStore, tmp_path: Path, field: str) -> None:
    options: dict[str, Any] = {**RUNNER_DEFAULTS, "base_dir": str(tmp_path)}
    options[field] = Honest(options[field])
    refused(field, lambda: RunnerLifecycle(store, **options))
    assert log(store) == []


def test_a_store_opened_with_subclassed_options_is_refused(tmp_path: Path) -> None:
    path = str(tmp_path / "events.db")
    refused("path", lambda: EventStore.open(Honest(path)))
    refused("durability", lambda: EventStore.open(path, durability=Honest("full")))
    refused("busy_timeout_ms", lambda: EventStore.open(path, busy_timeout_ms=Count(10)))
    with pytest.raises(InvalidInputError, match="plain str") as info:
        EventStore.open(path, vfs=Honest("unix"))
    assert info.value.field == "vfs"
    assert not Path(path).exists()


def test_numbers_of_the_audit_group_commit_and_checkpointer_are_plain(store: EventStore, tmp_path: Path) -> None:
    refused("jobs", lambda: audit(store, jobs=Count(10**9)))
    refused("max_batch", lambda: store.group_commit.tune(max_batch=Count(10)))
    refused("linger_ms", lambda: store.group_commit.tune(linger_ms=Seconds(1.0)))
    refused("linger_ms", lambda: store.group_commit.tune(linger_ms=Count(1)))
    refused("seconds", lambda: Checkpointer(store, None, seconds=Seconds(1.0)))  # type: ignore[arg-type]


@pytest.mark.parametrize(("field", "value"), [("mode", Honest("child")), ("scope", Honest("user"))])
def test_a_host_mode_or_scope_must_be_a_plain_str(lifecycle: RunnerLifecycle, tmp_path: Path, field: str,
                                                  value: str) -> None:
    refused(field, lambda: LocalHost(lifecycle, run_root=str(tmp_path), **{field: value}))


def test_targets_are_still_taken(store: EventStore, tmp_path: Path) -> None:
    for target in TARGETS:
        assert RunnerLifecycle(store, **{**RUNNER_DEFAULTS, "base_dir": str(tmp_path), "target": target,
                                         "runner_id": f"runner-{target}"}).target == target  # type: ignore[arg-type]


@pytest.mark.parametrize("value", [Count(1), Seconds(0.01)])
def test_a_follower_refuses_a_poll_interval_subclass(store: EventStore, value: object) -> None:
    refused("poll_interval", lambda: store.follow(poll_interval=value))  # type: ignore[arg-type]


def test_a_follower_refuses_a_stop_it_cannot_watch(store: EventStore) -> None:
    with pytest.raises(InvalidInputError) as info:
        store.follow(stop=True)  # type: ignore[arg-type]
    assert info.value.field == "stop" and "threading.Event" in str(info.value)
