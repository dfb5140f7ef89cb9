"""A stored run row decoded for an operator: :func:`job_run_of` never raises.

Apart from the records so that the decoding may use the predicates (which read
the records) without a circle between the two modules.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from jobrun._core.model.formats import (
    MalformedColumnError,
    decode_counters,
    decode_json,
    parse_instant,
)
from jobrun._core.model.predicates import is_cancelled, outcome_of, stored_version
from jobrun._core.model.records import STATUSES, JobRun, RunRow

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _instant(column: str, text: str | None, problems: list[str]) -> datetime | None:
    """A stored instant, or ``None`` (and the problem noted) when it is not one."""
    if text is None:
        return None
    try:
        return parse_instant(text)
    except (ValueError, TypeError, OverflowError):
        # OverflowError: a valid ISO text whose UTC instant is outside years 1-9999.
        problems.append(f"{column} is not a timestamp: {text!r}")
        return None


def _decoded_json(row: RunRow, problems: list[str]) -> tuple[Any, Any, Any]:
    """The row's payload, cursor and counters; each that cannot be decoded reads as
    its fallback (``None``, ``None``, ``{}``), its problem added to ``problems``."""

    def attempt(text: str | None, fallback: Any, decode: Any) -> Any:
        if text is None:
            return None
        try:
            return decode(text)
        except MalformedColumnError as error:
            problems.append(str(error))
        return fallback

    return (
        attempt(row.payload, None, lambda t: decode_json(t, "payload")),
        attempt(row.cursor, None, lambda t: decode_json(t, "cursor")),
        attempt(row.counters, {}, decode_counters),
    )


def job_run_of(row: RunRow) -> JobRun:
    """Decode a row for an operator; never raises for what is stored in it."""
    problems: list[str] = []
    payload, cursor, counters = _decoded_json(row, problems)
    started_at, updated_at, next_attempt_at, ended_at, lease_began_at = (
        _instant(column, getattr(row, column), problems)
        for column in ("started_at", "updated_at", "next_attempt_at", "ended_at", "lease_began_at")
    )
    leased = row.lease_owner is not None
    if row.status not in STATUSES:
        problems.append(f"status {row.status!r} is not one of running, done, failed")
    return JobRun(
        id=row.id,
        module_id=row.module_id,
        job=row.job,
        instance=row.instance,
        status=row.status,
        payload=payload,
        cursor=cursor,
        counters=counters,
        attempts=row.attempts,
        last_error=row.last_error,
        started_at=started_at or _EPOCH,
        updated_at=updated_at or _EPOCH,
        next_attempt_at=next_attempt_at,
        ended_at=ended_at,
        decode_error=problems[0] if problems else None,
        lease_driver=row.lease_driver if leased else None,
        # While a run is leased, next_attempt_at holds the lease's expiry.
        lease_expires_at=next_attempt_at if leased else None,
        lease_takeovers=row.lease_takeovers,
        priority=row.priority,
        lease_epoch=row.lease_epoch,
        passes_committed=row.passes_committed,
        deferrals=row.deferrals,
        deferred_reason=row.deferred_reason,
        job_version=stored_version(row),
        lease_began_at=lease_began_at if leased else None,
        cancelled=is_cancelled(row),
        outcome=outcome_of(row),
        error_origin=row.error_origin,
    )
