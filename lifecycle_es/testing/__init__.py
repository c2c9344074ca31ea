"""Property-testing kit for hosts that embed lifecycle-es.

This package needs hypothesis installed (the ``testing`` extra: ``pip install 'lifecycle-es[testing]'``);
the library itself never imports it.

- `FakeClock`, `SequentialIds`: the injected clock and id source, under the test's control.
- Value strategies: `ids`, `digests`, `resources`, `proxy_authorities` (fresh at a given time).
- `ReferenceRunner`: an independent in-memory model of the runner lifecycle this library re-implements
  (a JavaScript original that kept each runner in one JSON file), written from that source, not from
  ``lifecycle_es.runner``: a dict state shaped like its JSON file, its checks in its order, the commands
  and keyword names of `RunnerLifecycle`, the same error kinds, and the events each command appends.
- `command_programs`, `run_program`: random command programs checked against the model;
  `event_logs`, `invalid_event_logs`: logs a runner's stream could hold, and logs that break a rule
  at a known event.

    from hypothesis import given
    from lifecycle_es import EventStore, RunnerLifecycle
    from lifecycle_es.preflight import preflight_writable_directory
    from lifecycle_es.testing import (RUNNER_DEFAULTS, FakeClock, ReferenceRunner, SequentialIds,
                                      command_programs, run_program)

    @given(command_programs(invalid=True))
    def test_the_library_agrees_with_the_model(program):   # base_dir: an existing directory
        model_clock, clock = FakeClock(), FakeClock()
        with EventStore.open(db_path(), now=clock) as store:
            model = ReferenceRunner(**RUNNER_DEFAULTS, base_dir=base_dir, now=model_clock,
                                    authority_file=store.path)
            real = RunnerLifecycle(store, **RUNNER_DEFAULTS, base_dir=base_dir, now=clock,
                                   random_id=SequentialIds(), preflight_base_dir=preflight_writable_directory)
            assert run_program(real, clock, program) == run_program(model, model_clock, program)

Where the original coerces a value with ``Number()`` or compares an unchecked string, the library refuses
a malformed value (a bool, a float, a generation below 1, an id outside the pattern) as
InvalidInputError; the model does the same. The model has no file system: it runs no base directory
preflight and draws no probe names from ``random_id``, so pair it with a lifecycle whose
``preflight_base_dir`` draws none either (the default preflight function called without one does not).
"""

from __future__ import annotations

try:
    import hypothesis  # noqa: F401 - every module below needs it; say so once, here
except ImportError as exc:  # pragma: no cover - the message is the documentation
    raise ImportError("lifecycle_es.testing needs hypothesis: pip install 'lifecycle-es[testing]'") from exc

from .clock import START_MS, FakeClock, SequentialIds
from .logs import event_logs, invalid_event_logs
from .model import COMMANDS, ReferenceRunner
from .programs import RUNNER_DEFAULTS, Command, command_programs, run_program
from .values import digests, ids, proxy_authorities, resources

__all__ = [
    "COMMANDS",
    "RUNNER_DEFAULTS",
    "START_MS",
    "Command",
    "FakeClock",
    "ReferenceRunner",
    "SequentialIds",
    "command_programs",
    "digests",
    "event_logs",
    "ids",
    "invalid_event_logs",
    "proxy_authorities",
    "resources",
    "run_program",
]
