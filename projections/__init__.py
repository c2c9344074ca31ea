"""The read side of lifecycle-es: pure folds of the log, the fleet view, read models and rebuild.

- `replay`, `replay_all`, `state_at`, `states_at`, `runner_at`, `fleet`: folds of the log through the same
  rules the commands obey (``lifecycle_es.runner.apply``); state as of any seq, from proven snapshots
  and the tail after them where there are some.
- `attach(store)`: SQL read models ``runners`` and ``leases``, written in the event transaction.
- `rebuild(store)`: drop and rebuild snapshots and read models from the log alone.
"""

from lifecycle_es.receipts import project
from lifecycle_es.replay import fold, load
from lifecycle_es.runner import apply

from .fleet import FleetView, fleet, fleet_of, replay, replay_all, runner_at, state_at, states_at
from .read_models import (
    LEASE_COLUMNS,
    RUNNER_COLUMNS,
    ReadModels,
    attach,
    read_lease_rows,
    read_runner_rows,
)
from .rebuild import RebuildReport, rebuild

__all__ = [
    "LEASE_COLUMNS",
    "RUNNER_COLUMNS",
    "FleetView",
    "ReadModels",
    "RebuildReport",
    "apply",
    "attach",
    "fleet",
    "fleet_of",
    "fold",
    "load",
    "project",
    "read_lease_rows",
    "read_runner_rows",
    "rebuild",
    "replay",
    "replay_all",
    "runner_at",
    "state_at",
    "states_at",
]
