"""A step that names a paused limit key (revision 0009): how its pass ends.

The limit gate (:mod:`jobrun._core.engine.limit_gate`) raises
:class:`LimitPausedDeferral` when a take's wait is infinite or a slot is refused
for a paused key; the pass then ends here, deferred until the unpause.
"""

from __future__ import annotations

import contextlib
from dataclasses import replace
from datetime import timedelta

from jobrun._core.engine.outcomes import PassOutcome, _release_write
from jobrun._core.leases.renewal import Lease
from jobrun._core.limits.buckets import limit_paused_reason
from jobrun._core.model.formats import format_instant
from jobrun._core.model.predicates import PARKED_AT
from jobrun._core.model.records import RunRow
from jobrun._core.port import JobRunStore
from jobrun._core.rules.transitions import unleased
from jobrun._core.time.clock import Clock
from jobrun.errors import RetryAfter, StoreError, describe_exception

LIMIT_PAUSE_RECHECK_S = 60.0
"""How long a pass deferred by a paused limit waits before it looks again, when the
limit is kept in another store than the run (``registry.rate_limit(..., store=)``):
that store's unpause cannot wake the run. Otherwise the run waits for the unpause."""


class LimitPausedDeferral(RetryAfter):
    """A step named a paused limit key: its pass ends deferred until the key is
    unpaused (``until_unpaused``: the limit lives in the run's own store), else for
    :data:`LIMIT_PAUSE_RECHECK_S`. Nothing is charged, not even a deferral."""

    def __init__(self, key: str, until_unpaused: bool) -> None:
        super().__init__(LIMIT_PAUSE_RECHECK_S, reason=limit_paused_reason(key))
        self.key = key
        self.until_unpaused = until_unpaused


async def defer_for_paused_limit(
    store: JobRunStore, clock: Clock, row: RunRow, lease: Lease, deferral: LimitPausedDeferral
) -> PassOutcome:
    """End a pass whose step named a paused limit: the lease given back, nothing
    committed or charged (the deferrals in a row are not counted), the run waiting
    at ``PARKED_AT`` until the unpause makes it due (or looking again later).

    The unpause may land between the step's look at the key and this write, and
    then it would not find the run: so the key is looked at again after the write,
    and if it is no longer paused the run makes itself due. Either that look sees
    the pause, and the unpause (later) finds the run, or it does not, and the run
    goes on its own."""
    now = clock.now()
    waits_at = PARKED_AT
    if not deferral.until_unpaused:
        waits_at = format_instant(now + timedelta(seconds=LIMIT_PAUSE_RECHECK_S))
    patch = replace(
        unleased(row),
        updated_at=format_instant(now),
        next_attempt_at=waits_at,
        deferred_reason=deferral.reason,
    )
    if not await _release_write(store, row.id, patch, lease):
        return PassOutcome("superseded")
    if deferral.until_unpaused:
        still = True
        with contextlib.suppress(StoreError):
            still = False
            still = await store.limit_paused(deferral.key)
        if not still:
            with contextlib.suppress(StoreError):
                await store.unpark(row.id, deferral.reason)
    return PassOutcome("deferred", describe_exception(deferral))
