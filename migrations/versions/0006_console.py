"""The console's revision: the cancelled marker, and the indexes of the activity chart
and the instance prefix filter.

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
ENDED_INDEX = "_substrat_job_runs_ended"
INSTANCE_INDEX = "_substrat_job_runs_instance"
# What jobrun's cancel has always written first into last_error (jobrun._core.actions).
CANCELLED_PREFIX = "cancelled: "


def upgrade() -> None:
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
    # The activity chart: runs finished per minute and hour, a range of ended_at
    # (status in the key, so a count of the failed ones reads the index alone).
    op.create_index(ENDED_INDEX, RUNS, ["ended_at", "status"])
    # The runs page's instance prefix filter without a job: a range of instance.
    op.create_index(INSTANCE_INDEX, RUNS, ["instance", "id"])


def downgrade() -> None:
    op.drop_index(INSTANCE_INDEX, table_name=RUNS)
    op.drop_index(ENDED_INDEX, table_name=RUNS)
    op.drop_column(RUNS, "cancelled")
