"""The claim's two indexes, one range per job, live runs only.

``_substrat_job_runs_claim_order`` and ``_substrat_job_runs_due_order`` are made
again, keyed on the job first (as ``substr(module_id, 1)`` and ``substr(job, 1)``, the
same values, which only the claim compares) and partial on live runs. A claim now reads
the front of each of its jobs' ranges, so its cost no longer depends on the queue:
before, Postgres without statistics for a table just filled (or with statistics
from before a burst of starts) took the key or status index for the claim's job
filter and sorted every live run of the job on each claim. Finished runs leave
both indexes, so a run kept in the history costs two index entries fewer.

Rows are not touched. Code of 0006 to 0010 may still run against it, so the
compatibility record is left as it is: its claims read the same runs, in the same
order, with the plan statistics choose (docs/how-to/upgrade.md).

The downgrade makes the two indexes of 0010 again.

Revision ID: 0011
Revises: 0010
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

RUNS = "_substrat_job_runs"
CLAIM_ORDER = "_substrat_job_runs_claim_order"
DUE_ORDER = "_substrat_job_runs_due_order"
DUE_AT = "coalesce(next_attempt_at, started_at)"
# As the schema spells them (``jobrun.sql.schema.claim_key_of``).
JOB_KEY = [f"substr({name}, 1)" for name in ("module_id", "job")]
LIVE_ONLY = sa.text("status = 'running'")
LIVE_BY_AGE_ONLY = sa.text("status = 'running' AND priority IS NOT NULL")
BY_AGE_ONLY = sa.text("priority IS NOT NULL")


def _index(name: str, columns: list[str], where: sa.TextClause | None) -> None:
    keys = [sa.text(key) if " " in key else key for key in columns]
    op.create_index(name, RUNS, keys, sqlite_where=where, postgresql_where=where)


def upgrade() -> None:
    op.drop_index(CLAIM_ORDER, table_name=RUNS)
    op.drop_index(DUE_ORDER, table_name=RUNS)
    _index(CLAIM_ORDER, [*JOB_KEY, "priority DESC", DUE_AT, "id"], LIVE_ONLY)
    _index(DUE_ORDER, [*JOB_KEY, DUE_AT, "id"], LIVE_BY_AGE_ONLY)


def downgrade() -> None:
    op.drop_index(DUE_ORDER, table_name=RUNS)
    op.drop_index(CLAIM_ORDER, table_name=RUNS)
    _index(CLAIM_ORDER, ["status", "priority DESC", DUE_AT, "id"], None)
    _index(DUE_ORDER, ["status", DUE_AT, "id"], BY_AGE_ONLY)
