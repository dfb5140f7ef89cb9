"""The worker: :func:`run_worker` drives the due runs of one or more databases until stopped.

One package, one room per concern (docs/design.md, "Layers"); the worker is
composed of parts, each handed the checked :class:`WorkerSettings` and owning
its own state:

* :mod:`~jobrun.worker.serving`: :func:`run_worker`, and the worker that starts
  each database's tasks and ends them;
* :mod:`~jobrun.worker.settings`: the settings and the shared defaults;
* :mod:`~jobrun.worker.driving`: the drivers of each database and their idle waits;
* :mod:`~jobrun.worker.upkeep`: schedules, retention, health, warnings of strays;
* :mod:`~jobrun.worker.database`: one served database's idle waits and wake-ups;
* :mod:`~jobrun.worker.rounds`: the loop each part repeats per database;
* :mod:`~jobrun.worker.wakeups`: what wakes an idle database, and the bound on
  open SQLite databases;
* :mod:`~jobrun.worker.listen`: the LISTEN for new runs on Postgres;
* :mod:`~jobrun.worker.deaths`: an idle worker's look for dead holders;
* :mod:`~jobrun.worker.turns`: the set of databases, read again and served in turns;
* :mod:`~jobrun.worker.database_leases`: the serving lease behind those turns;
* :mod:`~jobrun.worker.registration`: the worker's row in each database;
* :mod:`~jobrun.worker.start`: the connection budget and the first read at start.
"""

from jobrun.worker.registration import DEFAULT_HEARTBEAT_S
from jobrun.worker.serving import Database, run_worker
from jobrun.worker.settings import (
    CONNECT_TIMEOUT_S,
    DEFAULT_INTERVAL_S,
    DEFAULT_MAX_CONNECTIONS_PER_DATABASE,
    FAILED_DRIVE_RETRY_S,
    MAX_SCHEDULE_SLEEP_S,
    PRUNE_INTERVAL_S,
    UNREGISTERED_CHECK_S,
    HealthCallback,
    WorkerSettings,
)
from jobrun.worker.wakeups import DEFAULT_MAX_OPEN_SQLITE

__all__ = [
    "CONNECT_TIMEOUT_S",
    "DEFAULT_HEARTBEAT_S",
    "DEFAULT_INTERVAL_S",
    "DEFAULT_MAX_CONNECTIONS_PER_DATABASE",
    "DEFAULT_MAX_OPEN_SQLITE",
    "FAILED_DRIVE_RETRY_S",
    "MAX_SCHEDULE_SLEEP_S",
    "PRUNE_INTERVAL_S",
    "UNREGISTERED_CHECK_S",
    "Database",
    "HealthCallback",
    "WorkerSettings",
    "run_worker",
]
