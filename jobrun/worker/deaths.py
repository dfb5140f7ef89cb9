"""An idle worker's look for dead holders (a helper of :mod:`jobrun.worker`).

A leased run comes due only when its lease expires, so a worker that sleeps until
its database's next due instant would wait out a dead holder's whole lease: the
proof of death is found by the claim's scan (``jobrun._core.leases.proof_of_death``), and an
idle worker does not claim. So, while another process holds a lease of this
worker's jobs on a database, its idle driver reads those leases itself every
``orphans.IDLE_LOOK_S`` (SQLite: a stdlib connection, as the next-due read;
Postgres: one round trip on the presence session, with whether each holder's
presence lock is held), judges them by the claim's own rules, and drives the
database as soon as one holder is proven dead. The claim that follows takes that
run first on the very same proof (the look is remembered as the store's scan).
"""

from __future__ import annotations

import logging

from jobrun._core import Clock, HeldLease, Host, JobRegistry, format_instant, lease_instants
from jobrun._core import proof_of_death as orphans
from jobrun.sql.next_due import sqlite_held_leases
from jobrun.worker.database import ServedDatabase

log = logging.getLogger("jobrun.worker")


def jobs_of(registry: JobRegistry) -> orphans.Jobs:
    """The jobs a claim of ``registry`` asks for: the key of the store's scan of them."""
    return frozenset((job.module_id, job.name) for job in registry)


async def dead_holder_seen(
    database: ServedDatabase, jobs: orphans.Jobs, clock: Clock, host: Host, *, listens: bool
) -> tuple[bool, bool]:
    """Whether a run of ``jobs`` on ``database`` is leased by a holder proven dead
    (``host`` judges pids), looking again first when the last look is old; and
    whether a look was owed but refused as too soon (the driver then waits no longer
    than until the next look is allowed: see ``orphans.look_again_in_s``).

    ``listens``: the database is Postgres through asyncpg, with a presence session
    to read on. A look that fails says dead: the drive that follows looks too, and
    reports what is wrong the usual way."""
    store = database.store
    now_s = clock.monotonic()
    if not orphans.look_due(store, jobs, now_s):
        return orphans.dead_known(store, jobs), True
    # Judged as the claim judges expiries (a wall-clock step cannot fool it).
    judged, _ = lease_instants(clock)
    try:
        leases = await _held_leases(database, format_instant(judged), jobs, listens)
    except Exception as error:
        log.debug("reading the leases held on %s failed: %s", database.label, error)
        return True, False
    return bool(orphans.judge_leases(store, jobs, leases, now_s=now_s, host=host)), False


async def _held_leases(
    database: ServedDatabase, now_at: str, jobs: orphans.Jobs, listens: bool
) -> list[HeldLease]:
    if database.path is not None:
        # Every change to a lease is a write to the file, which inotify reports: with
        # none since the last read, its leases stand (and the pid checks are local).
        # (A lease that expired meanwhile comes due, and its timer wakes the driver.)
        seen, cached = database.writes_seen, database.leases_read
        if database.watched and cached is not None and cached[0] == seen:
            return cached[1]
        leases = sqlite_held_leases(database.path, now_at, jobs)
        database.leases_read = (seen, leases)
        return leases
    if listens:
        return await database.store.held_leases_on_presence(now_at, jobs)
    return await database.store.held_leases(now_at, jobs)
