"""The model's state: the original's JSON document that handles of one runner share, and the reads over it.

`ReferenceRunner` (in ``model``) adds the original's commands on top.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Callable, Mapping
from typing import Any

import msgspec

from ..canonical import iso_ms, receipt_digest
from ..errors import InvalidInputError, LifecycleError
from ..events import Event, RunnerParked
from ..lifecycle import UnknownRunnerError
from ..receipts import BaseDirClaim, LeaseReceipt, PostSessionHook, RunnerSnapshot
from ..state import Drain, Lease, ProxyRef, RunnerCapacityError, RunnerState
from ..values import ProxyAuthority, Resources
from .bounds import (
    BASE_DIR_DOMAIN,
    LEASE_DOMAIN,
    MAX_RETAINED_LEASES,
    MIB,
    RETAINED_AFTER_RECLAIM,
    TARGETS,
    _digest,
    _id,
    _integer,
)
from .clock import SequentialIds


def _proxy_struct(proxy: dict[str, Any]) -> ProxyAuthority:
    return ProxyAuthority(id=proxy["id"], revision=proxy["revision"], issued_at=iso_ms(proxy["issuedAt"]),
                          expires_at=iso_ms(proxy["expiresAt"]))


def _lease_struct(lease: dict[str, Any]) -> Lease:
    return Lease(id=lease["id"], session_id=lease["sessionId"], generation=lease["generation"],
                 issued_at=lease["issuedAt"], expires_at=lease["expiresAt"], status=lease["status"],
                 result_digest=lease["resultDigest"], hook_receipt_digest=lease["hookReceiptDigest"])


class _Shared:
    """The one state document and log that handles of the same runner share (like one JSON file)."""

    def __init__(self) -> None:
        self.doc: dict[str, Any] | None = None
        self.log: list[tuple[int, Event]] = []


class _ModelState:
    """One `ReferenceRunner` handle's identity, the state document it shares, and the plumbing and reads over it."""

    def __init__(self, *, runner_id: str, target: str, base_dir: str | os.PathLike[str],
                 resources: Resources | Mapping[str, int], post_session_hook_digest: str, now: Callable[[], int],
                 random_id: Callable[[], str] | None = None, authority_file: str = "",
                 max_retained_leases: int = MAX_RETAINED_LEASES,
                 retained_after_reclaim: int = RETAINED_AFTER_RECLAIM) -> None:
        self.runner_id = _id(runner_id, "runner_id")
        if not isinstance(target, str) or target not in TARGETS:
            raise InvalidInputError("target", "runner target is invalid")
        self.target = target
        self.base_dir = os.path.abspath(os.fspath(base_dir))
        given = msgspec.structs.asdict(resources) if isinstance(resources, Resources) else dict(resources)
        self.resources = {"cpuSeconds": _integer(given.get("cpu_seconds"), "resources.cpu_seconds", 1, 86_400),
                          "memoryBytes": _integer(given.get("memory_bytes"), "resources.memory_bytes", 64 * MIB,
                                                  64 * 1024 * MIB)}
        self.post_session_hook_digest = _digest(post_session_hook_digest, "post_session_hook_digest")
        self.authority_file = authority_file
        self.max_retained_leases = max_retained_leases
        self.retained_after_reclaim = retained_after_reclaim
        self._now = now
        self._random_id = random_id or SequentialIds()
        self._shared = _Shared()
        self.last_events: list[Event] = []

    def __repr__(self) -> str:
        doc = self._shared.doc
        shown = f"{doc['state']} at generation {doc['generation']}" if doc else "not initialized"
        return f"ReferenceRunner({self.runner_id!r}, {self.target}, {shown}, {len(self._shared.log)} events)"

    @property
    def doc(self) -> dict[str, Any] | None:
        """A copy of the state document (the original's JSON), or None before `initialize`."""
        return copy.deepcopy(self._shared.doc)

    @property
    def log(self) -> list[tuple[int, Event]]:
        """Every event the runner's stream should hold so far, with its time in epoch ms."""
        return list(self._shared.log)

    # --- plumbing ------------------------------------------------------------------------------------

    def _draft(self) -> dict[str, Any]:
        """A working copy of the state (the original's mutateSecurityStore draft); UnknownRunnerError if none."""
        doc = self._shared.doc
        if doc is None:
            raise UnknownRunnerError(f"runner {self.runner_id} is not initialized")
        # The original's validateState(draft, this) runs on every read and write, not only in initialize.
        if doc["runnerId"] != self.runner_id or doc["target"] != self.target or doc["baseDir"] != self.base_dir:
            raise LifecycleError("runner lifecycle identity drifted")
        # Commands replace nested values (proxy, drain) rather than edit them, and edit only lease
        # records, so copying the top level and each lease isolates the draft (deepcopy is 50x slower).
        return {**doc, "leases": [dict(lease) for lease in doc["leases"]]}

    def _commit(self, draft: dict[str, Any], now_ms: int, events: list[Event]) -> None:
        draft["updatedAt"] = iso_ms(now_ms)
        self._shared.doc = draft
        self._shared.log.extend((now_ms, event) for event in events)
        self.last_events = events

    def _park(self, draft: dict[str, Any], cause: str, events: list[Event]) -> None:
        draft["state"], draft["generation"], draft["drain"] = "parked", draft["generation"] + 1, None
        events.append(RunnerParked(cause=cause, generation=draft["generation"]))

    def _find(self, draft: dict[str, Any], lease_id: str) -> dict[str, Any] | None:
        return next((lease for lease in draft["leases"] if lease["id"] == lease_id), None)

    def _retain(self, leases: list[dict[str, Any]], limit: int) -> list[dict[str, Any]]:
        """Drop the oldest leases that are no longer active until at most `limit` remain."""
        leases = list(leases)
        while len(leases) > limit:
            index = next((i for i, lease in enumerate(leases) if lease["status"] != "active"), None)
            if index is None:
                raise RunnerCapacityError(f"execution location runner holds {len(leases)} active leases")
            del leases[index]
        return leases

    def _project(self, doc: dict[str, Any]) -> RunnerSnapshot:
        statuses = [lease["status"] for lease in doc["leases"]]
        drain = doc["drain"]
        return RunnerSnapshot(
            schema=doc["schema"], runner_id=doc["runnerId"], target=doc["target"], state=doc["state"],
            accepting=doc["state"] == "accepting", generation=doc["generation"],
            policy_revision=doc["policyRevision"], base_dir_digest=receipt_digest(BASE_DIR_DOMAIN, doc["baseDir"]),
            resources=Resources(cpu_seconds=doc["resources"]["cpuSeconds"],
                                memory_bytes=doc["resources"]["memoryBytes"]),
            proxy_authority=ProxyRef(**doc["proxyAuthority"]),
            drain=Drain(signal=drain["signal"], requested_at=drain["requestedAt"],
                        deadline_at=drain["deadlineAt"]) if drain else None,
            active_lease_count=statuses.count("active"), parked_lease_count=statuses.count("parked"),
            settled_lease_count=statuses.count("settled"), updated_at=doc["updatedAt"],
        )

    def _lease_receipt(self, doc: dict[str, Any], runner_generation: int, lease: dict[str, Any],
                       proxy: dict[str, Any]) -> LeaseReceipt:
        material = {
            "runnerId": self.runner_id, "target": self.target, "authorityFile": self.authority_file,
            "state": doc["state"], "runnerGeneration": runner_generation, "lease": dict(lease),
            "proxyAuthority": {"id": proxy["id"], "revision": proxy["revision"],
                               "issuedAt": iso_ms(proxy["issuedAt"]), "expiresAt": iso_ms(proxy["expiresAt"])},
            "baseDir": {"path": self.base_dir, "writableRequired": True},
            "resources": dict(self.resources),
            "postSessionHook": {"digest": self.post_session_hook_digest, "generation": lease["generation"]},
        }
        return LeaseReceipt(
            runner_id=self.runner_id, target=self.target, authority_file=self.authority_file, state=doc["state"],
            runner_generation=runner_generation, lease=_lease_struct(lease), proxy_authority=_proxy_struct(proxy),
            base_dir=BaseDirClaim(path=self.base_dir),
            resources=Resources(cpu_seconds=self.resources["cpuSeconds"], memory_bytes=self.resources["memoryBytes"]),
            post_session_hook=PostSessionHook(digest=self.post_session_hook_digest, generation=lease["generation"]),
            lease_receipt_digest=receipt_digest(LEASE_DOMAIN, material),
        )

    # --- reading -------------------------------------------------------------------------------------

    def snapshot(self) -> RunnerSnapshot:
        """The original's ``project()`` of the current state."""
        return self._project(self._draft())

    def runner_state(self) -> RunnerState:
        """The current state as the library's `RunnerState` (what ``RunnerLifecycle.state()`` returns)."""
        doc = self._draft()
        drain = doc["drain"]
        return RunnerState(
            schema=doc["schema"], runner_id=doc["runnerId"], target=doc["target"], state=doc["state"],
            generation=doc["generation"], policy_revision=doc["policyRevision"], base_dir=doc["baseDir"],
            resources=Resources(cpu_seconds=doc["resources"]["cpuSeconds"],
                                memory_bytes=doc["resources"]["memoryBytes"]),
            proxy_authority=ProxyRef(**doc["proxyAuthority"]), post_session_hook_digest=doc["postSessionHookDigest"],
            drain=Drain(signal=drain["signal"], requested_at=drain["requestedAt"],
                        deadline_at=drain["deadlineAt"]) if drain else None,
            leases=tuple(_lease_struct(lease) for lease in doc["leases"]), updated_at=doc["updatedAt"],
            # Every event the model appends is a lifecycle event, which sets updatedAt to its stamp.
            last_at=doc["updatedAt"],
        )
