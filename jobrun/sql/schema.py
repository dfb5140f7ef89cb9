"""The one definition of jobrun's tables; both dialects' DDL is emitted from it.

Alembic revisions must produce exactly this (a test compares them on both
dialects). Everything is TEXT and INTEGER: timestamps are fixed-shape text so
that due-ness is a string comparison that means the same on every engine.
"""

from __future__ import annotations

from sqlalchemy import Column, Index, Integer, MetaData, Table, Text, func, text

SCHEMA_REVISION = "0002"
"""The Alembic head this code needs; a test checks it against the migrations."""

VERSION_TABLE = "jobrun_alembic_version"
"""jobrun's own Alembic version table, so a host's ``alembic_version`` is never touched."""

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

# The claim's order: when each run became due, then id. Status leads so live
# runs are one seekable range however many finished runs are kept.
DUE_AT = func.coalesce(job_runs.c.next_attempt_at, job_runs.c.started_at)
Index("_substrat_job_runs_due_at", job_runs.c.status, DUE_AT, job_runs.c.id)

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
