"""What a running run is waiting for, in words an operator reads: a pass in flight
under a lease until it expires, a next attempt after a failure (backoff), a rate
limit's token (the last pass ended because the token was beyond its budget), a
next pass a handler put off, or nothing (due: the next free driver takes it).

A step waiting for a concurrency slot, or for a token within the pass budget,
waits inside a pass in flight: nothing stored says so (the run reads as leased).

``next_attempt_at`` means two things (see :class:`jobrun._core.model.records.JobRun`):
while a run is leased it is the lease's expiry, otherwise when the run is due
again. This module keeps them apart so no screen shows a lease as a next attempt.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from jobrun._core.limits.buckets import rate_limit_of_deferral
from jobrun._core.model.predicates import starts_later_at
from jobrun._core.model.records import JobRun

WaitKind = Literal["leased", "stranded", "backoff", "limit", "deferred", "later", "due"]


@dataclass(frozen=True, slots=True)
class Waiting:
    """``kind``: leased (a pass in flight, ``at`` its lease's expiry), stranded (the
    lease expired at ``at`` and nobody took it over yet), backoff (a failed pass is
    retried at ``at``), limit (the last pass ended because a rate limit's token was
    further away than its budget: due again at ``at``, when the token is), deferred
    (a pass raised ``RetryAfter``: due again at ``at``),
    later (the run is due again at ``at`` for another reason:
    a pass asked to wait, or it was started to start later), due (``at``: since
    when it waits for a driver).
    ``reason`` says why, in a few words."""

    kind: WaitKind
    at: datetime
    reason: str

    def seconds_from(self, now: datetime) -> float:
        return (self.at - now).total_seconds()


def waiting_of(run: JobRun, now: datetime) -> Waiting | None:
    """What ``run`` waits for as of ``now``; ``None`` for a run that ended."""
    if run.status != "running":  # JobRun, read by people: not the row rule is_live
        return None
    if run.lease_expires_at is not None:
        if run.lease_expires_at > now:
            return Waiting("leased", run.lease_expires_at, "a pass is in flight")
        return Waiting("stranded", run.lease_expires_at, "its holder stopped renewing")
    due = run.next_attempt_at
    if due is not None and due > now:
        limit = rate_limit_of_deferral(run.deferred_reason) if run.deferrals else None
        if limit is not None:
            return Waiting("limit", due, f"rate limit {limit!r}: no token within the pass budget")
        if run.deferrals:
            why = f"Retry-After: {run.deferred_reason}" if run.deferred_reason else "Retry-After"
            return Waiting("deferred", due, why)
        if run.attempts > 0 and run.last_error:
            reason = f"backoff after failed attempt {run.attempts}"
            return Waiting("backoff", due, reason)
        if starts_later_at(run) is not None:
            return Waiting("later", due, "started to start later (start_at or delay_s)")
        return Waiting("later", due, "the last pass asked to wait")
    since = due if due is not None else run.started_at
    return Waiting("due", since, "waiting for a free driver")
