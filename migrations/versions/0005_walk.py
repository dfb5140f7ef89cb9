"""Revision 0005.

Revision ID: 0005
Revises: 0004

Several changes share this revision; each lives in its own block below, with its
own upgrade and downgrade steps, called in order by ``upgrade`` and in reverse
by ``downgrade``.
"""

from collections.abc import Callable, Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

UPGRADES: list[Callable[[], None]] = []
DOWNGRADES: list[Callable[[], None]] = []


# -- schedules and retention (issue 23, items 6 and 7) ----------------------------------------
# A schedule's row keeps the cron its last slot belongs to (NULL on rows written
# before: such a schedule starts again from its next slot), and each job's own
# keep_for is recorded for workers that do not register the job.

SCHEDULES = "_substrat_job_schedules"
RETENTION = "_substrat_job_retention"


def _schedules_and_retention_up() -> None:
    # A nullable column without a default: no table rebuild on either engine.
    op.add_column(SCHEDULES, sa.Column("cron", sa.Text(), nullable=True))
    op.create_table(
        RETENTION,
        sa.Column("module_id", sa.Text(), nullable=False),
        sa.Column("job", sa.Text(), nullable=False),
        sa.Column("keep_for_s", sa.Integer(), nullable=False),
        sa.Column("updated_at", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("module_id", "job"),
    )


def _schedules_and_retention_down() -> None:
    op.drop_table(RETENTION)
    op.drop_column(SCHEDULES, "cron")


UPGRADES.append(_schedules_and_retention_up)
DOWNGRADES.append(_schedules_and_retention_down)
# -- end of schedules and retention ----------------------------------------------------------


def upgrade() -> None:
    for step in UPGRADES:
        step()


def downgrade() -> None:
    for step in reversed(DOWNGRADES):
        step()
