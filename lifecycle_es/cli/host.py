"""``lifecycle-es host`` and ``lifecycle-es demo``: the local host driver from the command line.

    lifecycle-es host runners.db --runner runner-1 [--runner runner-2 ...] [--mode child|systemd]
    lifecycle-es host runners.db --all [--target local]      every runner of that target based on this machine
    lifecycle-es demo [--dir DIR]                            the end-to-end demo

``host`` drives each runner under the runner's host lease (`hosts.serving`): a standby until it takes
the lease, then it follows the log and reconciles the runner's units on every new event and on a timer,
printing each action. Exit codes: 0 after SIGTERM/SIGINT (units keep running; the next holder adopts
them, and the leases are released so it need not wait), 75 when a lease was lost (another driver took
it, or it was not renewed in time: this process stopped acting at once), 76 with ``--no-wait`` when
another live driver holds a runner's lease. ``--log-format json`` prints one JSON object per line;
``--metrics 127.0.0.1:PORT`` serves Prometheus metrics; under systemd ``Type=notify`` it sends
``READY=1`` once serving and ``WATCHDOG=1`` while its loop runs. The runners must exist in the log; the
host takes their identity from there. Both commands import `hosts` inside their run functions only,
so the core never imports host code. With ``--sign KEY`` the host also signs a checkpoint of the log every
``--checkpoint-every`` events or ``--checkpoint-seconds`` seconds (`hosts.checkpointing`), and once more
when it stops.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from .access import read_signer, require_file
from .exits import EXIT_FENCED, EXIT_USAGE, CommandError, no_runner
from .options import int_at_least, runner_id, seconds

if TYPE_CHECKING:
    from .host_log import HostLog


def register(subparsers: Any) -> None:
    """Add the ``host`` and ``demo`` subcommands."""
    host = subparsers.add_parser(
        "host", help="run the local host driver for runners until SIGTERM/SIGINT",
        description="Follow the log and make this machine's units agree with it: start, signal, stop, park and "
                    "wake units, each side effect recorded as an event of the runner's stream, each runner "
                    "under its host lease. Exits 75 when a lease is lost, 76 with --no-wait when one is held.")
    host.add_argument("file", metavar="FILE", help="the store file")
    host.add_argument("-r", "--runner", action="append", type=runner_id, metavar="R", default=[],
                      help="a runner id (must exist in the log); repeat for several")
    host.add_argument("--all", action="store_true",
                      help="every runner of --target whose base dir is a directory on this machine")
    host.add_argument("--target", choices=("local", "wsl", "ssh", "container"), default="local",
                      help="with --all: the runners' target (local)")
    host.add_argument("--mode", choices=("child", "systemd"), default="child", help="how units run (child)")
    host.add_argument("--scope", choices=("system", "user"), default="system", help="systemd manager (system)")
    host.add_argument("--user", help="systemd system scope: the user units run as (required as root)")
    host.add_argument("--group", help="systemd system scope: the group units run as (default: the user's)")
    host.add_argument("--run-root", metavar="DIR", help="where run directories go (default: the runner's base dir)")
    host.add_argument("--stop-timeout-ms", type=int_at_least(0), default=30_000, metavar="MS",
                      help="SIGTERM to SIGKILL")
    host.add_argument("--park-threshold-ms", type=int_at_least(0), default=60_000, metavar="MS",
                      help="a unit whose work only waits longer than this is parked (0: never)")
    host.add_argument("--tick", type=seconds, default=1.0, metavar="S", help="reconcile at least this often")
    host.add_argument("--host-lease-ttl-ms", type=int_at_least(0), default=15_000, metavar="MS",
                      help="how long a host lease lives without a renewal (renewed every third of it; 15000)")
    host.add_argument("--host-lease-grace-ms", type=int_at_least(0), default=2_000, metavar="MS",
                      help="after taking over, wait the old lease's expiry plus this before touching units (2000)")
    host.add_argument("--no-wait", action="store_true",
                      help="exit 76 when another live driver holds a runner's host lease, instead of standing by")
    host.add_argument("--log-format", choices=("text", "json"), default="text",
                      help="text lines, or one JSON object per line (text)")
    host.add_argument("--metrics", metavar="ADDR:PORT",
                      help="serve Prometheus metrics on this address (e.g. 127.0.0.1:9464)")
    _add_checkpoint_options(host)
    host.set_defaults(run=run_host)

    demo = subparsers.add_parser(
        "demo", help="the end-to-end demo on real child processes, then an audit of its log",
        description="A runner's whole life, narrated: leases, units, a killed unit, proxy rotation, drain, "
                    "post-session hook, reclaim; then the audit of the log it wrote.")
    demo.add_argument("--dir", default="demo-run", help="where to write the log (default: ./demo-run)")
    demo.set_defaults(run=run_demo)


def _runner_ids(args: argparse.Namespace, store: Any) -> list[str]:
    """The runners to drive: those named, or with --all those of the target based on this machine."""
    from lifecycle_es.replay import load

    if args.all == bool(args.runner):
        raise CommandError(EXIT_USAGE, "name runners with --runner, or pass --all (not both)")
    if args.runner:
        return list(dict.fromkeys(args.runner))
    chosen = []
    for stream in store.streams():
        state = load(store, stream).state
        if state is not None and state.target == args.target and os.path.isdir(state.base_dir):
            chosen.append(stream)
    if not chosen:
        raise CommandError(EXIT_USAGE, f"no runner of target {args.target} with its base dir on this machine in "
                                       f"{args.file}")
    return chosen


def run_host(args: argparse.Namespace) -> int:
    """Serve the runners' units until SIGTERM or SIGINT (0), a lost lease (75) or, with --no-wait, a held one (76)."""
    from hosts.lease import holder_name
    from hosts.local import LocalHost
    from hosts.serving import HostServer
    from lifecycle_es.lifecycle import RunnerLifecycle
    from lifecycle_es.replay import load
    from lifecycle_es.store import EventStore

    from .host_log import HostLog
    from .notify import Notifier

    require_file(args.file)
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    log = HostLog(args.log_format)
    with EventStore.open(args.file) as store, _signing(args, log.report):
        lifecycles = []
        for runner in _runner_ids(args, store):
            state = load(store, runner).state
            if state is None:
                raise no_runner(runner, args.file)
            lifecycles.append(RunnerLifecycle(
                store, runner_id=state.runner_id, target=state.target, base_dir=state.base_dir,
                resources=state.resources, post_session_hook_digest=state.post_session_hook_digest))
        holder = holder_name()

        def make_host(lifecycle: RunnerLifecycle, keeper: Any) -> LocalHost:
            # The unit learns which driver and lease started it (no secret: the lease token is public).
            env = {"LIFECYCLE_ES_HOST_HOLDER": holder, "LIFECYCLE_ES_HOST_TOKEN": str(keeper.grant.token)}
            return LocalHost(lifecycle, mode=args.mode, scope=args.scope, run_root=args.run_root,
                             stop_timeout_ms=args.stop_timeout_ms, park_threshold_ms=args.park_threshold_ms,
                             user=args.user, group=args.group, env=env)

        server = HostServer(store, lifecycles, make_host=make_host, holder=holder,
                            ttl_ms=args.host_lease_ttl_ms, grace_ms=args.host_lease_grace_ms, tick=args.tick,
                            no_wait=args.no_wait, report=log.report, on_stuck=lambda _: _exit_fenced(log))
        metrics = None
        if args.metrics:
            from .metrics import HostMetrics

            metrics = HostMetrics.serve(args.metrics, server)
            log.observers.append(metrics.observe)
        notifier = Notifier.from_environment()
        runners = ", ".join(lifecycle.runner_id for lifecycle in lifecycles)
        log.report("serving", {"runners": runners, "mode": args.mode, "file": args.file, "holder": holder})
        code = server.run(stop, on_tick=_pinger(notifier))
        if metrics is not None:
            metrics.close()
        if notifier is not None:
            notifier.send("STOPPING=1")
    log.report("stopped", {"exit": code})
    return code


