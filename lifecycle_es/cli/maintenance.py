"""``lifecycle-es rebuild`` and ``lifecycle-es seal``: the caches redone from the log, the head sealed.

    lifecycle-es rebuild runners.db          drop snapshots and read models, rebuild them by replay
    lifecycle-es rebuild runners.db --key-file store.key    the same for a keyed store (snapshots are MAC'd)
    lifecycle-es seal runners.db             verify the chain, then write the head to runners.db.seal

A seal blesses the head it records, so ``seal`` verifies the chain first (``--no-verify`` skips that,
for a log just audited). A log already behind an earlier seal is refused, not re-sealed.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from lifecycle_es.store import EventStore

from .access import open_store, read_key_file, require_file
from .exits import EXIT_OK, printable
from .render import Bar


def register(subparsers: Any) -> None:
    """Add the ``rebuild`` and ``seal`` subcommands."""
    rebuild = subparsers.add_parser(
        "rebuild", help="drop and rebuild snapshots and read models from the log alone",
        description="Replay the log and rewrite the snapshots and the runners/leases read models in one "
                    "transaction. The log itself is never written.")
    rebuild.add_argument("file", metavar="FILE", help="the store file")
    rebuild.add_argument("-k", "--key-file", metavar="K",
                         help="the store key (a keyed store's snapshots carry a MAC only its key can make)")
    rebuild.set_defaults(run=run_rebuild)

    seal = subparsers.add_parser(
        "seal", help="write the log's head to FILE.seal, so a rollback or truncation shows later",
        description="Verify the chain, then write the head (store id, seq, hash, at) to FILE.seal (0600, a MAC "
                    "in keyed mode). A later audit or open of a log behind it fails.")
    seal.add_argument("file", metavar="FILE", help="the store file")
    seal.add_argument("-k", "--key-file", metavar="K", help="the store key (a keyed store's seal is a MAC)")
    seal.add_argument("--no-verify", action="store_true", help="seal without verifying the chain first")
    seal.set_defaults(run=run_seal)


def run_rebuild(args: argparse.Namespace) -> int:
    """Rebuild the caches and print what was done."""
    from projections import rebuild

    require_file(args.file)
    key = read_key_file(args.key_file) if args.key_file else None
    with open_store(args.file, key=key, need_key=True):
        pass  # the format, tables, key and seal are checked read-only before anything is written
    bar = Bar("rebuild")
    with EventStore.open(args.file, key=key) as store:  # a writer's open refuses a file whose schema was altered
        try:
            report = rebuild(store, progress=bar)
        finally:
            bar.close()
    print(printable(f"rebuilt {args.file} from {report.events:,} events: {report.runners:,} runners in the read "
                    f"models, {report.snapshots:,} snapshots, in {report.seconds:.2f} s"))
    return EXIT_OK


def run_seal(args: argparse.Namespace) -> int:
    """Verify the chain and seal the head."""
    key = read_key_file(args.key_file) if args.key_file else None
    with open_store(args.file, key=key, need_key=True) as store:
        started = time.perf_counter()
        verified = None if args.no_verify else store.verify(key=key)
        sealed = store.seal()
        if verified is not None and sealed.seq != verified.head.seq:
            # Another process appended between the two: what the seal blesses must have been verified too.
            verified = store.verify(key=key)
    checked = "not verified" if verified is None else (
        f"{verified.events:,} events verified in {time.perf_counter() - started:.2f} s")
    print(printable(f"sealed {args.file} at seq {sealed.seq:,}, hash {sealed.hash} ({checked}) -> {args.file}.seal"))
    return EXIT_OK
