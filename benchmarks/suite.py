"""The suite: which benchmark modules exist, the context they run in, the command line and the report.

    python -m benchmarks [--quick] [--only NAME ...] [--out DIR] [--data-dir DIR] [--keep-data]
    python -m benchmarks --only reads audit timeline  (the long ones, which a whole run leaves out)
    python -m benchmarks.store [--quick] ...        (one module alone, same options)

Every module exposes ``run(context) -> list[Figure]``. The suite prints one table and writes the figures
with the machine's description to ``<out>/<UTC timestamp>.json`` (default ``benchmarks/results/``,
which git ignores). A module that raises is reported as an error figure and the run exits 1; a figure
whose code has not landed is "n/a", which is not an error.
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

from .measure import Figure, cpu_count, failed, table

MODULES = ("store", "lifecycle", "throughput", "postgres", "soak")
# Modules `--only` also runs, left out of a whole run for their length: each builds logs of up to 2M events
# (the read side at 1M, the audit and rebuild, the timeline); each runs alone as `python -m benchmarks.NAME`.
LONG_MODULES = ("reads", "audit", "timeline")
# Modules that run for minutes whatever the mode (postgres: a cluster's start and a minute of rounds even
# when quick): --quick leaves them out unless --only names them.
NOT_QUICK = ("postgres", "soak")
RESULTS = Path(__file__).resolve().parent / "results"

Benchmark = Callable[["Context"], list[Figure]]


@dataclass
class Context:
    """What a benchmark module gets: the mode, a scratch directory, and logs already built this run."""

    quick: bool
    workdir: str
    logs: dict[int, str] = field(default_factory=dict)
    started: float = field(default_factory=time.monotonic)
    _serial: int = 0

    def path(self, name: str) -> str:
        """A fresh file path in the scratch directory."""
        self._serial += 1
        return os.path.join(self.workdir, f"{self._serial:03d}-{name}")

    def say(self, message: str) -> None:
        """Progress on stderr, so the table on stdout stays clean."""
        print(f"[{time.monotonic() - self.started:6.1f}s] {message}", file=sys.stderr, flush=True)


def _version(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def environment() -> dict[str, object]:
    """The machine and versions the figures were measured on."""
    import apsw

    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                cwd=Path(__file__).resolve().parent, check=False, timeout=10).stdout.strip()
    except OSError:
        commit = ""
    return {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "sqlite": apsw.sqlite_lib_version(),
        "apsw": apsw.apsw_version(),
        "msgspec": _version("msgspec"),
        "blake3": _version("blake3"),
        "eventsourcing": _version("eventsourcing"),
        "platform": platform.platform(),
        "cpus": cpu_count(),
        "commit": commit or None,
    }


def _load(name: str) -> Benchmark:
    module = importlib.import_module(f"benchmarks.{name}")
    return module.run  # type: ignore[no-any-return]


def _parse(argv: Sequence[str] | None, prog: str, whole_suite: bool) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="lifecycle-es benchmarks: ratios against baselines measured in the same run.")
    parser.add_argument("--quick", action="store_true", help="smaller logs and fewer rounds (under 2 minutes)")
    if whole_suite:
        parser.add_argument("--only", nargs="+", choices=MODULES + LONG_MODULES, metavar="NAME",
                            help=f"run only these modules ({', '.join(MODULES + LONG_MODULES)}; the last "
                                 f"{len(LONG_MODULES)} build logs of up to 2M events and run only when named)")
    parser.add_argument("--out", default=str(RESULTS), help="directory for the JSON figures (default: %(default)s)")
    parser.add_argument("--data-dir", default=None,
                        help="where the benchmark logs are built (default: a fresh temporary directory)")
    parser.add_argument("--keep-data", action="store_true", help="leave the built logs in place")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None, *, modules: dict[str, Benchmark] | None = None) -> int:
    """Run the chosen modules, print the table, write the JSON; 1 when a module raised."""
    prog = "python -m benchmarks" + ("" if modules is None else "." + ".".join(modules))
    args = _parse(argv, prog, whole_suite=modules is None)
    if modules is None:
        chosen = args.only or [name for name in MODULES if not (args.quick and name in NOT_QUICK)]
        modules = {name: _load(name) for name in chosen}
    parent = args.data_dir or None
    if parent:
        os.makedirs(parent, exist_ok=True)
    workdir = tempfile.mkdtemp(prefix="lifecycle-es-bench-", dir=parent)
    context = Context(quick=args.quick, workdir=workdir)
    env = environment()
    context.say(f"mode {'quick' if args.quick else 'full'}; logs in {workdir}")
    figures: list[Figure] = []
    try:
        for name, benchmark in modules.items():
            context.say(f"{name}: start")
            try:
                figures += benchmark(context)
            except Exception as exc:
                traceback.print_exc()
                figures.append(failed(f"{name}.error", f"{name} (raised)", f"{type(exc).__name__}: {exc}"))
            context.say(f"{name}: done")
    finally:
        if not args.keep_data:
            shutil.rmtree(workdir, ignore_errors=True)
    elapsed = time.monotonic() - context.started
    print(f"lifecycle-es benchmarks, {'quick' if args.quick else 'full'} mode, {env['date']}")
    print(f"Python {env['python']}, SQLite {env['sqlite']} (apsw {env['apsw']}), msgspec {env['msgspec']}, "
          f"blake3 {env['blake3']}, eventsourcing {env['eventsourcing'] or 'not installed'}; "
          f"{env['cpus']} CPUs, {env['platform']}")
    print()
    print(table(figures))
    print()
    print(f"total {elapsed:.1f} s")
    os.makedirs(args.out, exist_ok=True)
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%SZ")
    out = os.path.join(args.out, f"{stamp}.json")
    with open(out, "w", encoding="utf-8") as handle:
        json.dump({"mode": "quick" if args.quick else "full", "elapsed_s": round(elapsed, 1), "environment": env,
                   "figures": [figure.as_json() for figure in figures]}, handle, indent=2)
        handle.write("\n")
    print(f"figures written to {out}")
    return 1 if any(figure.status == "error" for figure in figures) else 0
