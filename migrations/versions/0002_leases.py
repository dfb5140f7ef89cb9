"""Leases: fenced claims so that many drivers can share one database.

Revision ID: 0002
Revises: 0001
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

RUNS = "_substrat_job_runs"


def upgrade() -> None:
    # Plain ADD COLUMN on both engines: nullable or defaulted columns need no
    # table rebuild, so existing rows (in any state) are kept as they are.
    op.add_column(RUNS, sa.Column("lease_owner", sa.Text(), nullable=True))
    op.add_column(RUNS, sa.Column("lease_driver", sa.Text(), nullable=True))
    op.add_column(RUNS, sa.Column("lease_began_at", sa.Text(), nullable=True))
    op.add_column(
        RUNS,
        sa.Column("lease_takeovers", sa.Integer(), nullable=False, server_default=sa.text("0")),
    )
    # Claims order by when a run became due; the old (status, next_attempt_at, id)
    # index served the id-ordered paging that claims replace.
    op.drop_index("_substrat_job_runs_due", table_name=RUNS)
    op.create_index(
        "_substrat_job_runs_due_at",
        RUNS,
        ["status", sa.text("coalesce(next_attempt_at, started_at)"), "id"],
    )


def downgrade() -> None:
    op.drop_index("_substrat_job_runs_due_at", table_name=RUNS)
    op.create_index("_substrat_job_runs_due", RUNS, ["status", "next_attempt_at", "id"])
    # DROP COLUMN exists on SQLite since 3.35 and leaves the partial index alone.
    for column in ("lease_takeovers", "lease_began_at", "lease_driver", "lease_owner"):
        op.drop_column(RUNS, column)
