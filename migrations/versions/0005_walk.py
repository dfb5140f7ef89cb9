"""Fair claims' due-order index (each block below is one change of its own).

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

RUNS = "_substrat_job_runs"


# --- Fair claims: the order of the claims that go by age ---------------------------------------
# One claim in FAIR_EVERY takes the run due longest, priority ignored (see
# jobrun._core.fair); this index is that claim's order, so it reads the index
# front to back and stops at the first fit, as the priority claim does with
# _substrat_job_runs_claim_order. (0003 dropped an index of the same shape named
# _substrat_job_runs_due_at; the new name keeps the two histories apart.)
# Partial on a condition every row meets that only the by-age claim names, so the
# priority claim never picks this index (SQLite would, and sort the due runs).
DUE_ORDER_INDEX = "_substrat_job_runs_due_order"
DUE_AT = "coalesce(next_attempt_at, started_at)"
BY_AGE_ONLY = sa.text("priority IS NOT NULL")


def _upgrade_due_order() -> None:
    op.create_index(
        DUE_ORDER_INDEX,
        RUNS,
        ["status", sa.text(DUE_AT), "id"],
        sqlite_where=BY_AGE_ONLY,
        postgresql_where=BY_AGE_ONLY,
    )


def _downgrade_due_order() -> None:
    op.drop_index(DUE_ORDER_INDEX, table_name=RUNS)


# --- end of fair claims -------------------------------------------------------------------------


def upgrade() -> None:
    _upgrade_due_order()


def downgrade() -> None:
    _downgrade_due_order()
