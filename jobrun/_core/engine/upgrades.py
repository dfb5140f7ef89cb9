"""A claimed run of an older job version made a run of the code's version, before its pass.

The rules (which versions take which runs, how a cursor is upgraded) are in
``rules.versions``; this is the one fenced write that applies them.
"""

from __future__ import annotations

from dataclasses import replace

from jobrun._core.leases.renewal import LeaseKeeper
from jobrun._core.model.formats import decode_json, format_instant
from jobrun._core.model.predicates import stored_version
from jobrun._core.model.records import RunRow
from jobrun._core.model.refusals import mistake
from jobrun._core.model.results import cursor_text
from jobrun._core.port import JobRunStore
from jobrun._core.rules.transitions import upgraded_patch
from jobrun._core.rules.versions import Upgrade, upgraded_cursor
from jobrun._core.time.clock import Clock
from jobrun.errors import HandlerMistakeError, LeaseLostError


async def upgrade_run(
    store: JobRunStore,
    clock: Clock,
    row: RunRow,
    version: int,
    upgrades: tuple[Upgrade, ...],
    keeper: LeaseKeeper,
) -> RunRow:
    """``row`` (held under ``keeper``'s lease) made a run of ``version``: its cursor
    upgraded and written with the version, and the older code's ledger dropped, in
    one fenced write. Returns ``row`` as it is then stored; ``row`` itself when it
    is already of ``version``.

    Raises what an upgrade function raised (the pass fails, charged like any
    failed attempt, and nothing is written), a mistake for a cursor that cannot
    be stored, and :class:`LeaseLostError` when the write is refused.
    """
    stored = stored_version(row)
    if stored == version:
        return row
    if stored > version:
        # The claim never hands such a run over; should one get here, it is handed
        # back untouched rather than given to older code.
        raise LeaseLostError(row.id)
    cursor = None if row.cursor is None else decode_json(row.cursor, "cursor")
    upgraded = upgraded_cursor(cursor, stored, upgrades)
    try:
        text = cursor_text(upgraded, store.limits.max_cursor_bytes)
    except HandlerMistakeError as error:
        # Said of the upgrade, not of the handler (which has not run).
        problem = error.message.partition(": ")[2] or error.message
        raise mistake(
            "upgrade",
            f"the upgrade to version {version} made a cursor that cannot be stored: {problem}",
        ) from error
    patch = upgraded_patch(row, text, version, format_instant(clock.now()))
    if not await store.commit_pass(row.id, patch, keeper.lease.token):
        keeper.lose(refused=True)
        raise LeaseLostError(row.id)
    return replace(row, cursor=text, job_version=version, updated_at=patch.updated_at)
