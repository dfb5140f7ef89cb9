"""Pause and unpause, the rows they write (revision 0009): see
:mod:`jobrun._core.operator.pausing` for what a pause is.

The changes are :class:`~jobrun._core.rules.transitions.RunChange` values, applied by
the stores as any operator change; the due instant follows the pause there
(``RunChange.applied`` and :func:`jobrun._core.model.predicates.parked`).
"""

from __future__ import annotations

from dataclasses import replace

from jobrun._core.model.formats import parse_instant
from jobrun._core.model.predicates import parked
from jobrun._core.model.records import PauseRecord, RunRow
from jobrun._core.rules.transitions import RUNNING, RunChange


def pause_transition(at: str, reason: str | None) -> RunChange:
    """A live run that is not paused is paused at ``at`` for ``reason``; left without a
    lease, it waits at ``PARKED_AT`` (``RunChange.applied``)."""
    values = (("paused_at", at), ("pause_reason", reason), ("updated_at", at))
    return RunChange(RUNNING, values, paused=False)


def unpause_transition(at: str) -> RunChange:
    """A paused live run is unpaused at ``at``: due at once unless a lease holds it."""
    values = (("paused_at", None), ("pause_reason", None), ("updated_at", at))
    return RunChange(RUNNING, values, paused=True)


def paused_start(row: RunRow, paused_at: str, reason: str | None) -> RunRow:
    """A fresh run started while its job is paused: paused since ``paused_at``."""
    return parked(replace(row, paused_at=paused_at, pause_reason=reason))


def pause_record(paused_at: str, reason: str | None) -> PauseRecord:
    """A job's or a limit key's pause as stored (instant text), for readers."""
    return PauseRecord(parse_instant(paused_at), reason)
