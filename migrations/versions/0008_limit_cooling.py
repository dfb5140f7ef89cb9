"""A rate limit that cools down: ``RetryAfter(seconds, rate_limit=key)`` holds the
key's bucket until then for every driver; the bucket row keeps until when and why.

Two nullable columns without defaults on ``_substrat_rate_buckets``: no table
rebuild on either engine, and code that does not know them still takes tokens
(it does not wait for a cooling down it cannot see, which is all it loses). The
compatibility record is left as it is.

Revision ID: 0008
Revises: 0007
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

BUCKETS = "_substrat_rate_buckets"


def upgrade() -> None:
    op.add_column(BUCKETS, sa.Column("cooling_until", sa.Text(), nullable=True))
    op.add_column(BUCKETS, sa.Column("cooling_reason", sa.Text(), nullable=True))


def downgrade() -> None:
    op.drop_column(BUCKETS, "cooling_reason")
    op.drop_column(BUCKETS, "cooling_until")
