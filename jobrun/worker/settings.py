"""What a worker was told: checked once by :func:`jobrun.run_worker`, then read by each part.

The worker's parts (its drivers, their upkeep, the LISTEN, the set of databases)
each get these settings and own their state: nothing here changes once the
worker runs. The defaults and intervals that ``run_worker`` and ``jobrun
worker`` share live here too.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

from jobrun._core import Clock, DriveOptions, JobRegistry, JobRunHealth

DEFAULT_INTERVAL_S = 5.0
# How often each database is asked for due runs of jobs this worker does not
# register (never less than the interval): a read of its own, so the claim,
# and an idle database's one claim per interval, stay as they are.
UNREGISTERED_CHECK_S = 60.0
DEFAULT_MAX_CONNECTIONS_PER_DATABASE = 2
"""Connections jobrun keeps out at once per Postgres database, on the worker's own
engines and on those handed in (the presence's own connection comes on top)."""
CONNECT_TIMEOUT_S = 10
FAILED_DRIVE_RETRY_S = 1.0
"""How soon a driver whose drive failed tries again (never later than the interval)."""
PRUNE_INTERVAL_S = 600.0
"""Retention runs at start and then every ten minutes: pruning is never urgent."""
MAX_SCHEDULE_SLEEP_S = 60.0
"""The scheduler looks again at least this often (a clock that jumps is noticed)."""

HealthCallback = Callable[[str, JobRunHealth], None]


@dataclass(frozen=True)
class WorkerSettings:
    """One worker's checked arguments (see :func:`jobrun.run_worker` for each)."""

    registry: JobRegistry
    options: DriveOptions
    interval_s: float
    concurrency: int
    on_health: HealthCallback | None
    stop: asyncio.Event
    clock: Clock
    driver_name: str
    prune_after: timedelta | None
    prune_unregistered_after: timedelta | None
    max_open_sqlite: int
    max_databases: int | None
    heartbeat_s: float
    schema: str | None
