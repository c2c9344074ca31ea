"""The runners the lifecycle benchmarks drive, and what they drive them with.

`LifecycleRunner` drives a `RunnerLifecycle` with acquire_lease / settle_lease commands (one
transaction each); `json_pairs` drives the seed's JSON-file lifecycle the same way. Both take the
proxy authority a caller would mint once a minute and pass to every command (`AUTHORITY`), ids from a
counter, and no base directory preflight.
"""

from __future__ import annotations

import itertools
import time
from typing import Any

from lifecycle_es import EventStore, ProxyAuthority, Resources
from lifecycle_es.canonical import iso_ms

from .baselines import json_store

HOOK_DIGEST = "sha256:" + "0" * 64
RESULT_DIGEST = "sha256:" + "c" * 64


def lifecycle_api() -> Any:
    """The lifecycle module, or None while it has not landed."""
    try:
        from lifecycle_es import lifecycle
    except ImportError:
        return None
    return lifecycle if hasattr(lifecycle, "RunnerLifecycle") else None


def no_preflight(base_dir: str) -> None:
    """The preflight both sides of a comparison run: none (the figures compare storage and decisions)."""
    return None


class _Authority:
    """A proxy authority minted from the wall clock and renewed before it grows stale (same id and revision).

    A caller mints one and passes it to many commands, so it is built once per minute, not per command.
    """

    def __init__(self) -> None:
        self._minted = 0
        self._fields: dict[str, Any] = {}
        self._value: ProxyAuthority | None = None

    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000

    def _renew(self) -> None:
        now = self.now_ms()
        if now - self._minted > 60_000:
            self._minted = now
            self._fields = {"id": "proxy-1", "revision": 1, "issued_at": iso_ms(now),
                            "expires_at": iso_ms(now + 3_600_000)}
            self._value = ProxyAuthority(**self._fields)

    def fields(self) -> dict[str, Any]:
        """The authority as the seed's JSON store takes it (camelCase keys)."""
        self._renew()
        return {"id": self._fields["id"], "revision": self._fields["revision"],
                "issuedAt": self._fields["issued_at"], "expiresAt": self._fields["expires_at"]}

    def value(self) -> ProxyAuthority:
        """The authority as the lifecycle takes it."""
        self._renew()
        assert self._value is not None
        return self._value


AUTHORITY = _Authority()
IDS = itertools.count(1)


def random_id() -> str:
    """Ids from a counter: runs are alike, and no two leases of a run share an id."""
    return f"{next(IDS):012d}"


def new_lifecycle(store: EventStore, runner_id: str, base_dir: str, *, snapshot_every: int | None = None) -> Any:
    """A `RunnerLifecycle` of a local runner (not initialized: a cold load times exactly this and `snapshot`)."""
    extra = {} if snapshot_every is None else {"snapshot_every": snapshot_every}
    return lifecycle_api().RunnerLifecycle(
        store, runner_id=runner_id, target="local", base_dir=base_dir,
        resources=Resources(cpu_seconds=3600, memory_bytes=1 << 30), post_session_hook_digest=HOOK_DIGEST,
        random_id=random_id, preflight_base_dir=no_preflight, **extra)


class LifecycleRunner:
    """A `RunnerLifecycle` driven by acquire_lease / settle_lease commands, one transaction each."""

    def __init__(self, store: EventStore, runner_id: str, base_dir: str, *, snapshot_every: int | None = None) -> None:
        self.lifecycle = new_lifecycle(store, runner_id, base_dir, snapshot_every=snapshot_every)
        self.generation = self.lifecycle.initialize().generation
        self.sessions = itertools.count()
        self.pending: Any = None

    def command(self, _: int = 0) -> None:
        """The next command: acquire a lease, or settle the one acquired last."""
        if self.pending is None:
            self.pending = self.lifecycle.acquire_lease(
                session_id=f"session-{next(self.sessions)}", expected_generation=self.generation,
                proxy_authority=AUTHORITY.value()).lease
        else:
            lease, self.pending = self.pending, None
            self.lifecycle.settle_lease(lease_id=lease.id, lease_generation=lease.generation,
                                        result_digest=RESULT_DIGEST)

    def commands(self, count: int) -> int:
        """`count` commands, alternately acquire and settle; the count."""
        for _ in range(count):
            self.command()
        return count


def json_lifecycle(path: str, base_dir: str, leases: int) -> tuple[json_store.JsonRunnerLifecycle, int]:
    """The seed's JSON lifecycle of a runner holding `leases` settled leases, and its generation."""
    lifecycle = json_store.JsonRunnerLifecycle(
        path, runner_id="runner-json", target="local", base_dir=base_dir,
        resources={"cpuSeconds": 3600, "memoryBytes": 1 << 30}, post_session_hook_digest=HOOK_DIGEST,
        now=AUTHORITY.now_ms, random_id=random_id, preflight_base_dir=no_preflight)
    generation = lifecycle.initialize()["generation"]
    lifecycle.prefill(leases, now_ms=AUTHORITY.now_ms(), result_digest=RESULT_DIGEST)
    return lifecycle, generation


def json_pairs(lifecycle: json_store.JsonRunnerLifecycle, generation: int, pairs: int) -> int:
    """`pairs` acquire_lease / settle_lease pairs on the seed's JSON lifecycle; the command count."""
    for _ in range(pairs):
        receipt = lifecycle.acquire_lease(session_id=f"session-{random_id()}", expected_generation=generation,
                                          proxy_authority=AUTHORITY.fields())
        lifecycle.settle_lease(lease_id=receipt["lease"]["id"], lease_generation=receipt["lease"]["generation"],
                               result_digest=RESULT_DIGEST)
    return 2 * pairs
