"""The workers that said they are alive: one row per worker process, written when it
starts serving the database, again at each heartbeat, deleted when it stops (see
``jobrun._core.operator.worker_registry``).

Code of 0006 may run against it: it does not register, which costs nothing but the
console's and health's view of it (its due runs may read "no live worker runs
this job" while only 0006 workers serve the job). The compatibility record is left
as it is.

Revision ID: 0007
Revises: 0006
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

WORKERS = "_substrat_job_workers"


def upgrade() -> None:
    op.create_table(
        WORKERS,
        sa.Column("id", sa.Text(), primary_key=True),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("host", sa.Text(), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("jobs", sa.Text(), nullable=False),
        sa.Column("started_at", sa.Text(), nullable=False),
        sa.Column("heartbeat_at", sa.Text(), nullable=False),
        sa.Column("expires_at", sa.Text(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table(WORKERS)
