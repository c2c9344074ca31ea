"""The seed's storage approach, re-created in Python: one JSON file per runner, rewritten per command.

Seed 000 keeps a runner's whole state (with up to 1024 retained leases) in one JSON file and changes it
with ``mutateSecurityStore``: take an exclusive lock, read and parse the file, validate the state, mutate
it, write a temporary file, fsync it, rename it over the old one, fsync the directory, release the lock.
A read (``snapshot``) reads, parses and validates the file. This module does the same, step for step,
for the commands the benchmarks drive (``initialize``, ``acquire_lease``, ``settle_lease``,
``snapshot``), with the seed's validation (``validateState`` and ``validateLease`` on every read),
retention (``leases.slice(-1023)`` before a new lease), receipt digest and return values (``settleLease``
returns a fresh ``snapshot()``, which reads the file again). The lock is ``fcntl.flock`` on a lock file
beside the state; the preflight of the base directory is injected, as in the seed.
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import hashlib
import json
import os
import re
import uuid
from collections.abc import Callable
from typing import Any

SCHEMA = "cc-execution-location-runner-lifecycle/v1"
ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:@+-]{0,255}$")
DIGEST_RE = re.compile(r"^sha256:[a-f0-9]{64}$")
TARGETS = {"local", "wsl", "ssh", "container"}
STATES = {"accepting", "draining", "parked", "reclaiming"}
LEASE_STATUSES = {"active", "settled", "parked"}
MAX_PROXY_AGE_MS = 5 * 60 * 1000
MAX_RETAINED_LEASES = 1024
STATE_FIELDS = ("schema", "runnerId", "target", "state", "generation", "policyRevision", "baseDir", "resources",
                "proxyAuthority", "postSessionHookDigest", "drain", "leases", "updatedAt")
LEASE_FIELDS = ("id", "sessionId", "generation", "issuedAt", "expiresAt", "status", "resultDigest",
                "hookReceiptDigest")
LEASE_DOMAIN = "chainlesschain.execution-location.runner-lease.v1\0"
BASE_DIR_DOMAIN = "chainlesschain.execution-location.base-dir.v1\0"
MAX_SAFE_INTEGER = 2**53 - 1


class SeedError(Exception):
    """What the seed throws as ``Error`` or ``TypeError``."""


def canonical_json(value: Any) -> str:
    """The seed's canonicalJson: sorted keys, no whitespace."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def receipt_digest(domain: str, value: Any) -> str:
    """``sha256:`` over the domain string and the canonical JSON."""
    digest = hashlib.sha256(domain.encode())
    digest.update(canonical_json(value).encode())
    return "sha256:" + digest.hexdigest()


