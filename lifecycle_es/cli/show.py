"""``lifecycle-es show``: the fleet, or one runner and its leases, as of now or any seq.

    lifecycle-es show runners.db                     every runner, one line each
    lifecycle-es show runners.db runner-7 --at 120   one runner as it was after seq 120
    lifecycle-es show runners.db -k store.key        a keyed store, from its snapshots

State is a replay of the log (the same rules as the commands), each runner from its snapshot when the
snapshot's tag proves it and then only the events after it, never from the read models (a cache anyone
with the file can edit); the file is opened read-only. A keyed store's tags are MACs: without
``--key-file`` none is proven, and every runner is replayed from its first event. A long replay draws a
progress bar on a terminal.
Every value is printed escaped (``exits.printable``): ids from a hostile file cannot drive the terminal.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from .access import open_store, read_key_file
from .exits import EXIT_OK, no_runner, printable
from .options import int_at_least
from .options import runner_id as runner_arg
from .render import Bar, pairs, short, table


def register(subparsers: Any) -> None:
    """Add the ``show`` subcommand."""
    parser = subparsers.add_parser(
        "show", help="the fleet, or one runner and its leases, as of now or any seq",
        description="Print every runner (state, generation, policy revision, proxy, drain deadline, lease "
                    "counts), or one runner with its leases: each runner folded through the rules from its "
                    "snapshot when the snapshot's tag verifies, else from its first event. Read-only.")
    parser.add_argument("file", metavar="FILE", help="the store file")
    parser.add_argument("runner", metavar="RUNNER", nargs="?", type=runner_arg,
                        help="one runner id (default: the whole fleet)")
    parser.add_argument("--at", type=int_at_least(0), metavar="SEQ", help="as of this seq (default: the head)")
    parser.add_argument("-k", "--key-file", metavar="K", help="a keyed store's key, to start each runner from its "
                                                               "snapshot (without it the log is replayed whole)")
    parser.add_argument("-j", "--json", action="store_true", help="print one JSON object")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Print the fleet or the runner."""
    import msgspec

    from projections import fleet, project, state_at

    key = read_key_file(args.key_file) if args.key_file else None
    bar = Bar("show")
    with open_store(args.file, key=key) as store, store.backend.read_tx("show"):
        head = store.head().seq
        at = head if args.at is None else min(args.at, head)
        if args.runner is None:
            try:
                view = fleet(store, at_seq=at, progress=bar)
            finally:
                bar.close()
            data = msgspec.to_builtins(view)
        else:
            try:
                state = state_at(store, args.runner, at, progress=bar)
            finally:
                bar.close()
            if state is None:
                raise no_runner(args.runner, args.file, at=None if at == head else at)
            data = {"head_seq": at, "runner": msgspec.to_builtins(project(state)),
                    "leases": msgspec.to_builtins(state.leases)}
    if args.json:
        print(json.dumps(data))
    elif args.runner is None:
        print(fleet_text(data, head))
    else:
        print(runner_text(data, head))
    return EXIT_OK


def _as_of(at: int, head: int) -> str:
    return f"as of seq {at:,}" + (" (the head)" if at == head else f" (the head is {head:,})")


def fleet_text(data: dict[str, Any], head: int) -> str:
    """The fleet view as a table, then runners by state and leases by status."""
    rows = []
    for runner_id, snap in data["runners"].items():
        drain = snap["drain"]
        rows.append((runner_id, snap["target"], snap["state"], snap["generation"], snap["policy_revision"],
                     snap["proxy_authority"]["id"], snap["proxy_authority"]["revision"],
                     drain["deadline_at"] if drain else None, snap["active_lease_count"],
                     snap["parked_lease_count"], snap["settled_lease_count"], snap["updated_at"]))
    lines = [f"fleet of {len(rows):,} runner(s), {_as_of(data['head_seq'], head)}"]
    if rows:
        lines += ["", table(("runner", "target", "state", "gen", "policy", "proxy", "proxy rev", "drain deadline",
                             "active", "parked", "settled", "updated"), rows)]
    by_state = ", ".join(f"{name} {len(ids):,}" for name, ids in data["runners_by_state"].items())
    by_status = ", ".join(f"{name} {count:,}" for name, count in data["leases_by_status"].items())
    lines += ["", pairs([("runners by state", by_state), ("leases by status", by_status)])]
    return "\n".join(lines)


def runner_text(data: dict[str, Any], head: int) -> str:
    """One runner's snapshot as name/value lines, then its retained leases as a table."""
    snap, leases = data["runner"], data["leases"]
    drain = snap["drain"]
    proxy = snap["proxy_authority"]
    resources = snap["resources"]
    lines = [printable(f"runner {snap['runner_id']}, {_as_of(data['head_seq'], head)}"), pairs([
        ("target", snap["target"]),
        ("state", snap["state"]),
        ("accepting", snap["accepting"]),
        ("generation", snap["generation"]),
        ("policy revision", snap["policy_revision"]),
        ("proxy", f"{proxy['id']} revision {proxy['revision']}"),
        ("drain", f"{drain['signal']} requested {drain['requested_at']}, deadline {drain['deadline_at']}"
         if drain else None),
        ("resources", f"{resources['cpu_seconds']:,} cpu s, {resources['memory_bytes']:,} bytes"),
        ("base dir digest", short(snap["base_dir_digest"], 16)),
        ("leases", f"active {snap['active_lease_count']:,}, parked {snap['parked_lease_count']:,}, "
                   f"settled {snap['settled_lease_count']:,}"),
        ("updated", snap["updated_at"]),
    ], indent="  ")]
    if leases:
        rows = [(lease["id"], lease["session_id"], lease["generation"], lease["status"], lease["expires_at"],
                 short(lease["result_digest"]), short(lease["hook_receipt_digest"])) for lease in leases]
        lines += ["", table(("lease", "session", "gen", "status", "expires", "result", "hook receipt"), rows,
                            indent="  ")]
    else:
        lines += ["", "  no leases retained"]
    return "\n".join(lines)
