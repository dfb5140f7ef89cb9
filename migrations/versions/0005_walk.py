"""External walks: deferrals (a pass that raised RetryAfter) and what else the walk needs.

Revision ID: 0005
Revises: 0004

Several changes share this revision; each keeps to its own block below, in
``upgrade`` and, in reverse order, in ``downgrade``.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

RUNS = "_substrat_job_runs"


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


# --- Revision ----------------------------------------------------------------------------------


def upgrade() -> None:
    _upgrade_deferrals()


def downgrade() -> None:
    _downgrade_deferrals()
