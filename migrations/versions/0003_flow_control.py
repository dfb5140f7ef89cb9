"""Flow control: run priorities, the per-job concurrency count, schedule slots;
the console's indexes (newest first by job and status, and by status).

Revision ID: 0003
Revises: 0002
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

RUNS = "_substrat_job_runs"
DUE_AT = "coalesce(next_attempt_at, started_at)"
LEASED_ONLY = sa.text("lease_owner IS NOT NULL")


def upgrade() -> None:
    # ADD COLUMN with a constant default: existing rows read 0 (no table rebuild
    # on either engine), and no existing column changes.
    op.add_column(
        RUNS, sa.Column("priority", sa.Integer(), nullable=False, server_default=sa.text("0"))
    )
    # The claim orders by priority first now; its index follows the ORDER BY.
    op.drop_index("_substrat_job_runs_due_at", table_name=RUNS)
    op.create_index(
        "_substrat_job_runs_claim_order",
        RUNS,
        ["status", sa.text("priority DESC"), sa.text(DUE_AT), "id"],
    )
    op.create_index(
        "_substrat_job_runs_leased",
        RUNS,
        ["module_id", "job"],
        sqlite_where=LEASED_ONLY,
        postgresql_where=LEASED_ONLY,
    )
    # The console's runs page: id-ordered ranges per job and status, and per status.
    op.create_index("_substrat_job_runs_job_status", RUNS, ["module_id", "job", "status", "id"])
    op.create_index("_substrat_job_runs_status", RUNS, ["status", "id"])
    op.create_table(
        "_substrat_job_schedules",
        sa.Column("module_id", sa.Text(), nullable=False),
        sa.Column("job", sa.Text(), nullable=False),
        sa.Column("schedule", sa.Text(), nullable=False),
        sa.Column("last_slot_at", sa.Text(), nullable=False),
        sa.Column("last_run_id", sa.Text(), nullable=True),
        sa.Column("updated_at", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("module_id", "job", "schedule"),
    )


def downgrade() -> None:
    op.drop_table("_substrat_job_schedules")
    op.drop_index("_substrat_job_runs_status", table_name=RUNS)
    op.drop_index("_substrat_job_runs_job_status", table_name=RUNS)
    op.drop_index("_substrat_job_runs_leased", table_name=RUNS)
    op.drop_index("_substrat_job_runs_claim_order", table_name=RUNS)
    op.create_index("_substrat_job_runs_due_at", RUNS, ["status", sa.text(DUE_AT), "id"])
    op.drop_column(RUNS, "priority")
