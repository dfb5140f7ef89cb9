"""How a pass's end is written (``jobrun/_core/engine/outcomes.py``): the lease
handed back when the loop that sent it goes away."""

from __future__ import annotations

import asyncio
import gc
import warnings
from dataclasses import replace
from typing import Any

from jobrun._core.engine.outcomes import hand_back
from jobrun._core.leases.owed_releases import OwedReleases
from jobrun._core.leases.renewal import Lease
from jobrun._core.model.records import RunPatch
from tests.support import hand_made_row


class _Store:
    """Just what a hand-back touches: the fenced write, and the releases owed."""

    def __init__(self) -> None:
        self.owed_releases = OwedReleases()
        self.patches: list[str] = []

    async def patch(self, run_id: str, patch: RunPatch, token: str) -> bool:
        self.patches.append(run_id)
        return True


def test_a_hand_back_cut_off_by_the_loop_ending_leaves_no_write_never_awaited() -> None:
    # A loop shutting down cancels every task left, the shielded write's task
    # too, possibly before its first step. Its store call must not exist yet, or
    # it is garbage collected unawaited (a RuntimeWarning that pytest reports
    # against whichever later test is running).
    store = _Store()

    async def main() -> None:
        lease = Lease("T", "me:1", 60_000)
        handing = asyncio.ensure_future(
            hand_back(store, replace(hand_made_row(1), lease_owner="T"), lease)
        )  # type: ignore[arg-type]
        await asyncio.sleep(0)  # the hand-back starts and shields its write: not stepped yet
        others = asyncio.all_tasks() - {asyncio.current_task()}
        assert handing in others
        for task in others:
            task.cancel()
        await asyncio.gather(*others, return_exceptions=True)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        asyncio.run(main())
        gc.collect()
    never_awaited: list[Any] = [w for w in caught if "never awaited" in str(w.message)]
    assert never_awaited == []
    assert store.patches == []  # cancelled before it was sent: nothing half-written
