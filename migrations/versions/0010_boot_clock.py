"""Lease expiries on the boot clock: two nullable columns on ``_substrat_job_runs``.

``lease_boot_id`` (text: the host's boot id and time namespace, with the lease's
token) and ``lease_boot_expires_ms`` (a 64-bit integer: ``CLOCK_BOOTTIME`` milliseconds at
which the lease expires). SQLite code writes them with every lease and judges a
lease of its own boot by them alone, so a wall-clock step cannot hand a live
lease to a process started after it; Postgres judges on its own clock and leaves
them NULL. No defaults and no table rebuild on either engine.

Code of 0006 to 0009 may run against it, so the compatibility record is left as
it is: such code neither reads nor writes the columns, and any lease it writes
gets a new token, which the boot columns left beside it never match (so they are
never believed). Against such a lease, new code judges by the wall clock as
before; the boot clock protects the leases of new code only (docs/how-to/upgrade.md).

The downgrade drops the columns.

Revision ID: 0010
Revises: 0009
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

RUNS = "_substrat_job_runs"


def upgrade() -> None:
    op.add_column(RUNS, sa.Column("lease_boot_id", sa.Text(), nullable=True))
    op.add_column(RUNS, sa.Column("lease_boot_expires_ms", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    op.drop_column(RUNS, "lease_boot_expires_ms")
    op.drop_column(RUNS, "lease_boot_id")
