"""The ``lifecycle-es`` command: audit, show, follow, draw, rebuild, seal, export and import a log file.

    lifecycle-es audit FILE [--seal SEAL] [-k KEY_FILE] [--trust PUB [--checkpoints CP]] [--json] [--jobs N]
                      [--html OUT.html]
    lifecycle-es show FILE [RUNNER] [--at SEQ] [-k KEY_FILE] [-j]
    lifecycle-es events FILE [-r R] [--after SEQ] [--since T] [--until T] [-n N|all] [-f] [-j]
    lifecycle-es timeline FILE [-r R ...] [--since T] [--until T] [-n N] -o OUT.svg
    lifecycle-es rebuild FILE [-k KEY_FILE] [--jobs N]
    lifecycle-es seal FILE [-k KEY_FILE] [--no-verify] [--sign KEY [--checkpoints CP]]
    lifecycle-es keygen FILE [--name NAME]
    lifecycle-es export FILE OUT.jsonl [--checkpoints CP]
    lifecycle-es import IN.jsonl FILE [-k KEY_FILE]
    lifecycle-es host FILE -r R [--mode child|systemd] [--sign KEY [--checkpoint-every N] [--checkpoint-seconds T]]
    lifecycle-es demo [--dir DIR]

The short options mean the same wherever they appear: ``-r`` a runner, ``-k`` a key file, ``-j`` JSON
output (not on ``audit``, where ``-j`` would read as make's jobs), ``-n`` how many of the last, ``-f``
follow, ``-o`` the output file. A runner the log does not have is exit 66 with one message
(`exits.no_runner`), whichever command named it.

Subcommands live in modules of this package, listed in `COMMAND_MODULES`; each exposes
``register(subparsers)``, which adds its parsers with ``set_defaults(run=...)``. A new command group
(the host driver's, the demo) is one more module and one more name in that list. Importing this
package imports neither ``projections`` nor ``hosts``: a command module imports what it needs inside
its ``run`` function, so the core's import graph stays one-way and the command starts fast.

Exit codes are sysexits (see ``exits.py``); every error becomes one line on stderr and its code,
never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence
from typing import NoReturn

from lifecycle_es._version import __version__

from .exits import EXIT_OK, EXIT_USAGE, classify, printable

__all__ = ["COMMAND_MODULES", "ArgumentParser", "build_parser", "main"]

PROG = "lifecycle-es"

# The registry: modules of this package that add subcommands, in the order --help lists them.
COMMAND_MODULES: list[str] = ["audit", "show", "events", "timeline", "maintenance", "keys", "transfer", "host"]


class ArgumentParser(argparse.ArgumentParser):
    """argparse, but a usage error exits 64 (EX_USAGE) as sysexits says, not argparse's 2, and is escaped."""

    def error(self, message: str) -> NoReturn:
        """Print the usage and the error on stderr, then exit 64. The error is escaped (`exits.printable`):
        argparse quotes arguments it did not expect as they are, and a glob can pass file names others chose."""
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {printable(message)}\n")


def build_parser() -> ArgumentParser:
    """The whole command line: every registered module's subcommands."""
    parser = ArgumentParser(prog=PROG, description="Audit and inspect lifecycle-es event logs.")
    parser.add_argument("-V", "--version", action="version", version=f"{PROG} {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMAND_MODULES:
        importlib.import_module(f"{__name__}.{name}").register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line with `argv` (default: ``sys.argv[1:]``); return the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        code = int(args.run(args))
        sys.stdout.flush()
    except BrokenPipeError:
        # The reader went away (``| head``): what it read was whole, and there is no one left to tell.
        _silence_stdout()
        return EXIT_OK
    except BaseException as exc:  # the boundary: one line and an exit code, never a traceback
        if isinstance(exc, SystemExit):
            raise
        code, message = classify(exc)
        sys.stderr.write(f"{PROG} {args.command}: error: {message}\n")
        return code
    return code


def _silence_stdout() -> None:
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass
