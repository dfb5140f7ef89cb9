"""A worker's start on a database: its connection budget, and a first read that waits.

Kept apart from ``jobrun.worker`` so that each module stays short. Before its
drivers start, the worker checks each database's schema and reads its health
once. A store that fails then (a pooler still queueing clients, a server
starting or failing over) is tried again with a doubling delay, as every later
call is; only an answer that will not change by waiting (no schema, a schema
too old or too new) ends the worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from sqlalchemy.ext.asyncio import AsyncEngine

from jobrun._api import job_run_health
from jobrun._core import Clock
from jobrun.errors import StoreError
from jobrun.sql.postgres.kept_connections import keep_at_most
from jobrun.worker.database import ServedDatabase

log = logging.getLogger("jobrun.worker")

FIRST_RETRY_S = 0.05
"""The first wait after a failed first read; it doubles up to the worker's interval."""


def keep_on_given(engine: AsyncEngine, keep: int) -> None:
    """The connection budget holds on an engine handed in too: its pool's size is the
    host's to choose, what jobrun keeps out of it is ``max_connections_per_database``."""
    if engine.dialect.name == "postgresql":
        keep_at_most(engine, keep)


async def first_read(
    database: ServedDatabase, clock: Clock, stop: asyncio.Event, interval_s: float
) -> None:
    """The schema check and a first health read of ``database``, tried again while the
    store fails; returns once read, or once ``stop`` is set. Raises what waiting
    cannot mend (``SchemaOutdatedError``, ``CodeOutdatedError``)."""
    delay_s = FIRST_RETRY_S
    warned_at: float | None = None
    while not stop.is_set():
        try:
            await job_run_health(database.store)
            return
        except StoreError as error:
            now = clock.monotonic()
            # A warning when the failures begin and once per interval after.
            loud = warned_at is None or now - warned_at >= interval_s
            if loud:
                warned_at = now
            log.log(
                logging.WARNING if loud else logging.DEBUG,
                "reaching %s at start failed: %s; trying again in %.2f s",
                database.label,
                error,
                delay_s,
                extra={"database": database.label},
            )
        with contextlib.suppress(TimeoutError):
            async with clock.timeout(delay_s):
                await stop.wait()
        delay_s = min(interval_s, delay_s * 2)
