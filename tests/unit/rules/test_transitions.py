"""The core's transitions as pure functions: what a cancel, a resume, a release and
the end of a pass write, decided from a row with no store
(``jobrun/_core/rules/transitions.py``; a claim's, in tests/unit/leases/test_claims.py)."""

from __future__ import annotations

from dataclasses import replace

from jobrun._core.leases.renewal import Lease
from jobrun._core.model.records import RunRow
from jobrun._core.rules.transitions import (
    cancel_transition,
    committed_patch,
    deferred_patch,
    failed_patch,
    pass_failure_patch,
    patched,
    release_transition,
    resume_transition,
)

NOW = "2026-01-01T00:00:10.000Z"
LATER = "2026-01-01T00:01:10.000Z"


def _row(**fields: object) -> RunRow:
    base = RunRow(
        id="r1",
        module_id="m",
        job="j",
        instance="i",
        payload="{}",
        status="running",
        cursor='"c"',
        counters="{}",
        attempts=2,
        last_error="ValueError: earlier",
        started_at="2026-01-01T00:00:00.000Z",
        updated_at="2026-01-01T00:00:01.000Z",
        next_attempt_at=None,
        ended_at=None,
    )
    return replace(base, **fields)


def test_operator_changes_apply_only_under_their_condition():
    held = _row(lease_owner="T", lease_driver="me:1", lease_began_at=NOW, next_attempt_at=LATER)
    cancel = cancel_transition("cancelled: stop", NOW)
    assert cancel.applies_to(held)
    cancelled = cancel.applied(held)
    assert (cancelled.status, cancelled.last_error, cancelled.ended_at) == (
        "failed",
        "cancelled: stop",
        NOW,
    )
    assert (cancelled.lease_owner, cancelled.next_attempt_at, cancelled.cursor) == (
        None,
        None,
        '"c"',
    )
    assert not cancel.applies_to(cancelled)

    resume = resume_transition(LATER, counters='{"n": 1}')
    assert not resume.applies_to(held)
    resumed = resume.applied(replace(cancelled, lease_takeovers=2))
    assert (resumed.status, resumed.attempts, resumed.lease_takeovers) == ("running", 0, 0)
    assert (resumed.ended_at, resumed.updated_at, resumed.counters) == (None, LATER, '{"n": 1}')
    assert resume_transition(LATER).applied(cancelled).counters == "{}"

    release = release_transition()
    assert release.applies_to(held)
    assert not release.applies_to(_row()), "no lease held: nothing to release"
    released = release.applied(held)
    assert (released.lease_owner, released.next_attempt_at, released.attempts) == (None, None, 2)


def test_a_deferral_gives_the_run_back_due_later_charging_nothing():
    held = _row(lease_owner="T", lease_driver="me:1", lease_began_at=NOW, next_attempt_at=LATER,
                lease_takeovers=1, lease_epoch=4, passes_committed=3, deferrals=2)  # fmt: skip
    after = patched(held, deferred_patch(held, "quota", NOW, LATER))
    assert after == replace(
        held,
        lease_owner=None,
        lease_driver=None,
        lease_began_at=None,
        updated_at=NOW,
        next_attempt_at=LATER,
        deferrals=3,
        deferred_reason="quota",
    )


def test_a_commit_or_a_failure_ends_the_deferrals_in_a_row():
    held = _row(lease_owner="T", deferrals=4, deferred_reason="quota")
    lease = Lease("T", "me:1", 60_000)
    ends = [
        committed_patch(held, None, "{}", False, NOW, lease, None, 1),
        pass_failure_patch(held, "boom", NOW, LATER),
        pass_failure_patch(held, "boom", NOW, None),
        failed_patch(held, "too many", NOW),
    ]
    assert [(end.deferrals, end.deferred_reason) for end in ends] == [(0, None)] * 4
    for change in (cancel_transition("stop", NOW), resume_transition(NOW)):
        assert {"deferrals": 0, "deferred_reason": None}.items() <= dict(change.values).items()
