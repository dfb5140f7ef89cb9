"""Versioned jobs (each run's job version), the console (the cancelled marker, the
activity chart's and the instance filter's indexes), and the schema's compatibility
record: the oldest jobrun code that may still run against this database. Each block
below is one change of its own, upgraded in this order and downgraded in reverse.

Revision ID: 0006
Revises: 0005
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

RUNS = "_substrat_job_runs"


# --- Versioned jobs: the version of the code that last committed each run ----------------------
# NULL means 1 (every run from before, and a run no pass has committed yet). A
# nullable column without a default: no table rebuild on either engine, and a
# writer that does not know the column still inserts.


def _upgrade_job_version() -> None:
    op.add_column(RUNS, sa.Column("job_version", sa.Integer(), nullable=True))


def _downgrade_job_version() -> None:
    op.drop_column(RUNS, "job_version")


# --- The compatibility record: the oldest code revision that may run against this schema -------
# One row, written by the revisions: this one creates it. Code from this revision
# on reads it when the database is newer than the code and refuses to run when it
# is older than the row says (jobrun.sql.upgrades.compat). A later revision that old code
# can live with leaves the row alone; one it cannot updates the row (and puts the
# previous value back on its way down).
#
# This revision: code from before 0006 does not know job versions, so it would
# claim runs a newer version of a job has committed and hand their cursors to the
# old handler. Nothing older than 0006 may run against it.
COMPAT = "jobrun_schema_compat"
OLDEST_CODE_REVISION = "0006"


def _upgrade_compat() -> None:
    compat = op.create_table(
        COMPAT,
        sa.Column("oldest_code_revision", sa.Text(), nullable=False),
    )
    op.bulk_insert(compat, [{"oldest_code_revision": OLDEST_CODE_REVISION}])


def _downgrade_compat() -> None:
    op.drop_table(COMPAT)


# --- end of the versions blocks -----------------------------------------------------------------


# --- The console: the cancelled marker, the activity chart's and the instance
# filter's indexes ----------------------------------------------------------------
ENDED_INDEX = "_substrat_job_runs_ended"
INSTANCE_INDEX = "_substrat_job_runs_instance"
# What jobrun's cancel has always written first into last_error (jobrun._core.operator.actions).
CANCELLED_PREFIX = "cancelled: "


def _upgrade_console() -> None:
    # 1 when an operator cancelled the run (it ended failed by hand), 0 otherwise;
    # a resume sets it back to 0. Until now only the last_error prefix said so.
    op.add_column(
        RUNS, sa.Column("cancelled", sa.Integer(), nullable=False, server_default=sa.text("0"))
    )
    # Runs cancelled before this revision: failed, with the text cancel writes.
    # substr, not LIKE: LIKE is case-blind on SQLite.
    op.execute(
        sa.text(
            f"UPDATE {RUNS} SET cancelled = 1 WHERE status = 'failed' "
            f"AND substr(last_error, 1, {len(CANCELLED_PREFIX)}) = :prefix"
        ).bindparams(prefix=CANCELLED_PREFIX)
    )
    # Where the last failure was raised, beside last_error (whose text is unchanged).
    op.add_column(RUNS, sa.Column("error_origin", sa.Text(), nullable=True))
    # The activity chart: runs finished per minute and hour, a range of ended_at
    # (status and the job in the key, so the failed ones and one job's chart are
    # counted from the index alone).
    op.create_index(ENDED_INDEX, RUNS, ["ended_at", "status", "module_id", "job"])
    # The runs page's instance prefix filter without a job: a range of instance.
    op.create_index(INSTANCE_INDEX, RUNS, ["instance", "id"])


def _downgrade_console() -> None:
    op.drop_column(RUNS, "error_origin")
    op.drop_index(INSTANCE_INDEX, table_name=RUNS)
    op.drop_index(ENDED_INDEX, table_name=RUNS)
    op.drop_column(RUNS, "cancelled")


def upgrade() -> None:
    _upgrade_job_version()
    _upgrade_console()
    _upgrade_compat()


def downgrade() -> None:
    _downgrade_compat()
    _downgrade_console()
    _downgrade_job_version()
