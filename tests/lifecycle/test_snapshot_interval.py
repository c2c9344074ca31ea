"""A runner's snapshots by default grow apart as its retained leases grow; a chosen `snapshot_every` holds.

A snapshot holds every retained lease, so the default interval is 64 events while the runner retains up to 256
leases, then 128 up to 512, then 256 (the 1,024-lease bound): the snapshot bytes a command writes stay within a
few times the event's. On both backends, with real commands.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from lifecycle_es import EventStore, RunnerLifecycle
from lifecycle_es.canonical import iso_ms
from lifecycle_es.handle import snapshot_interval
from lifecycle_es.replay import snapshot_of
from lifecycle_es.testing import RUNNER_DEFAULTS, START_MS, FakeClock, SequentialIds
from lifecycle_es.values import ProxyAuthority

HOUR = 3_600_000


@pytest.mark.parametrize(("leases", "interval"), [(0, 64), (1, 64), (256, 64), (257, 128), (512, 128),
                                                  (513, 256), (1024, 256)])
def test_the_default_interval_spans_a_quarter_of_the_retained_leases(leases: int, interval: int) -> None:
    assert snapshot_interval(None, leases) == interval
    assert snapshot_interval(3, leases) == 3  # a chosen interval is the caller's


def _snapshot_versions(store_target: str, tmp_path: Path, commands: int, **options: int) -> list[tuple[int, int]]:
    """(version, retained leases) of each new snapshot seen after each of `commands` acquire/settle commands."""
    clock = FakeClock()
    seen: list[tuple[int, int]] = []
    with EventStore.open(store_target, now=clock.now) as store:
        lifecycle = RunnerLifecycle(store, **RUNNER_DEFAULTS, base_dir=str(tmp_path), now=clock.now,
                                    random_id=SequentialIds(), preflight_base_dir=lambda path: None, **options)
        generation = lifecycle.initialize().generation
        proxy = ProxyAuthority(id="proxy-1", revision=1, issued_at=iso_ms(START_MS),
                               expires_at=iso_ms(START_MS + HOUR))
        last = 0
        for number in range(commands // 2):
            clock.advance(1)
            lease = lifecycle.acquire_lease(session_id=f"s-{number}", expected_generation=generation,
                                            proxy_authority=proxy).lease
            clock.advance(1)
            lifecycle.settle_lease(lease_id=lease.id, lease_generation=lease.generation,
                                           result_digest="sha256:" + "c" * 64)
            found = snapshot_of(store, RUNNER_DEFAULTS["runner_id"])
            if found is not None and found.version != last:
                last = found.version
                assert found.state is not None
                seen.append((found.version, len(found.state.leases)))
    return seen


def test_snapshots_grow_apart_as_the_runner_retains_more_leases(store_target: str, tmp_path: Path) -> None:
    # 700 commands: 350 leases retained, so the interval moves from 64 to 128 at the 257th lease.
    seen = _snapshot_versions(store_target, tmp_path, 700)
    for version, leases in seen:
        assert version % snapshot_interval(None, leases) == 0, (version, leases)
    versions = [version for version, _ in seen]
    assert versions[:8] == [64 * n for n in range(1, 9)]  # up to 256 leases (version 513): every 64
    # Past 256 leases, every 128: 576 (288 leases) is passed over, 640 taken; the log ends at version 701.
    assert [version for version, leases in seen if leases > 256] == [640]


def test_a_chosen_interval_holds_however_many_leases_are_retained(store_target: str, tmp_path: Path) -> None:
    seen = _snapshot_versions(store_target, tmp_path, 700, snapshot_every=64)
    assert [version for version, _ in seen] == [64 * n for n in range(1, 11)]
    assert seen[-1][1] > 256
