"""``lifecycle-es host`` and ``lifecycle-es demo``: the local host driver from the command line.

    lifecycle-es host runners.db --runner runner-1 [--mode child|systemd]   serve until SIGTERM/SIGINT
    lifecycle-es demo [--dir DIR]                                           the end-to-end demo

``host`` follows the log and reconciles the runner's units on every new event and on a timer,
printing each action; SIGTERM or SIGINT stops it cleanly (units keep running: a host started again
finds them through the log). The runner must exist in the log; the host takes its identity from
there. Both import `hosts` inside their run functions only, so the core never imports host code.
With ``--sign KEY`` the host also signs a checkpoint of the log every ``--checkpoint-every`` events or
``--checkpoint-seconds`` seconds (`hosts.checkpointing`), and once more when it stops.
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
import threading
from collections.abc import Iterator
from typing import Any

from .access import read_signer, require_file
from .exits import EXIT_OK, EXIT_USAGE, CommandError, no_runner, printable
from .options import runner_id


def register(subparsers: Any) -> None:
    """Add the ``host`` and ``demo`` subcommands."""
    host = subparsers.add_parser(
        "host", help="run the local host driver for one runner until SIGTERM/SIGINT",
        description="Follow the log and make this machine's units agree with it: start, signal, stop, park and "
                    "wake units, each side effect recorded as an event of the runner's stream.")
    host.add_argument("file", metavar="FILE", help="the store file")
    host.add_argument("-r", "--runner", required=True, type=runner_id, metavar="R",
                      help="the runner id (must exist in the log)")
    host.add_argument("--mode", choices=("child", "systemd"), default="child", help="how units run (child)")
    host.add_argument("--scope", choices=("system", "user"), default="system", help="systemd manager (system)")
    host.add_argument("--user", help="systemd system scope: the user units run as (required as root)")
    host.add_argument("--group", help="systemd system scope: the group units run as (default: the user's)")
    host.add_argument("--run-root", metavar="DIR", help="where run directories go (default: the runner's base dir)")
    host.add_argument("--stop-timeout-ms", type=int, default=30_000, metavar="MS", help="SIGTERM to SIGKILL")
    host.add_argument("--park-threshold-ms", type=int, default=60_000, metavar="MS",
                      help="a unit whose work only waits longer than this is parked (0: never)")
    host.add_argument("--tick", type=float, default=1.0, metavar="S", help="reconcile at least this often")
    _add_checkpoint_options(host)
    host.set_defaults(run=run_host)

    demo = subparsers.add_parser(
        "demo", help="the end-to-end demo on real child processes, then an audit of its log",
        description="A runner's whole life, narrated: leases, units, a killed unit, proxy rotation, drain, "
                    "post-session hook, reclaim; then the audit of the log it wrote.")
    demo.add_argument("--dir", default="demo-run", help="where to write the log (default: ./demo-run)")
    demo.set_defaults(run=run_demo)


def run_host(args: argparse.Namespace) -> int:
    """Serve the runner's units until SIGTERM or SIGINT."""
    from hosts.local import LocalHost
    from lifecycle_es.lifecycle import RunnerLifecycle
    from lifecycle_es.replay import load
    from lifecycle_es.store import EventStore

    require_file(args.file)
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    with EventStore.open(args.file) as store, _signing(args):
        state = load(store, args.runner).state
        if state is None:
            raise no_runner(args.runner, args.file)
        lifecycle = RunnerLifecycle(store, runner_id=state.runner_id, target=state.target, base_dir=state.base_dir,
                                    resources=state.resources, post_session_hook_digest=state.post_session_hook_digest)
        host = LocalHost(lifecycle, mode=args.mode, scope=args.scope, run_root=args.run_root,
                         stop_timeout_ms=args.stop_timeout_ms, park_threshold_ms=args.park_threshold_ms,
                         user=args.user, group=args.group)
        print(f"lifecycle-es host: serving {args.runner} ({args.mode} mode) from {args.file}; SIGTERM stops",
              flush=True)

        def report(actions: list[Any]) -> None:
            for action in actions:
                print(printable(f"{action.kind} {action.lease_id} {action.detail}".rstrip()), flush=True)

        try:
            host.serve(stop, tick=args.tick, on_actions=report)
        finally:
            host.close()
    print("lifecycle-es host: stopped", flush=True)
    return EXIT_OK


def _add_checkpoint_options(host: Any) -> None:
    host.add_argument("--sign", metavar="KEY", help="sign checkpoints of the log with this private key "
                                                    "(lifecycle-es keygen), appended to FILE.checkpoints")
    host.add_argument("--checkpoint-every", type=int, metavar="N",
                      help="with --sign: sign once N events were appended since the last (default 1000)")
    host.add_argument("--checkpoint-seconds", type=float, metavar="T",
                      help="with --sign: sign once T seconds passed since the last, if the log moved (default 60)")
    host.add_argument("--checkpoints", metavar="CP", help="with --sign: the checkpoint file (default FILE.checkpoints)")


@contextlib.contextmanager
def _signing(args: argparse.Namespace) -> Iterator[None]:
    """With --sign, a thread that signs checkpoints on its own read-only connection while the host serves,
    and the head once more after the host stopped (so its last events are vouched for too)."""
    options = (args.checkpoint_every, args.checkpoint_seconds, args.checkpoints)
    if args.sign is None:
        if any(option is not None for option in options):
            raise CommandError(EXIT_USAGE, "--checkpoint-every, --checkpoint-seconds and --checkpoints need --sign")
        yield
        return
    from hosts.checkpointing import DEFAULT_EVERY, DEFAULT_SECONDS, Checkpointer
    from lifecycle_es.store import EventStore

    signer = read_signer(args.sign)
    every = args.checkpoint_every if args.checkpoint_every is not None else (
        None if args.checkpoint_seconds is not None else DEFAULT_EVERY)
    seconds = args.checkpoint_seconds if args.checkpoint_seconds is not None else (
        None if args.checkpoint_every is not None else DEFAULT_SECONDS)
    with EventStore.open(args.file, read_only=True) as reader:
        checkpointer = Checkpointer(reader, signer, every=every, seconds=seconds, path=args.checkpoints)
        done = threading.Event()
        thread = threading.Thread(target=checkpointer.serve, args=(done,), name="checkpointer", kwargs={
            "on_checkpoint": lambda signed: print(f"checkpoint seq {signed.seq} signed", flush=True),
            "on_error": lambda exc: print(printable(f"lifecycle-es host: cannot sign a checkpoint: {exc}"),
                                          file=sys.stderr, flush=True)})
        thread.start()
        try:
            yield
        finally:
            done.set()
            thread.join()


def run_demo(args: argparse.Namespace) -> int:
    """Run the demo (hosts.demo) and return the audit's exit code."""
    from hosts.demo import main as demo_main

    sys.stdout.flush()
    return demo_main(["--dir", args.dir])
