"""Versioned jobs: each run's job version; and the schema's compatibility record,
the oldest jobrun code that may still run against this database. Each block below
is one change of its own, upgraded in this order and downgraded in reverse.

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
# is older than the row says (jobrun.sql.compat). A later revision that old code
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


def upgrade() -> None:
    _upgrade_job_version()
    _upgrade_compat()


def downgrade() -> None:
    _downgrade_compat()
    _downgrade_job_version()
