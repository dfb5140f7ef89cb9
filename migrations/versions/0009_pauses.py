"""Pause and unpause: a run, every run of a job, a limit key.

Two nullable columns without defaults on ``_substrat_job_runs`` (``paused_at``,
``pause_reason``: no table rebuild on either engine, and a writer that does not
know them still inserts), and two small tables: ``_substrat_job_pauses`` (a
paused job: its runs started meanwhile start paused) and
``_substrat_job_limit_pauses`` (a paused limit key).

Code of 0006 to 0008 may run against it, degraded, so the compatibility record is
left as it is: such code never claims a paused run that waits (its due instant is
out of every clock's reach), but a pass it holds when the run is paused does not
stop, and what it writes at the pass's end makes the run due to it again; its
starts ignore a paused job and its steps a paused limit. Pauses hold in full
once every worker runs 0009 code (docs/how-to/upgrade.md).

The downgrade makes every waiting paused run due again (it would otherwise wait
for ever), then drops the tables and columns.

Revision ID: 0009
Revises: 0008
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

RUNS = "_substrat_job_runs"
JOB_PAUSES = "_substrat_job_pauses"
LIMIT_PAUSES = "_substrat_job_limit_pauses"
# jobrun._core.model.predicates.PARKED_AT, as this revision wrote it (a revision is frozen).
PARKED_AT = "9999-12-31T23:59:59.999Z"


def upgrade() -> None:
    op.add_column(RUNS, sa.Column("paused_at", sa.Text(), nullable=True))
    op.add_column(RUNS, sa.Column("pause_reason", sa.Text(), nullable=True))
    op.create_table(
        JOB_PAUSES,
        sa.Column("module_id", sa.Text(), primary_key=True),
        sa.Column("job", sa.Text(), primary_key=True),
        sa.Column("paused_at", sa.Text(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
    )
    op.create_table(
        LIMIT_PAUSES,
        sa.Column("limit_key", sa.Text(), primary_key=True),
        sa.Column("paused_at", sa.Text(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
    )


def downgrade() -> None:
    # Waiting paused runs (and runs waiting for a paused limit) become due at once.
    op.execute(
        sa.text(
            f"UPDATE {RUNS} SET next_attempt_at = NULL WHERE status = 'running' "
            "AND lease_owner IS NULL AND next_attempt_at = :parked"
        ).bindparams(parked=PARKED_AT)
    )
    op.drop_table(LIMIT_PAUSES)
    op.drop_table(JOB_PAUSES)
    op.drop_column(RUNS, "pause_reason")
    op.drop_column(RUNS, "paused_at")
