"""Create the job-run tables.

Revision ID: 0001
Revises:
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

LIVE_ONLY = sa.text("status = 'running'")


def upgrade() -> None:
    op.create_table(
        "_substrat_job_runs",
        sa.Column("id", sa.Text(), primary_key=True),
        sa.Column("module_id", sa.Text(), nullable=False),
        sa.Column("job", sa.Text(), nullable=False),
        sa.Column("instance", sa.Text(), nullable=False),
        sa.Column("payload", sa.Text(), nullable=False),
        sa.Column("status", sa.Text(), nullable=False),
        sa.Column("cursor", sa.Text(), nullable=True),
        sa.Column("counters", sa.Text(), nullable=False, server_default=sa.text("'{}'")),
        sa.Column("attempts", sa.Integer(), nullable=False, server_default=sa.text("0")),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("started_at", sa.Text(), nullable=False),
        sa.Column("updated_at", sa.Text(), nullable=False),
        sa.Column("next_attempt_at", sa.Text(), nullable=True),
        sa.Column("ended_at", sa.Text(), nullable=True),
    )
    op.create_index(
        "_substrat_job_runs_due", "_substrat_job_runs", ["status", "next_attempt_at", "id"]
    )
    op.create_index(
        "_substrat_job_runs_key", "_substrat_job_runs", ["module_id", "job", "instance", "id"]
    )
    op.create_index(
        "_substrat_job_runs_live_key",
        "_substrat_job_runs",
        ["module_id", "job", "instance"],
        unique=True,
        sqlite_where=LIVE_ONLY,
        postgresql_where=LIVE_ONLY,
    )
    op.create_table(
        "_substrat_job_steps",
        sa.Column("run_id", sa.Text(), nullable=False),
        sa.Column("step", sa.Text(), nullable=False),
        sa.Column("result", sa.Text(), nullable=True),
        sa.Column("attempts", sa.Integer(), nullable=False, server_default=sa.text("0")),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("recorded_at", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("run_id", "step"),
    )


def downgrade() -> None:
    op.drop_table("_substrat_job_steps")
    op.drop_index("_substrat_job_runs_live_key", table_name="_substrat_job_runs")
    op.drop_index("_substrat_job_runs_key", table_name="_substrat_job_runs")
    op.drop_index("_substrat_job_runs_due", table_name="_substrat_job_runs")
    op.drop_table("_substrat_job_runs")
