"""Worker processes: fresh interpreters fed on stdin, no __main__ guard needed, usable from a thread."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from lifecycle_es import EventStore
from lifecycle_es.workers import PARENT_GONE, WorkerError, Workers


def test_results_come_back_in_call_order() -> None:
    with Workers("lifecycle_es.canonical:iso_ms", [(0,), (1_000,), (86_400_000,)]) as workers:
        assert workers.results() == ["1970-01-01T00:00:00.000Z", "1970-01-01T00:00:01.000Z",
                                     "1970-01-02T00:00:00.000Z"]


def test_only_functions_of_the_package_may_be_named() -> None:
    with pytest.raises(WorkerError, match="not a function of lifecycle_es"):
        Workers("os:system", [("true",)])
    with pytest.raises(WorkerError, match="not a function"):
        Workers("lifecycle_es.canonical:MAX_EPOCH_MS", [()])


def test_a_worker_error_names_the_worker_and_the_cause() -> None:
    with Workers("lifecycle_es.values:safe_int", [(1, "a"), ("x", "field_b")]) as workers, \
            pytest.raises(WorkerError, match=r"worker 1 failed: InvalidInputError: field_b is invalid"):
        workers.results()


def test_a_killed_worker_is_reported_not_trusted() -> None:
    # A worker waits for its request, sent only by `results`: killed before, it has done nothing.
    with Workers("lifecycle_es.canonical:iso_ms", [(0,)]) as workers:
        for worker in workers._workers:
            worker.process.kill()
        with pytest.raises(WorkerError, match="killed by signal 9"):
            workers.results()


def test_begin_sends_the_requests_at_once_and_poll_does_not_wait() -> None:
    # After `begin` a worker works while its caller does something else: it is done before `results` is called.
    with Workers("lifecycle_es.canonical:iso_ms", [(0,), (1,)]) as workers:
        workers.begin()
        for worker in workers._workers:
            assert worker.process.wait(timeout=60) == 0
        assert workers.poll() == 0  # iso_ms reports no rows
        assert workers.results() == ["1970-01-01T00:00:00.000Z", "1970-01-01T00:00:00.001Z"]


def test_works_from_a_thread() -> None:
    found: list[object] = []

    def run() -> None:
        with Workers("lifecycle_es.canonical:iso_ms", [(0,)]) as workers:
            found.extend(workers.results())

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(60)
    assert found == ["1970-01-01T00:00:00.000Z"]


def test_works_from_a_plain_script_without_a_main_guard(tmp_path) -> None:
    script = tmp_path / "plain.py"
    script.write_text(textwrap.dedent("""
        from lifecycle_es.workers import Workers
        with Workers("lifecycle_es.canonical:iso_ms", [(0,), (1,)]) as workers:
            print(workers.results())
    """))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "['1970-01-01T00:00:00.000Z', '1970-01-01T00:00:00.001Z']"
    assert done.stderr == ""


def test_warnings_turned_into_errors_do_not_stop_a_worker() -> None:
    # PYTHONWARNINGS reaches the workers with the rest of the environment: a worker must start without a warning.
    done = subprocess.run([sys.executable, "-c", textwrap.dedent("""
        from lifecycle_es.workers import Workers
        with Workers("lifecycle_es.canonical:iso_ms", [(0,)]) as workers:
            print(workers.results())
    """)], capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONWARNINGS": "error"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "['1970-01-01T00:00:00.000Z']"


# A process that adopts orphans (a subreaper, as init would) starts a parent that starts a worker walking a log,
# stops the worker, kills the parent with SIGKILL (no cleanup runs), lets the worker go on, and reports how the
# orphaned worker ended.
ADOPTER = """
import ctypes, os, signal, subprocess, sys
assert ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0) == 0  # PR_SET_CHILD_SUBREAPER
parent = subprocess.Popen([sys.executable, "-c", sys.argv[1], *sys.argv[2:]], stdin=subprocess.PIPE,
                          stdout=subprocess.PIPE, text=True)
worker = int(parent.stdout.readline())
os.kill(worker, signal.SIGSTOP)
parent.stdin.write("send\\n")
parent.stdin.flush()
assert parent.stdout.readline() == "sent\\n"
parent.kill()
parent.wait()
os.kill(worker, signal.SIGCONT)
print(os.waitstatus_to_exitcode(os.waitpid(worker, 0)[1]))
"""
PARENT = """
import sys
from lifecycle_es.workers import Workers
path, head = sys.argv[1], int(sys.argv[2])
with Workers("lifecycle_es.walk:walk_share", [(path, None, head, 1, head, 0, 1, None, ())]) as workers:
    worker = workers._workers[0]
    print(worker.process.pid, flush=True)
    sys.stdin.readline()
    worker.process.stdin.write(worker.request)  # the request `begin` sends, sent here to know when it went
    worker.process.stdin.close()
    print("sent", flush=True)
    sys.stdin.readline()  # killed here
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="adopting orphans (a subreaper) is Linux's")
def test_a_worker_whose_parent_died_stops_at_its_next_page(interleaved_log: Path) -> None:
    # Its walk has pages to go when it learns the parent is gone: it stops there, not after walking them and
    # failing to send a result nobody reads.
    with EventStore.open(interleaved_log, read_only=True) as store:
        head = store.head().seq
    done = subprocess.run([sys.executable, "-c", ADOPTER, PARENT, str(interleaved_log), str(head)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) == PARENT_GONE, done.stderr