def _exit_fenced(log: HostLog) -> None:
    """Exit 75 now: a lease's deadline passed while the serving loop is blocked on the store (cut off from
    it), or was paused past it, so nothing may wait for that call to return. Units keep running for the next
    holder to adopt. The last line is "stopped", as on every other way out."""
    log.report("stopped", {"exit": EXIT_FENCED})
    sys.stdout.flush()
    os._exit(EXIT_FENCED)


def _pinger(notifier: Any) -> Any:
    """The loop's heartbeat for systemd: READY=1 at the first beat, WATCHDOG=1 every half watchdog timeout."""
    if notifier is None:
        return None
    interval = notifier.watchdog_interval()
    last = [0.0]

    def beat() -> None:
        now = time.monotonic()
        if last[0] == 0.0:
            notifier.send("READY=1")
        if interval is not None and (last[0] == 0.0 or now - last[0] >= interval):
            notifier.send("WATCHDOG=1")
        if last[0] == 0.0 or (interval is not None and now - last[0] >= interval):
            last[0] = now

    return beat


def _add_checkpoint_options(host: Any) -> None:
    host.add_argument("--sign", metavar="KEY", help="sign checkpoints of the log with this private key "
                                                    "(lifecycle-es keygen), appended to FILE.checkpoints")
    host.add_argument("--checkpoint-every", type=int_at_least(1), metavar="N",
                      help="with --sign: sign once N events were appended since the last (default 1000)")
    host.add_argument("--checkpoint-seconds", type=seconds, metavar="T",
                      help="with --sign: sign once T seconds passed since the last, if the log moved (default 60)")
    host.add_argument("--checkpoints", metavar="CP", help="with --sign: the checkpoint file (default FILE.checkpoints)")


@contextlib.contextmanager
def _signing(args: argparse.Namespace, report: Callable[[str, dict[str, Any]], None]) -> Iterator[None]:
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
            "on_checkpoint": lambda signed: report("checkpoint", {"seq": signed.seq}),
            "on_error": lambda exc: report("checkpoint-failed", {"error": str(exc)})})
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
