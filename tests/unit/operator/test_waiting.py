"""What a running run waits for, in an operator's words (``jobrun/_core/operator/waiting.py``):
a lease is never shown as a next attempt, and the reason a run is due later is told apart
(a rate limit's token, a ``RetryAfter``, a backoff, a start put off, a pass that asked)."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

import jobrun
from jobrun._core.limits.buckets import too_long_a_wait
from jobrun._core.operator.waiting import waiting_of

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
LATER = NOW + timedelta(seconds=30)
EARLIER = NOW - timedelta(seconds=30)
STARTED = NOW - timedelta(hours=1)


def _run(**fields: Any) -> jobrun.JobRun:
    untouched = jobrun.JobRun(
        id="r", module_id="m", job="j", instance="i", status="running", payload=None,
        cursor=None, counters={}, attempts=0, last_error=None, started_at=STARTED,
        updated_at=STARTED, next_attempt_at=None, ended_at=None,
    )  # fmt: skip
    return dataclasses.replace(untouched, **fields)


@pytest.mark.parametrize("status", ["done", "failed"])
def test_an_ended_run_waits_for_nothing(status: str) -> None:
    assert waiting_of(_run(status=status, ended_at=EARLIER), NOW) is None


def test_a_lease_is_a_pass_in_flight_until_it_expires_then_a_stranded_run() -> None:
    # A leased run's next_attempt_at is its lease's expiry too: never read as a next attempt.
    leased = _run(lease_expires_at=LATER, next_attempt_at=LATER, attempts=2, last_error="E: x")
    waiting = waiting_of(leased, NOW)
    assert waiting is not None
    assert (waiting.kind, waiting.at, waiting.seconds_from(NOW)) == ("leased", LATER, 30.0)
    stranded = waiting_of(dataclasses.replace(leased, lease_expires_at=EARLIER), NOW)
    assert stranded is not None
    assert (stranded.kind, stranded.at) == ("stranded", EARLIER)


def _kind_and_reason(run: jobrun.JobRun) -> tuple[str, str]:
    waiting = waiting_of(run, NOW)
    assert waiting is not None
    assert waiting.at == (run.next_attempt_at or run.started_at)
    return waiting.kind, waiting.reason


def test_a_run_due_later_says_why() -> None:
    token = too_long_a_wait("api", 3).reason
    limit = _run(next_attempt_at=LATER, deferrals=1, deferred_reason=token, passes_committed=1)
    assert _kind_and_reason(limit) == ("limit", "rate limit 'api': no token within the pass budget")
    deferred = dataclasses.replace(limit, deferred_reason="quota")
    assert _kind_and_reason(deferred) == ("deferred", "Retry-After: quota")
    assert _kind_and_reason(dataclasses.replace(limit, deferred_reason=None)) == (
        "deferred",
        "Retry-After",
    )
    # A deferral reason that names a rate limit counts only while a deferral is counted.
    backoff = dataclasses.replace(limit, deferrals=0, attempts=2, last_error="OSError: reset")
    assert _kind_and_reason(backoff) == ("backoff", "backoff after failed attempt 2")
    asked = _run(next_attempt_at=LATER, passes_committed=3)
    assert _kind_and_reason(asked) == ("later", "the last pass asked to wait")
    put_off = _run(next_attempt_at=LATER)
    assert _kind_and_reason(put_off) == ("later", "started to start later (start_at or delay_s)")


def test_a_run_due_now_waits_since_it_was_due_or_started() -> None:
    assert _kind_and_reason(_run(next_attempt_at=EARLIER)) == ("due", "waiting for a free driver")
    assert _kind_and_reason(_run(next_attempt_at=NOW)) == ("due", "waiting for a free driver")
    assert _kind_and_reason(_run()) == ("due", "waiting for a free driver")
