"""The fence for the outside world: each run's lease epoch and its committed passes.

Revision ID: 0004
Revises: 0003
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

RUNS = "_substrat_job_runs"
COLUMNS = ("lease_epoch", "passes_committed")


def upgrade() -> None:
    # ADD COLUMN with a constant default, as 0002 and 0003 did: no table rebuild
    # on either engine, existing rows read 0, and a writer that does not know
    # the columns still inserts.
    for column in COLUMNS:
        op.add_column(
            RUNS, sa.Column(column, sa.Integer(), nullable=False, server_default=sa.text("0"))
        )


def downgrade() -> None:
    for column in reversed(COLUMNS):
        op.drop_column(RUNS, column)
