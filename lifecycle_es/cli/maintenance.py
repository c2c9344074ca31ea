"""``lifecycle-es rebuild`` and ``lifecycle-es seal``: the caches redone from the log, the head sealed.

    lifecycle-es rebuild runners.db          drop snapshots and read models, rebuild them by replay
    lifecycle-es rebuild runners.db --key-file store.key    the same for a keyed store (snapshots are MAC'd)
    lifecycle-es rebuild runners.db --jobs 1    replay in this process alone (default: one per CPU)
    lifecycle-es seal runners.db             verify the chain, then write the head to runners.db.seal
    lifecycle-es seal postgresql://db/fleet -o fleet.seal    a server's store: the seal file is named
    lifecycle-es seal runners.db --sign ops.key    also append a signed checkpoint to runners.db.checkpoints

A seal blesses the head it records, so ``seal`` verifies the chain first (``--no-verify`` skips that,
for a log just audited). A log already behind an earlier seal is refused, not re-sealed. ``--sign``
also signs the head with an Ed25519 key of ``lifecycle-es keygen`` (`lifecycle_es.checkpoints`):
anyone with its public key can then hold the log to it, with no secret.
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

from lifecycle_es.backends import is_url
from lifecycle_es.store import EventStore
from lifecycle_es.walk import MAX_JOBS

from .access import open_store, read_key_file, read_signer, require_file
from .exits import EXIT_OK, EXIT_USAGE, CommandError, printable
from .options import int_at_least
from .render import Bar


def register(subparsers: Any) -> None:
    """Add the ``rebuild`` and ``seal`` subcommands."""
    rebuild = subparsers.add_parser(
        "rebuild", help="drop and rebuild snapshots and read models from the log alone",
        description="Replay the log and rewrite the snapshots and the runners/leases read models in one "
                    "transaction. The log itself is never written.")
    rebuild.add_argument("file", metavar="FILE", help="the store file, or a postgresql:// URL")
    rebuild.add_argument("-k", "--key-file", metavar="K",
                         help="the store key (a keyed store's snapshots carry a MAC only its key can make)")
    rebuild.add_argument("--jobs", type=int_at_least(1, MAX_JOBS), default=min(os.cpu_count() or 1, MAX_JOBS),
                         metavar="N",
                         help="processes sharing the replay: this one and N-1 workers (default: the CPU count; a "
                              "log under 10,000 events a process is replayed in one)")
    rebuild.set_defaults(run=run_rebuild)

    seal = subparsers.add_parser(
        "seal", help="write the log's head to FILE.seal, so a rollback or truncation shows later",
        description="Verify the chain, then write the head (store id, seq, hash, at) to FILE.seal (0600, a MAC "
                    "in keyed mode). A later audit or open of a log behind it fails.")
    seal.add_argument("file", metavar="FILE", help="the store file, or a postgresql:// URL")
    seal.add_argument("-o", "--out", metavar="SEAL",
                      help="where to write the seal (default: FILE.seal; a URL's store needs one)")
    seal.add_argument("-k", "--key-file", metavar="K", help="the store key (a keyed store's seal is a MAC)")
    seal.add_argument("--no-verify", action="store_true", help="seal without verifying the chain first")
    seal.add_argument("--sign", metavar="KEY", help="also sign the head with this private key (lifecycle-es keygen) "
                                                    "and append the checkpoint to FILE.checkpoints")
    seal.add_argument("--checkpoints", metavar="CP", help="the checkpoint file --sign appends to "
                                                          "(default: FILE.checkpoints; a URL's store needs one)")
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
            report = rebuild(store, progress=bar, jobs=args.jobs)
        finally:
            bar.close()
    print(printable(f"rebuilt {args.file} from {report.events:,} events: {report.runners:,} runners in the read "
                    f"models, {report.snapshots:,} snapshots, in {report.seconds:.2f} s"))
    return EXIT_OK


def run_seal(args: argparse.Namespace) -> int:
    """Verify the chain and seal the head."""
    key = read_key_file(args.key_file) if args.key_file else None
    require_file(args.file)
    if args.out is None and is_url(args.file):
        raise CommandError(EXIT_USAGE, "seal: a store on a server has no file to seal beside: name the seal "
                                       "file with -o (it stays on the host that keeps it)")
    if args.checkpoints is not None and args.sign is None:
        raise CommandError(EXIT_USAGE, "--checkpoints names where --sign appends: pass --sign KEY too")
    if args.sign is not None and args.checkpoints is None and is_url(args.file):
        raise CommandError(EXIT_USAGE, "seal --sign: a store on a server has no file beside it: name the "
                                       "checkpoint file with --checkpoints")
    signer = read_signer(args.sign) if args.sign is not None else None
    out = args.out if args.out is not None else args.file + ".seal"
    # A log already behind the seal it would replace is refused, not re-sealed.
    earlier = out if os.path.lexists(out) else False
    with open_store(args.file, key=key, need_key=True, seal=earlier) as store:
        started = time.perf_counter()
        verified = None if args.no_verify else store.verify(key=key)
        sealed = store.seal(out)
        signed = store.checkpoint(signer, args.checkpoints) if signer is not None else None
        if verified is not None and max(sealed.seq, signed.seq if signed else 0) > verified.head.seq:
            # Another process appended meanwhile: what the seal and the checkpoint bless must be verified too.
            verified = store.verify(key=key)
    checked = "not verified" if verified is None else (
        f"{verified.events:,} events verified in {time.perf_counter() - started:.2f} s")
    print(printable(f"sealed {args.file} at seq {sealed.seq:,}, hash {sealed.hash} ({checked}) -> {out}"))
    if signed is not None and signer is not None:
        print(printable(f"signed checkpoint at seq {signed.seq:,} by {signer.verifier.name}+"
                        f"{signer.verifier.hash.hex()} -> {args.checkpoints or args.file + '.checkpoints'}"))
    return EXIT_OK
