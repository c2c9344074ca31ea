"""Command programs: random programs of commands planned against a `ReferenceRunner`, and `run_program`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import msgspec
from hypothesis import strategies as st

from ..canonical import iso_ms, parse_iso_ms
from ..errors import LifecycleError
from ..values import ProxyAuthority, Resources
from .bounds import MAX_PROXY_AGE_MS, MIB, PARK_REASONS
from .clock import START_MS, FakeClock
from .model import ReferenceRunner
from .values import digests, ids, proxy_authorities

RUNNER_DEFAULTS: dict[str, Any] = {
    "runner_id": "runner-1",
    "target": "local",
    "resources": Resources(cpu_seconds=600, memory_bytes=1024 * MIB),
    "post_session_hook_digest": "sha256:" + "ab" * 32,
}
"""The runner identity `command_programs` plans against (add ``base_dir`` and ``now``)."""


class Command(NamedTuple):
    """One step of a program: advance the clock by `advance_ms`, then call `name(**kwargs)`.

    `expect` is the name of the error class the model raised (None when the command succeeded).
    """

    advance_ms: int
    name: str
    kwargs: dict[str, Any]
    expect: str | None = None


def run_program(runner: Any, clock: FakeClock, program: list[Command]) -> list[tuple[Any, str | None]]:
    """Run `program` against a `ReferenceRunner` or a `RunnerLifecycle`; ``(result, error name)`` per step.

    Lease ids in a program are those a fresh `SequentialIds` hands out: build the runner with
    ``random_id=SequentialIds()``, `RUNNER_DEFAULTS`, and a clock at the program's start.
    """
    outcomes: list[tuple[Any, str | None]] = []
    for command in program:
        clock.advance(command.advance_ms)
        try:
            outcomes.append((getattr(runner, command.name)(**command.kwargs), None))
        except LifecycleError as exc:
            outcomes.append((None, type(exc).__name__))
    return outcomes


_ADVANCES = (0, 0, 0, 1, 999, 30_000, 61_000, 400_000)
_TTLS = (1_000, 60_000, 600_000, 24 * 60 * 60 * 1000)
_TIMEOUTS = (1, 1_000, 60_000, 600_000)


def _options(doc: dict[str, Any], now_ms: int, sessions: list[str]) -> list[str]:
    """The commands that are valid now (or, for park_expired_drain, once the deadline is waited out)."""
    state = doc["state"]
    active = [lease for lease in doc["leases"] if lease["status"] == "active"]
    live = [lease for lease in active if parse_iso_ms(lease["expiresAt"]) > now_ms]
    busy = {lease["sessionId"] for lease in active}
    options: list[str] = []
    if state == "accepting":
        options += ["request_drain", "rotate_proxy_authority"]
        options += ["acquire_lease"] * 3 if set(sessions) - busy else []
        options += ["refresh_lease_authority"] if live else []
    if state in ("accepting", "draining"):
        options += ["settle_lease", "park_lease"] * 2 if active else []
        options += ["assert_poll"] if live else []
    if state == "draining":
        options += ["rotate_proxy_authority", "park_expired_drain"]
    if state == "parked":
        options.append("begin_reclaim")
    if state == "reclaiming":
        options.append("complete_reclaim")
    if state in ("parked", "draining") and _hookable(doc):
        options.append("authorize_post_session_hook")
    return options


def _hookable(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [lease for lease in doc["leases"]
            if lease["status"] != "active" and lease["resultDigest"] and lease["hookReceiptDigest"] is None]


def _valid_command(draw: Any, model: ReferenceRunner, clock: FakeClock, proxy_id: str,
                   sessions: list[str]) -> tuple[int, str, dict[str, Any]]:
    """Draw a clock step and a command valid for the model after it."""
    advance = draw(st.sampled_from(_ADVANCES))
    clock.advance(advance)
    doc = model.doc
    assert doc is not None
    now_ms = clock()
    name = draw(st.sampled_from(_options(doc, now_ms, sessions)))
    generation, bound = doc["generation"], doc["proxyAuthority"]
    active = [lease for lease in doc["leases"] if lease["status"] == "active"]
    live = [lease for lease in active if parse_iso_ms(lease["expiresAt"]) > now_ms]
    kwargs: dict[str, Any]
    if name == "park_expired_drain":
        wait = max(0, parse_iso_ms(doc["drain"]["deadlineAt"]) - now_ms)
        clock.advance(wait)
        advance += wait
        kwargs = {"expected_generation": generation}
    elif name == "acquire_lease":
        busy = {lease["sessionId"] for lease in active}
        proxy = draw(proxy_authorities(now_ms, id=proxy_id if bound["id"] == "unbound" else bound["id"],
                                       min_revision=bound["revision"], max_revision=bound["revision"] + 2))
        kwargs = {"session_id": draw(st.sampled_from([s for s in sessions if s not in busy])),
                  "expected_generation": generation, "ttl_ms": draw(st.sampled_from(_TTLS)),
                  "proxy_authority": proxy}
    elif name in ("rotate_proxy_authority", "begin_reclaim"):
        proxy = draw(proxy_authorities(now_ms, id=bound["id"], min_revision=bound["revision"] + 1,
                                       max_revision=bound["revision"] + 3))
        kwargs = {"expected_generation": generation, "proxy_authority": proxy}
    elif name == "request_drain":
        kwargs = {"expected_generation": generation, "timeout_ms": draw(st.sampled_from(_TIMEOUTS))}
    elif name == "complete_reclaim":
        kwargs = {"expected_generation": generation}
    elif name in ("settle_lease", "park_lease"):
        lease = draw(st.sampled_from(active))
        kwargs = {"lease_id": lease["id"], "lease_generation": lease["generation"], "result_digest": draw(digests())}
        if name == "park_lease":
            kwargs["reason"] = draw(st.sampled_from(PARK_REASONS))
    elif name == "assert_poll":
        lease = draw(st.sampled_from(live))
        kwargs = {"lease_id": lease["id"], "lease_generation": lease["generation"],
                  "proxy_authority_id": bound["id"], "proxy_authority_revision": bound["revision"]}
    elif name == "refresh_lease_authority":
        lease = draw(st.sampled_from(live))
        proxy = draw(proxy_authorities(now_ms, id=bound["id"], min_revision=bound["revision"],
                                       max_revision=bound["revision"]))
        kwargs = {"lease_id": lease["id"], "lease_generation": lease["generation"],
                  "expected_generation": generation, "proxy_authority": proxy}
    else:
        lease = draw(st.sampled_from(_hookable(doc)))
        kwargs = {"expected_runner_generation": generation, "lease_id": lease["id"],
                  "lease_generation": lease["generation"], "result_digest": lease["resultDigest"],
                  "hook_digest": model.post_session_hook_digest}
    return advance, name, kwargs


def _spoil(draw: Any, name: str, kwargs: dict[str, Any], now_ms: int) -> tuple[str, dict[str, Any]]:
    """Make a valid command (most likely) invalid: a stale fence, a bad value, a stale or drifted proxy."""
    kwargs = dict(kwargs)
    spoilers = ["wrong-state"] + [key for key in kwargs if key in _SPOILERS]
    which = draw(st.sampled_from(spoilers))
    if which == "wrong-state":
        other = draw(st.sampled_from(("complete_reclaim", "park_expired_drain", "request_drain")))
        return other, {"expected_generation": kwargs.get("expected_generation", 1)}
    kwargs[which] = _SPOILERS[which](draw, kwargs[which], now_ms)
    return name, kwargs


def _spoil_proxy(draw: Any, proxy: ProxyAuthority, now_ms: int) -> Any:
    kind = draw(st.sampled_from(("stale", "drifted", "rolled-back", "shape")))
    if kind == "stale":
        return msgspec.structs.replace(proxy, issued_at=iso_ms(max(0, now_ms - MAX_PROXY_AGE_MS - 1)))
    if kind == "drifted":
        return msgspec.structs.replace(proxy, id=proxy.id + "-drifted")
    if kind == "rolled-back":
        return msgspec.structs.replace(proxy, revision=max(1, proxy.revision - 2))
    return {"id": proxy.id, "revision": proxy.revision, "issued_at": proxy.issued_at}


_SPOILERS: dict[str, Callable[[Any, Any, int], Any]] = {
    "expected_generation": lambda draw, value, now: max(1, value + draw(st.sampled_from((-1, 1, 2)))),
    "expected_runner_generation": lambda draw, value, now: value + 1,
    "lease_generation": lambda draw, value, now: value + 1,
    "lease_id": lambda draw, value, now: "lease-never-acquired",
    "session_id": lambda draw, value, now: "-not-an-id",
    "result_digest": lambda draw, value, now: "sha256:" + "G" * 64,
    "hook_digest": lambda draw, value, now: "sha256:" + "0" * 64,
    "ttl_ms": lambda draw, value, now: draw(st.sampled_from((0, 999, True, 24 * 60 * 60 * 1000 + 1))),
    "timeout_ms": lambda draw, value, now: draw(st.sampled_from((0, 600_001, 1.5))),
    "reason": lambda draw, value, now: "bored",
    "proxy_authority": _spoil_proxy,
    "proxy_authority_revision": lambda draw, value, now: value + 1,
}


def _call(runner: Any, name: str, kwargs: dict[str, Any]) -> LifecycleError | None:
    try:
        getattr(runner, name)(**kwargs)
    except LifecycleError as exc:
        return exc
    return None


def _plan(draw: Any, model: ReferenceRunner, clock: FakeClock, max_commands: int, invalid: bool) -> list[Command]:
    proxy_id = draw(ids(max_size=12))
    sessions = draw(st.lists(ids(max_size=8), min_size=1, max_size=4, unique=True))
    program = [Command(0, "initialize", {})]
    model.initialize()
    for _ in range(draw(st.integers(0, max_commands))):
        advance, name, kwargs = _valid_command(draw, model, clock, proxy_id, sessions)
        if invalid and draw(st.integers(0, 2)) == 0:
            name, kwargs = _spoil(draw, name, kwargs, clock())
        error = _call(model, name, kwargs)
        program.append(Command(advance, name, kwargs, type(error).__name__ if error is not None else None))
    return program


@st.composite
def command_programs(draw: Any, *, max_commands: int = 30, invalid: bool = False, start_ms: int = START_MS,
                     runner_id: str = RUNNER_DEFAULTS["runner_id"],
                     post_session_hook_digest: str = RUNNER_DEFAULTS["post_session_hook_digest"]) -> list[Command]:
    """Programs of commands for one runner (`RUNNER_DEFAULTS`), planned against a `ReferenceRunner`.

    The first command is ``initialize``; the clock starts at `start_ms`. Without `invalid` every
    command is valid when it runs; with it about one in three is spoiled (a stale generation, an
    unknown lease, a bad value, a stale, drifted or rolled-back proxy, a command for another state).
    Each step's `Command.expect` is the error the model raised. Run one with `run_program`.
    """
    clock = FakeClock(start_ms)
    model = ReferenceRunner(**{**RUNNER_DEFAULTS, "runner_id": runner_id,
                               "post_session_hook_digest": post_session_hook_digest},
                            base_dir="/srv/lifecycle-es", now=clock)
    return _plan(draw, model, clock, max_commands, invalid)
