"""Worker processes: fresh interpreters fed on stdin, no __main__ guard needed, usable from a thread."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading

import pytest

from lifecycle_es.workers import WorkerError, Workers


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
