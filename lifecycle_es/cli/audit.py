"""``lifecycle-es audit``: prove a log file whole, or name its first bad seq, its stream and why.

    lifecycle-es audit runners.db                       chain, rules, snapshots, read models, seal
    lifecycle-es audit runners.db --key-file store.key  a keyed store: MACs need the key
    lifecycle-es audit runners.db --json --jobs 4       one JSON object; 4 processes share the work
    lifecycle-es audit runners.db --html report.html    also a page: findings, and the timeline at the first problem
    lifecycle-es audit runners.db --trust ops.key.pub   also every checkpoint in runners.db.checkpoints: no secret

Exit 0 when the log is whole, 65 when it is not (and for a file that is not a lifecycle-es store),
66 for a missing file, 77 for a keyed store without its key; see ``exits.py``.
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from lifecycle_es.auditing import audit
from lifecycle_es.walk import MAX_JOBS

from .access import default_seal, input_file, open_store, read_key_file, read_trust, require_file
from .exits import EXIT_DATAERR, EXIT_OK, EXIT_USAGE, CommandError, classify, one_line, printable
from .options import int_at_least
from .render import Bar, pairs


def register(subparsers: Any) -> None:
    """Add the ``audit`` subcommand."""
    parser = subparsers.add_parser(
        "audit", help="prove a log whole: chain, every transition legal, caches equal a replay, the seal",
        description="Stream the log in constant memory: verify every hash (a MAC with --key-file), replay every "
                    "event through the transition rules, compare snapshots and read models with the replay, and "
                    "check the head against the seal. Exit 0 when all holds, 65 with the first bad seq when not.")
    parser.add_argument("file", metavar="FILE", help="the store file")
    parser.add_argument("--seal", metavar="SEAL", help="the seal file to check (default: FILE.seal when present)")
    parser.add_argument("-k", "--key-file", metavar="K", help="the store key: 32 raw bytes or 64 hex characters")
    parser.add_argument("--trust", action="append", metavar="PUB",
                        help="a public key (FILE.pub of lifecycle-es keygen) whose signed checkpoints the log is held "
                             "to; repeat for several signers")
    parser.add_argument("--checkpoints", metavar="CP",
                        help="the checkpoint file to check with --trust (default: FILE.checkpoints)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--html", metavar="OUT.html", help="also write the findings as one self-contained HTML page, "
                                                           "with the timeline drawn and the first problem marked on it")
    parser.add_argument("--jobs", type=int_at_least(1, MAX_JOBS), default=min(os.cpu_count() or 1, MAX_JOBS),
                        metavar="N",
                        help="processes, this one and N - 1 workers, each checking a seq range of the chain and "
                             "replaying a share of the runners (default: %(default)s, the CPUs; a log under 10,000 "
                             "events a process is audited in this one alone)")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Audit the file; print the summary; 0 when whole, 65 when not."""
    try:
        key = read_key_file(args.key_file) if args.key_file else None
        seal_path = default_seal(args.file, args.seal)
        trust = read_trust(args.trust) if args.trust else None
        checkpoints = _checkpoints(args.checkpoints, trust is not None)
        with open_store(args.file, key=key, seal=False, need_key=True) as store:
            bar = Bar("audit")
            try:
                report = audit(store, key=key, seal=seal_path, jobs=args.jobs, progress=bar, trust=trust,
                               checkpoints=checkpoints)
            finally:
                bar.close()
            if args.html:
                from .audit_page import write_page

                write_page(args.html, report, store, summary(report))
    except Exception as exc:
        if args.json:  # a machine still gets its one object, saying why there is no report
            code, message = classify(exc)
            print(json.dumps({"ok": False, "exit_code": code, "path": args.file, "events": None, "runners": None,
                              "states": None, "leases": None, "head_seq": None, "head_hash": None,
                              "first_bad_seq": getattr(exc, "seq", None), "stream": getattr(exc, "stream", None),
                              "reason": message, "snapshots_checked": None, "read_models_checked": None,
                              "seal": None, "checkpoints": None}))
        raise
    code = EXIT_OK if report.ok else EXIT_DATAERR
    if args.json:
        data = report.as_dict()
        print(json.dumps({"ok": data.pop("ok"), "exit_code": code, **data}))
    else:
        print(summary(report))
    return code


def _checkpoints(path: str | None, trusted: bool) -> str | None:
    """The checkpoint file named with --checkpoints, after checking it is a regular file (65 if not, 66 when
    missing); a missing default FILE.checkpoints is the audit's to report."""
    if path is None:
        return None
    if not trusted:
        raise CommandError(EXIT_USAGE, "--checkpoints needs --trust: a checkpoint is checked with its signer's "
                                       "public key")
    path = require_file(path, "checkpoint file", "--checkpoints")
    with input_file(path, what="checkpoint file", arg="--checkpoints"):
        pass  # what the file is, checked here; what it holds, by the audit
    return path


def summary(report: Any) -> str:
    """The report as people read it."""
    states = ", ".join(f"{name} {count:,}" for name, count in report.states.items() if count)
    leases = ", ".join(f"{name} {count:,}" for name, count in report.leases.items() if count)
    seal = "none"
    if report.seal is not None:
        seal = (f"seq {report.seal.get('seq', '?'):,} ok" if report.seal["ok"]
                else f"{report.seal['path']}: FAILED")
    items: list[tuple[str, Any]] = [
        ("events", report.events),
        ("runners", f"{report.runners:,}" + (f" ({states})" if states else "")),
        ("leases", f"{sum(report.leases.values()):,} retained" + (f" ({leases})" if leases else "")),
        ("head", f"seq {report.head_seq:,}" + (f"  hash {report.head_hash}" if report.head_hash else "")),
        ("chain", ("keyed (blake3 MAC)" if report.keyed else "unkeyed (blake3)")
         + (f"; {report.jobs} worker processes shared the work" if report.jobs > 1 else "; one process")),
        ("snapshots", f"{report.snapshots_checked:,} checked" if report.caches_checked else "not checked"),
        ("read models", "not checked" if not report.caches_checked else "none"
         if report.read_models_checked is None else f"{report.read_models_checked:,} runners checked"),
        ("seal", seal if report.caches_checked or report.seal is not None else "not checked"),
    ]
    if report.checkpoints is not None:
        signed = report.checkpoints
        items.append(("checkpoints", f"{signed['checked']:,} signed by a trusted key, the last at seq "
                                     f"{signed['seq']:,}: " + ("ok" if signed["ok"] else "FAILED")
                      if signed["checked"] else f"{signed['path']}: FAILED"))
    first = report.first_problem
    if first is None:
        items.append(("result", "OK: the log is whole"))
    else:
        where = f"seq {first.seq:,}" if first.seq is not None else "the log"
        stream = f" (stream {first.stream!r})" if first.stream is not None else ""
        items.append(("result", f"FAILED at {where}{stream}: {one_line(first.reason)}"))
        if len(report.problems) > 1:
            items.append(("also", f"{len(report.problems) - 1} more problem(s); --json lists them"))
    lines = [printable(f"audit of {report.path}"), pairs(items, indent="  ")]
    lines += [f"  warning: {one_line(warning)}" for warning in report.warnings]
    return "\n".join(lines)