def iso(epoch_ms: int) -> str:
    """JavaScript's ``new Date(ms).toISOString()``."""
    moment = datetime.datetime.fromtimestamp(epoch_ms / 1000, tz=datetime.UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{epoch_ms % 1000:03d}Z"


def parse_ms(value: str) -> int:
    """JavaScript's ``Date.parse`` for the ISO strings the seed writes."""
    return int(datetime.datetime.fromisoformat(value).timestamp() * 1000)


def exact_object(value: Any, fields: tuple[str, ...], label: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise SeedError(f"{label} must be an object")
    if sorted(value) != sorted(fields):
        raise SeedError(f"{label} has an invalid schema")
    return value


def safe_id(value: Any, label: str) -> str:
    if not isinstance(value, str) or not ID_RE.match(value):
        raise SeedError(f"{label} is invalid")
    return value


def safe_digest(value: Any, label: str) -> str:
    if not isinstance(value, str) or not DIGEST_RE.match(value):
        raise SeedError(f"{label} is invalid")
    return value


def safe_integer(value: Any, label: str, minimum: int = 0, maximum: int = MAX_SAFE_INTEGER) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not minimum <= value <= maximum:
        raise SeedError(f"{label} is invalid")
    return value


def safe_timestamp(value: Any, label: str) -> str:
    if not isinstance(value, str):
        raise SeedError(f"{label} is invalid")
    try:
        datetime.datetime.fromisoformat(value)  # Number.isFinite(Date.parse(value)), at C speed
    except ValueError:
        raise SeedError(f"{label} is invalid") from None
    return value


def validate_resources(value: Any) -> dict[str, int]:
    data = exact_object(value, ("cpuSeconds", "memoryBytes"), "runner resources")
    return {"cpuSeconds": safe_integer(data["cpuSeconds"], "runner cpuSeconds", 1, 86_400),
            "memoryBytes": safe_integer(data["memoryBytes"], "runner memoryBytes", 64 << 20, 64 << 30)}


def validate_proxy_authority(value: Any, now_ms: int, minimum_revision: int = 0) -> dict[str, Any]:
    data = exact_object(value, ("id", "revision", "issuedAt", "expiresAt"), "proxy authority")
    issued_at = safe_timestamp(data["issuedAt"], "proxy authority issuedAt")
    expires_at = safe_timestamp(data["expiresAt"], "proxy authority expiresAt")
    revision = safe_integer(data["revision"], "proxy authority revision", max(1, minimum_revision))
    issued_ms = parse_ms(issued_at)
    if issued_ms > now_ms + 30_000 or now_ms - issued_ms > MAX_PROXY_AGE_MS or parse_ms(expires_at) <= now_ms:
        raise SeedError("execution location proxy authority is not fresh")
    return {"id": safe_id(data["id"], "proxy authority id"), "revision": revision, "issuedAt": issued_at,
            "expiresAt": expires_at}


def validate_lease(value: Any) -> dict[str, Any]:
    data = exact_object(value, LEASE_FIELDS, "runner lease")
    status = safe_id(data["status"], "runner lease status")
    if status not in LEASE_STATUSES:
        raise SeedError("runner lease status is invalid")
    return {
        "id": safe_id(data["id"], "runner lease id"),
        "sessionId": safe_id(data["sessionId"], "runner lease sessionId"),
        "generation": safe_integer(data["generation"], "runner lease generation", 1),
        "issuedAt": safe_timestamp(data["issuedAt"], "runner lease issuedAt"),
        "expiresAt": safe_timestamp(data["expiresAt"], "runner lease expiresAt"),
        "status": status,
        "resultDigest": None if data["resultDigest"] is None else safe_digest(
            data["resultDigest"], "runner lease resultDigest"),
        "hookReceiptDigest": None if data["hookReceiptDigest"] is None else safe_digest(
            data["hookReceiptDigest"], "runner lease hookReceiptDigest"),
    }


def validate_state(value: Any, expected: JsonRunnerLifecycle | None = None) -> dict[str, Any]:
    data = exact_object(value, STATE_FIELDS, "runner lifecycle state")
    if data["schema"] != SCHEMA:
        raise SeedError("runner lifecycle state schema is invalid")
    runner_id = safe_id(data["runnerId"], "runnerId")
    target = safe_id(data["target"], "runner target")
    state = safe_id(data["state"], "runner state")
    if target not in TARGETS or state not in STATES:
        raise SeedError("runner lifecycle target or state is invalid")
    if expected is not None and (expected.runner_id != runner_id or expected.target != target
                                 or expected.base_dir != data["baseDir"]):
        raise SeedError("runner lifecycle identity drifted")
    drain = None if data["drain"] is None else exact_object(
        data["drain"], ("signal", "requestedAt", "deadlineAt"), "runner drain")
    if (state == "draining") != bool(drain):
        raise SeedError("runner drain state is inconsistent")
    if drain:
        if drain["signal"] != "SIGTERM":
            raise SeedError("runner drain signal is invalid")
        safe_timestamp(drain["requestedAt"], "runner drain requestedAt")
        safe_timestamp(drain["deadlineAt"], "runner drain deadlineAt")
    if not isinstance(data["leases"], list) or len(data["leases"]) > MAX_RETAINED_LEASES:
        raise SeedError("runner leases are invalid")
    leases = [validate_lease(lease) for lease in data["leases"]]
    if len({lease["id"] for lease in leases}) != len(leases):
        raise SeedError("runner leases contain duplicate identities")
    proxy = exact_object(data["proxyAuthority"], ("id", "revision"), "runner proxy authority")
    return {
        **data,
        "runnerId": runner_id,
        "target": target,
        "state": state,
        "generation": safe_integer(data["generation"], "runner generation", 1),
        "policyRevision": safe_integer(data["policyRevision"], "runner policyRevision", 1),
        "resources": validate_resources(data["resources"]),
        "proxyAuthority": {"id": safe_id(proxy["id"], "runner proxy authority id"),
                           "revision": safe_integer(proxy["revision"], "runner proxy authority revision", 0)},
        "postSessionHookDigest": safe_digest(data["postSessionHookDigest"], "runner post-session hook digest"),
        "drain": drain,
        "leases": leases,
        "updatedAt": safe_timestamp(data["updatedAt"], "runner updatedAt"),
    }


def project(state: dict[str, Any]) -> dict[str, Any]:
    """The seed's ``project()``: the snapshot a caller sees."""
    leases = state["leases"]
    return {
        "schema": state["schema"], "runnerId": state["runnerId"], "target": state["target"],
        "state": state["state"], "accepting": state["state"] == "accepting", "generation": state["generation"],
        "policyRevision": state["policyRevision"],
        "baseDirDigest": receipt_digest(BASE_DIR_DOMAIN, state["baseDir"]),
        "resources": dict(state["resources"]), "proxyAuthority": dict(state["proxyAuthority"]),
        "drain": dict(state["drain"]) if state["drain"] else None,
        "activeLeaseCount": sum(1 for lease in leases if lease["status"] == "active"),
        "parkedLeaseCount": sum(1 for lease in leases if lease["status"] == "parked"),
        "settledLeaseCount": sum(1 for lease in leases if lease["status"] == "settled"),
        "updatedAt": state["updatedAt"],
    }


class SecurityStore:
    """``readSecurityStore`` / ``mutateSecurityStore``: a JSON file replaced atomically under a lock."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.lock_path = path + ".lock"
        self.directory = os.path.dirname(os.path.abspath(path))

    def read(self) -> dict[str, Any]:
        """Read and parse the file ({} when it does not exist yet)."""
        try:
            with open(self.path, encoding="utf-8") as handle:
                return json.load(handle)  # type: ignore[no-any-return]
        except FileNotFoundError:
            return {}

    def mutate(self, mutator: Callable[[dict[str, Any]], None]) -> None:
        """Lock, read, mutate a draft, write a temp file, fsync, rename, fsync the directory, unlock."""
        lock = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)
            draft = self.read()
            mutator(draft)
            temp = f"{self.path}.{os.getpid()}.{uuid.uuid4().hex}.tmp"
            fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                with os.fdopen(fd, "w", encoding="utf-8") as handle:
                    handle.write(json.dumps(draft, separators=(",", ":")))
                    handle.flush()
                    os.fsync(handle.fileno())
                os.replace(temp, self.path)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(temp)
                raise
            directory = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY)
            try:
                os.fsync(directory)
            finally:
                os.close(directory)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
            os.close(lock)


class JsonRunnerLifecycle:
    """The seed's ``ExecutionLocationRunnerLifecycle`` for the commands the benchmarks drive."""

    def __init__(self, path: str, *, runner_id: str, target: str, base_dir: str, resources: dict[str, int],
                 post_session_hook_digest: str, now: Callable[[], int], random_id: Callable[[], str],
                 preflight_base_dir: Callable[[str], None]) -> None:
        self.store = SecurityStore(path)
        self.file_path = os.path.abspath(path)
        self.runner_id = safe_id(runner_id, "runnerId")
        self.target = safe_id(target, "runner target")
        self.base_dir = os.path.abspath(base_dir)
        self.resources = validate_resources(resources)
        self.post_session_hook_digest = safe_digest(post_session_hook_digest, "postSessionHookDigest")
        self._now = now
        self._random_id = random_id
        self._preflight = preflight_base_dir

    def initialize(self) -> dict[str, Any]:
        now = iso(self._now())

        def mutator(draft: dict[str, Any]) -> None:
            if draft:
                validate_state(draft, self)
                return
            draft.update({
                "schema": SCHEMA, "runnerId": self.runner_id, "target": self.target, "state": "accepting",
                "generation": 1, "policyRevision": 1, "baseDir": self.base_dir, "resources": dict(self.resources),
                "proxyAuthority": {"id": "unbound", "revision": 0},
                "postSessionHookDigest": self.post_session_hook_digest, "drain": None, "leases": [],
                "updatedAt": now,
            })
        self.store.mutate(mutator)
        return self.snapshot()

    def snapshot(self) -> dict[str, Any]:
        return project(validate_state(self.store.read(), self))

    def acquire_lease(self, *, session_id: str, expected_generation: int, ttl_ms: int = 600_000,
                      proxy_authority: dict[str, Any]) -> dict[str, Any]:
        now_ms = self._now()
        now = iso(now_ms)
        session = safe_id(session_id, "sessionId")
        proxy = validate_proxy_authority(proxy_authority, now_ms)
        lease_id = f"lease-{self._random_id()}"
        expires_at = iso(now_ms + safe_integer(ttl_ms, "lease ttlMs", 1_000, 24 * 60 * 60 * 1000))
        self._preflight(self.base_dir)
        lease: dict[str, Any] = {}

        def mutator(draft: dict[str, Any]) -> None:
            state = validate_state(draft, self)
            if state["state"] != "accepting" or state["generation"] != expected_generation:
                raise SeedError("execution location runner is not accepting this generation")
            if any(c["sessionId"] == session and c["status"] == "active" for c in state["leases"]):
                raise SeedError("execution location session already has an active lease")
            if state["proxyAuthority"]["id"] not in ("unbound", proxy["id"]):
                raise SeedError("execution location proxy authority identity drifted")
            if proxy["revision"] < state["proxyAuthority"]["revision"]:
                raise SeedError("execution location proxy authority revision rolled back")
            lease.update({"id": lease_id, "sessionId": session, "generation": state["generation"],
                          "issuedAt": now, "expiresAt": expires_at, "status": "active", "resultDigest": None,
                          "hookReceiptDigest": None})
            draft.update(state)
            draft.update({"proxyAuthority": {"id": proxy["id"], "revision": proxy["revision"]},
                          "leases": [*state["leases"][-(MAX_RETAINED_LEASES - 1):], dict(lease)],
                          "updatedAt": now})
        self.store.mutate(mutator)
        material = {
            "runnerId": self.runner_id, "target": self.target, "authorityFile": self.file_path,
            "state": "accepting", "runnerGeneration": expected_generation, "lease": lease,
            "proxyAuthority": proxy, "baseDir": {"path": self.base_dir, "writableRequired": True},
            "resources": dict(self.resources),
            "postSessionHook": {"digest": self.post_session_hook_digest, "generation": lease["generation"]},
        }
        return {**material, "leaseReceiptDigest": receipt_digest(LEASE_DOMAIN, material)}

    def settle_lease(self, *, lease_id: str, lease_generation: int, result_digest: str) -> dict[str, Any]:
        digest = safe_digest(result_digest, "resultDigest")
        now = iso(self._now())

        def mutator(draft: dict[str, Any]) -> None:
            state = validate_state(draft, self)
            index = next((i for i, lease in enumerate(state["leases"]) if lease["id"] == lease_id), -1)
            lease = state["leases"][index] if index >= 0 else None
            if lease is None or lease["status"] != "active" or lease["generation"] != lease_generation:
                raise SeedError("execution location result lease fence is stale")
            leases = [{**c, "status": "settled", "resultDigest": digest} if i == index else c
                      for i, c in enumerate(state["leases"])]
            park = state["state"] == "draining" and all(c["status"] != "active" for c in leases)
            draft.update(state)
            draft.update({"state": "parked" if park else state["state"],
                          "generation": state["generation"] + 1 if park else state["generation"],
                          "drain": None if park else state["drain"], "leases": leases, "updatedAt": now})
        self.store.mutate(mutator)
        return self.snapshot()

    def prefill(self, count: int, *, now_ms: int, result_digest: str) -> None:
        """Set up: `count` settled leases in the file in one write (what `count` acquire/settle pairs leave)."""
        def mutator(draft: dict[str, Any]) -> None:
            state = validate_state(draft, self)
            leases = [{"id": f"lease-prefill-{i:06d}", "sessionId": f"session-prefill-{i:06d}",
                       "generation": state["generation"], "issuedAt": iso(now_ms),
                       "expiresAt": iso(now_ms + 600_000), "status": "settled", "resultDigest": result_digest,
                       "hookReceiptDigest": None} for i in range(count)]
            draft.update(state)
            draft["leases"] = [*state["leases"], *leases][-MAX_RETAINED_LEASES:]
        self.store.mutate(mutator)
