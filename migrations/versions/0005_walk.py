"""Revision 0005.

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


def upgrade() -> None:
    _upgrade_limits()


def downgrade() -> None:
    _downgrade_limits()
