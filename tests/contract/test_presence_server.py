"""A free presence proves death only on the server it was taken on (issue 31 item 4).

Advisory locks are not replicated: on a replica promoted to primary (a new
timeline) every presence of the old primary looks free, while the old primary
may still be running their holders. A presence key carries the tag of the
server it was taken on (``jobrun.sql.postgres.presence``); a lease naming a key of
another tag reads as "cannot say" (``presence_held`` None), so its run waits
for the lease to expire. A promotion itself is staged in
``tests/processes/test_failover.py``; here the other server is a key under
another tag.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from sqlalchemy import func, select

from jobrun._core.leases.holders import HolderIdentity
from jobrun.sql.postgres.presence import SERVER_TAG_BITS
from tests.support import SQL_BACKENDS, hand_made_row, put_rows

RANDOM_BITS = 63 - SERVER_TAG_BITS
LEASED_UNTIL_AT = "2999-01-01T00:00:00.000Z"
NOW_AT = "2026-01-01T00:00:00.000Z"


def _leased(index: int, presence: int | None) -> Any:
    holder = HolderIdentity("web-7", presence=presence).describe(f"driver-{index}")
    return dataclasses.replace(
        hand_made_row(index),
        lease_owner=f"token-{index}",
        lease_driver=holder,
        lease_began_at=NOW_AT,
        next_attempt_at=LEASED_UNTIL_AT,
    )


@pytest.mark.postgres
@pytest.mark.parametrize("backend", [SQL_BACKENDS[1]], indirect=True)
async def test_a_presence_of_another_server_tag_proves_neither_life_nor_death(
    store: Any, engine: Any
) -> None:
    key = await store.presence()
    tag, random_part = key >> RANDOM_BITS, key & ((1 << RANDOM_BITS) - 1)
    # The same cluster one promotion later (timeline + 1), or another cluster.
    next_timeline = ((tag & ~255) | ((tag + 1) & 255)) << RANDOM_BITS | random_part
    other_cluster = (tag ^ (1 << 8)) << RANDOM_BITS | random_part
    held_under_other_tag = (tag ^ (3 << 8)) << RANDOM_BITS | random_part
    async with engine.connect() as holder:
        # A lock held here under a key tagged for another server vouches for nothing either.
        await holder.execute(select(func.pg_advisory_lock(held_under_other_tag)))
        presences = [key, key ^ 1, next_timeline, other_cluster, held_under_other_tag, None]
        await put_rows(store, engine, [_leased(i, p) for i, p in enumerate(presences)])
        seen = {
            lease.run_id: lease.presence_held for lease in await store.held_leases(NOW_AT, None)
        }
        await holder.execute(select(func.pg_advisory_unlock(held_under_other_tag)))
    found = [seen[f"{index:026d}"] for index in range(len(presences))]
    assert found == [True, False, None, None, None, None], seen
