"""The one definition of jobrun's tables; both dialects' DDL is emitted from it.

Alembic revisions must produce exactly this (a test compares them on both
dialects). Everything is TEXT and INTEGER: timestamps are fixed-shape text so
that due-ness is a string comparison that means the same on every engine.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    BigInteger,
    Column,
    Index,
    Integer,
    MetaData,
    Table,
    Text,
    func,
    literal_column,
    text,
)

SCHEMA_REVISION = "0011"
"""The Alembic head this code needs; a test checks it against the migrations."""

VERSION_TABLE = "jobrun_alembic_version"
"""jobrun's own Alembic version table, so a host's ``alembic_version`` is never touched."""

COMPAT_TABLE = "jobrun_schema_compat"
"""Revision 0006: one row, ``oldest_code_revision``, the oldest jobrun code revision
that may still run against the database (written by the revisions, read by
:mod:`jobrun.sql.upgrades.compat`). Like the version table, outside :data:`metadata`."""

metadata = MetaData()

LIVE_ONLY = text("status = 'running'")

job_runs = Table(
    "_substrat_job_runs",
    metadata,
    Column("id", Text, primary_key=True),
    Column("module_id", Text, nullable=False),
    Column("job", Text, nullable=False),
    Column("instance", Text, nullable=False),
    Column("payload", Text, nullable=False),
    Column("status", Text, nullable=False),
    Column("cursor", Text, nullable=True),
    Column("counters", Text, nullable=False, server_default=text("'{}'")),
    Column("attempts", Integer, nullable=False, server_default=text("0")),
    Column("last_error", Text, nullable=True),
    Column("started_at", Text, nullable=False),
    Column("updated_at", Text, nullable=False),
    Column("next_attempt_at", Text, nullable=True),
    Column("ended_at", Text, nullable=True),
    # The lease (revision 0002). Not indexed: renewals must stay cheap. While a
    # run is leased, next_attempt_at holds the lease's expiry.
    Column("lease_owner", Text, nullable=True),
    Column("lease_driver", Text, nullable=True),
    Column("lease_began_at", Text, nullable=True),
    Column("lease_takeovers", Integer, nullable=False, server_default=text("0")),
    # Revision 0003: higher is claimed first among due runs.
    Column("priority", Integer, nullable=False, server_default=text("0")),
    # Revision 0004: the fence for the outside world. The epoch grows with every
    # claim and every lease handed on; passes_committed numbers the passes (the
    # idempotency keys'). Defaulted, so a writer that does not know them still inserts.
    Column("lease_epoch", Integer, nullable=False, server_default=text("0")),
    Column("passes_committed", Integer, nullable=False, server_default=text("0")),
    # Revision 0005: the passes deferred in a row (a handler raised RetryAfter),
    # set back to 0 by a commit or a failure, and the last deferral's reason.
    Column("deferrals", Integer, nullable=False, server_default=text("0")),
    Column("deferred_reason", Text, nullable=True),
    # Revision 0006: the version of the job's code that last committed the run
    # (NULL: 1, also before the first commit). A driver never claims a run of a
    # version newer than its own code; a newer one upgrades the cursor first.
    Column("job_version", Integer, nullable=True),
    # Revision 0006: 1 when an operator cancelled the run (it ended failed by hand);
    # a resume sets it back to 0. See jobrun._core.model.predicates.is_cancelled.
    Column("cancelled", Integer, nullable=False, server_default=text("0")),
    # Revision 0006: where the last failure was raised ("file:line in function"),
    # kept apart so last_error's "Type: message" text stays as it was.
    Column("error_origin", Text, nullable=True),
    # Revision 0009: when an operator paused the run (NULL: not paused), and why. A
    # paused run stays live but is never claimed; one that no lease holds waits at
    # a due instant no clock reaches (jobrun._core.model.predicates.PARKED_AT), so every
    # read of due runs passes over it by the index alone.
    Column("paused_at", Text, nullable=True),
    Column("pause_reason", Text, nullable=True),
    # Revision 0010 (SQLite): a lease's expiry on its host's boot clock, which no
    # wall-clock step moves: the boot clock's name with the lease's token
    # (jobrun._core.model.records.BootInstant.lease_id) and the clock's reading at
    # the expiry, in milliseconds (64 bits: a 32-bit column would overflow after 24
    # days of uptime). NULL with no lease, and always on Postgres (its own clock
    # judges there; never written).
    Column("lease_boot_id", Text, nullable=True),
    Column("lease_boot_expires_ms", BigInteger, nullable=True),
    Index("_substrat_job_runs_key", "module_id", "job", "instance", "id"),
    # One LIVE run per key, enforced by the database so that concurrent starters on
    # any number of hosts cannot both insert; finished runs are outside the index,
    # so a key can be started again after its run is done or failed.
    Index(
        "_substrat_job_runs_live_key",
        "module_id",
        "job",
        "instance",
        unique=True,
        sqlite_where=LIVE_ONLY,
        postgresql_where=LIVE_ONLY,
    ),
)

# The claim's orders (revision 0011), one range per job and live runs only. A
# claim reads, for each job it asks for, the front of that job's range (priority
# first, or by age), so it stops at its first fits whatever else is queued, and
# finished runs are kept out of both indexes.
#
# The job is keyed as ``substr(module_id, 1)`` and ``substr(job, 1)`` (the same
# values, spelled alike by both engines) so that the claim's filter on them can use
# these indexes only. Postgres, without statistics for a table that has just been
# filled (a batch of starts before the first analyze) or with statistics from before
# a burst, estimates one row for any equality on module_id and job, and would take
# the key or status index and sort every live run of the job on each claim: a claim
# that costs the size of the queue. No other index is keyed on these expressions,
# so the plan is the same with or without statistics, on both engines.


def due_at_of(runs: Any) -> Any:
    """The due instant of the runs table ``runs`` (its columns, or an alias's): the SQL
    of ``jobrun._core.model.predicates.due_at``, spelled only here, since the index below
    must be keyed on the very expression the statements order and compare by."""
    return func.coalesce(runs.next_attempt_at, runs.started_at)


def claim_key_of(runs: Any) -> tuple[Any, Any]:
    """The job of a run as the claim indexes key it (see the comment above): spelled
    only here, since a claim must compare the very expressions the indexes hold."""
    first: Any = literal_column("1")
    return func.substr(runs.module_id, first), func.substr(runs.job, first)


DUE_AT = due_at_of(job_runs.c)
CLAIM_KEY = claim_key_of(job_runs.c)
Index(
    "_substrat_job_runs_claim_order",
    *CLAIM_KEY,
    job_runs.c.priority.desc(),
    DUE_AT,
    job_runs.c.id,
    sqlite_where=LIVE_ONLY,
    postgresql_where=LIVE_ONLY,
)

# The order of the claims that go by age (one in FAIR_EVERY, see
# jobrun._core.rules.fair_turns): when each run became due, then id, priority
# ignored. Its own index, so those claims too read an index front to back and stop
# at the first fit instead of sorting the due runs.
#
# Its predicate adds a condition every row meets (priority is NOT NULL) that only
# the by-age claim names: the priority claim cannot use this index. Without that,
# SQLite (no statistics) prefers it for the priority claim too, for its range on
# the due instant, and sorts every due run by priority on each claim.
BY_AGE_ONLY = text("priority IS NOT NULL")
LIVE_BY_AGE_ONLY = text(f"{LIVE_ONLY.text} AND {BY_AGE_ONLY.text}")
Index(
    "_substrat_job_runs_due_order",
    *CLAIM_KEY,
    DUE_AT,
    job_runs.c.id,
    sqlite_where=LIVE_BY_AGE_ONLY,
    postgresql_where=LIVE_BY_AGE_ONLY,
)

# The runs leased now, by job: what a per-job concurrency limit counts. Partial,
# so it holds only the passes in flight however long the queue or the history.
LEASED_ONLY = text("lease_owner IS NOT NULL")
Index(
    "_substrat_job_runs_leased",
    job_runs.c.module_id,
    job_runs.c.job,
    sqlite_where=LEASED_ONLY,
    postgresql_where=LEASED_ONLY,
)

# The console's runs page, newest first under any filter, with a million
# finished runs kept: each index ends in id, so a page reads one id-ordered range
# and stops at its limit, "started since" is an id range (RunQuery), and a count
# per status seeks instead of scanning. Within one job, by status; across jobs, by
# status. A page without a status reads each status's range and merges them.
# They cost a start one index entry each, and a finish (status changes) a move
# each; pass commits change none of these columns.
Index(
    "_substrat_job_runs_job_status",
    job_runs.c.module_id,
    job_runs.c.job,
    job_runs.c.status,
    job_runs.c.id,
)
Index("_substrat_job_runs_status", job_runs.c.status, job_runs.c.id)
# Revision 0006: the activity chart counts runs finished per minute and hour from
# a range of ended_at (status in the key: failed ones counted from the index; the
# job too, so one job's chart reads the index alone instead of a table row per
# finished run of the day).
Index(
    "_substrat_job_runs_ended",
    job_runs.c.ended_at,
    job_runs.c.status,
    job_runs.c.module_id,
    job_runs.c.job,
)
# Revision 0006: the instance prefix filter without a job reads a range of
# instance (on a bytewise collation: see jobrun.sql.store.browse).
Index("_substrat_job_runs_instance", job_runs.c.instance, job_runs.c.id)

job_schedules = Table(
    "_substrat_job_schedules",
    metadata,
    # A schedule's key: its job and, for schedules whose runs share one instance,
    # that instance ('' when each slot's run has the slot's instant as instance).
    Column("module_id", Text, primary_key=True),
    Column("job", Text, primary_key=True),
    Column("schedule", Text, primary_key=True),
    # The newest slot started, or the instant the schedule was first seen: the
    # one value that moves forward only, compared and set in one conditional
    # write, so each slot is started by one caller exactly.
    Column("last_slot_at", Text, nullable=False),
    Column("last_run_id", Text, nullable=True),
    Column("updated_at", Text, nullable=False),
    # Revision 0005: the cron whose slots last_slot_at counts. A registry with
    # another cron (or a row from before 0005: NULL) starts again from "now", so
    # slots of an older cron are never replayed under a newer one.
    Column("cron", Text, nullable=True),
)

# Revision 0005: each job's own retention (keep_for), as the workers registering
# it last said, so that a worker that does not register the job still spares its
# runs when told to prune unregistered jobs.
job_retention = Table(
    "_substrat_job_retention",
    metadata,
    Column("module_id", Text, primary_key=True),
    Column("job", Text, primary_key=True),
    Column("keep_for_s", Integer, nullable=False),
    Column("updated_at", Text, nullable=False),
)

job_steps = Table(
    "_substrat_job_steps",
    metadata,
    Column("run_id", Text, primary_key=True),
    Column("step", Text, primary_key=True),
    Column("result", Text, nullable=True),
    Column("attempts", Integer, nullable=False, server_default=text("0")),
    Column("last_error", Text, nullable=True),
    Column("recorded_at", Text, nullable=False),
)

# -- Revision 0005: rate and concurrency limits (jobrun._core.limits.declarations) -----------------

rate_buckets = Table(
    "_substrat_rate_buckets",
    metadata,
    Column("limit_key", Text, primary_key=True),
    # The declaration the last take was made under, kept for health: the rate as
    # decimal text (a float), the burst in whole tokens.
    Column("per_second", Text, nullable=False),
    Column("burst", Integer, nullable=False),
    # Thousandths of a token; below zero, tokens already promised to waiting takers.
    Column("milli_tokens", Integer, nullable=False),
    # The database's clock at the last refill, fixed-shape instant text; later
    # than now while the limit cools down (nothing refills before it).
    Column("refilled_at", Text, nullable=False),
    # Revision 0008: a RetryAfter(rate_limit=) holds the bucket until then, and why.
    Column("cooling_until", Text, nullable=True),
    Column("cooling_reason", Text, nullable=True),
)

concurrency_slots = Table(
    "_substrat_concurrency_slots",
    metadata,
    # One row per step body in flight under a concurrency key. It counts only while
    # its lease token is still its run's unexpired lease, so a holder that died,
    # was taken over or ended its pass frees its slot with no write at all.
    Column("limit_key", Text, primary_key=True),
    Column("lease_token", Text, primary_key=True),
    Column("step", Text, primary_key=True),
    Column("run_id", Text, nullable=False),
    Column("acquired_at", Text, nullable=False),
)

# -- Revision 0007: the workers that said they are alive (jobrun._core.operator.worker_registry) ---

job_workers = Table(
    "_substrat_job_workers",
    metadata,
    # One row per worker process (a fresh id each time it starts) per database.
    Column("id", Text, primary_key=True),
    # The driver name it claims under, and the host and pid it runs as.
    Column("name", Text, nullable=False),
    Column("host", Text, nullable=False),
    Column("pid", Integer, nullable=False),
    # The jobs it registers: a JSON list of [module_id, job], sorted.
    Column("jobs", Text, nullable=False),
    Column("started_at", Text, nullable=False),
    Column("heartbeat_at", Text, nullable=False),
    # Written by each heartbeat: after it, readers take the worker for gone.
    # Not indexed: a few rows per database, read whole.
    Column("expires_at", Text, nullable=False),
)

# -- Revision 0009: pauses that outlive any one run (jobrun._core.operator.pausing) ---------

job_pauses = Table(
    "_substrat_job_pauses",
    metadata,
    # A paused job: its live runs were paused with it, and a run started while this
    # row exists starts paused (the start reads it in its own statement).
    Column("module_id", Text, primary_key=True),
    Column("job", Text, primary_key=True),
    Column("paused_at", Text, nullable=False),
    Column("reason", Text, nullable=True),
)

limit_pauses = Table(
    "_substrat_job_limit_pauses",
    metadata,
    # A paused limit key (rate or concurrency): a step naming it defers its pass
    # until the row goes. The take of a token reads it in its own statement.
    Column("limit_key", Text, primary_key=True),
    Column("paused_at", Text, nullable=False),
    Column("reason", Text, nullable=True),
)
