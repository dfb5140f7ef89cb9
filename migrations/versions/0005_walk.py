"""External walks: deferrals, fair claims' due-order index, rate and concurrency
limit tables, schedules' crons and each job's retention. Each block below is one
change of its own, upgraded in this order and downgraded in reverse.

Revision ID: 0005
Revises: 0004
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

RUNS = "_substrat_job_runs"


# --- Fair claims: the order of the claims that go by age ---------------------------------------
# One claim in FAIR_EVERY takes the run due longest, priority ignored (see
# jobrun._core.rules.fair_turns); this index is that claim's order, so it reads the index
# front to back and stops at the first fit, as the priority claim does with
# _substrat_job_runs_claim_order. (0003 dropped an index of the same shape named
# _substrat_job_runs_due_at; the new name keeps the two histories apart.)
# Partial on a condition every row meets that only the by-age claim names, so the
# priority claim never picks this index (SQLite would, and sort the due runs).
DUE_ORDER_INDEX = "_substrat_job_runs_due_order"
DUE_AT = "coalesce(next_attempt_at, started_at)"
BY_AGE_ONLY = sa.text("priority IS NOT NULL")


def _upgrade_due_order() -> None:
    op.create_index(
        DUE_ORDER_INDEX,
        RUNS,
        ["status", sa.text(DUE_AT), "id"],
        sqlite_where=BY_AGE_ONLY,
        postgresql_where=BY_AGE_ONLY,
    )


def _downgrade_due_order() -> None:
    op.drop_index(DUE_ORDER_INDEX, table_name=RUNS)


# --- end of fair claims -------------------------------------------------------------------------


# -- rate and concurrency limits: two tables of their own (nothing else changes) ----------

RATE_BUCKETS = "_substrat_rate_buckets"
CONCURRENCY_SLOTS = "_substrat_concurrency_slots"


def _upgrade_limits() -> None:
    op.create_table(
        RATE_BUCKETS,
        sa.Column("limit_key", sa.Text(), nullable=False),
        sa.Column("per_second", sa.Text(), nullable=False),
        sa.Column("burst", sa.Integer(), nullable=False),
        sa.Column("milli_tokens", sa.Integer(), nullable=False),
        sa.Column("refilled_at", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("limit_key"),
    )
    op.create_table(
        CONCURRENCY_SLOTS,
        sa.Column("limit_key", sa.Text(), nullable=False),
        sa.Column("lease_token", sa.Text(), nullable=False),
        sa.Column("step", sa.Text(), nullable=False),
        sa.Column("run_id", sa.Text(), nullable=False),
        sa.Column("acquired_at", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("limit_key", "lease_token", "step"),
    )


def _downgrade_limits() -> None:
    op.drop_table(CONCURRENCY_SLOTS)
    op.drop_table(RATE_BUCKETS)


# -- end of the limits block ---------------------------------------------------------------


# --- Deferrals ---------------------------------------------------------------------------------
# ``deferrals``: the passes deferred in a row, 0 on every existing run. ADD COLUMN
# with a constant default, as 0002-0004 did: no table rebuild on either engine,
# and a writer that does not know the column still inserts.
# ``deferred_reason``: the last deferral's reason, NULL on every existing run.


def _upgrade_deferrals() -> None:
    op.add_column(
        RUNS, sa.Column("deferrals", sa.Integer(), nullable=False, server_default=sa.text("0"))
    )
    op.add_column(RUNS, sa.Column("deferred_reason", sa.Text(), nullable=True))


def _downgrade_deferrals() -> None:
    op.drop_column(RUNS, "deferred_reason")
    op.drop_column(RUNS, "deferrals")


# -- schedules and retention (issue 23, items 6 and 7) ----------------------------------------
# A schedule's row keeps the cron its last slot belongs to (NULL on rows written
# before: such a schedule starts again from its next slot), and each job's own
# keep_for is recorded for workers that do not register the job.

SCHEDULES = "_substrat_job_schedules"
RETENTION = "_substrat_job_retention"


def _schedules_and_retention_up() -> None:
    # A nullable column without a default: no table rebuild on either engine.
    op.add_column(SCHEDULES, sa.Column("cron", sa.Text(), nullable=True))
    op.create_table(
        RETENTION,
        sa.Column("module_id", sa.Text(), nullable=False),
        sa.Column("job", sa.Text(), nullable=False),
        sa.Column("keep_for_s", sa.Integer(), nullable=False),
        sa.Column("updated_at", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("module_id", "job"),
    )


def _schedules_and_retention_down() -> None:
    op.drop_table(RETENTION)
    op.drop_column(SCHEDULES, "cron")


def upgrade() -> None:
    _upgrade_deferrals()
    _upgrade_due_order()
    _upgrade_limits()
    _schedules_and_retention_up()


def downgrade() -> None:
    _schedules_and_retention_down()
    _downgrade_limits()
    _downgrade_due_order()
    _downgrade_deferrals()
