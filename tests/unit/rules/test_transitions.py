"""The core's transitions as pure functions: what a claim, a cancel, a resume and a
release write, decided from a row with no store (``jobrun/_core/rules/transitions.py``)."""

from __future__ import annotations

from dataclasses import replace

from jobrun._core.leases.renewal import Lease
from jobrun._core.model.records import ClaimRequest, RunRow
from jobrun._core.rules.transitions import (
    Claimed,
    PreviousHolder,
    cancel_transition,
    claim_candidate,
    claim_transition,
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


def _request(token: str = "T", dead: frozenset[str] = frozenset()) -> ClaimRequest:
    return ClaimRequest(NOW, token, "me:1", {("m", "j"): LATER}, dead_owners=dead)


def test_a_fresh_claim_leases_and_charges_nothing():
    claimed = claim_transition(_row(), _request())
    leased = _row(
        lease_owner="T",
        lease_driver="me:1",
        lease_began_at=NOW,
        next_attempt_at=LATER,
        lease_epoch=1,
    )
    assert claimed == Claimed(leased, None)
    assert not claimed.taken_over


def test_every_claim_raises_the_epoch_and_keeps_the_pass_count():
    fresh = claim_transition(_row(lease_epoch=6, passes_committed=4), _request())
    assert (fresh.row.lease_epoch, fresh.row.passes_committed) == (7, 4)
    held = _row(lease_owner="OLD", lease_began_at=NOW, next_attempt_at=NOW, lease_epoch=7)
    taken = claim_transition(held, _request("T2"))
    assert taken.taken_over
    assert taken.row.lease_epoch == 8


def test_taking_over_a_begun_pass_counts_it_and_says_why():
    held = _row(
        lease_owner="OLD",
        lease_driver="gone:7",
        lease_began_at="2026-01-01T00:00:02.000Z",
        next_attempt_at="2026-01-01T00:00:05.000Z",
        lease_takeovers=3,
    )
    claimed = claim_transition(held, _request())
    assert claimed.previous == PreviousHolder("OLD", "gone:7", held.lease_began_at, died=False)
    assert (claimed.row.lease_takeovers, claimed.row.attempts) == (4, 3)
    assert claimed.row.last_error == (
        "the lease of driver gone:7 expired during a pass; the run was taken over"
    )
    assert (claimed.row.lease_owner, claimed.row.next_attempt_at) == ("T", LATER)
    dead = claim_transition(held, _request(dead=frozenset({"OLD"})))
    assert dead.previous is not None
    assert dead.previous.died
    assert dead.row.last_error == (
        "the driver gone:7 died during a pass; the run was taken over at once"
    )


def test_taking_over_a_lease_whose_pass_never_began_charges_no_attempt():
    held = _row(lease_owner="OLD", lease_driver="gone:7", next_attempt_at=NOW)
    claimed = claim_transition(held, _request())
    assert claimed.taken_over
    assert (claimed.row.lease_takeovers, claimed.row.attempts) == (1, 2)
    assert claimed.row.last_error == "ValueError: earlier"


def test_the_claim_candidate_order_and_the_dead_holders_run_first():
    late = _row(id="r1", next_attempt_at="2026-01-01T00:00:09.000Z")
    early = _row(id="r2")
    urgent = _row(id="r3", priority=5, next_attempt_at="2026-01-01T00:00:09.500Z")
    not_due = _row(id="r4", next_attempt_at=LATER)
    assert claim_candidate([late, early, not_due], _request()) == early
    assert claim_candidate([late, early, urgent], _request()) == urgent
    assert claim_candidate([not_due], _request()) is None
    orphan = _row(id="r5", lease_owner="DEAD", next_attempt_at=LATER)
    assert claim_candidate([early, orphan], _request(dead=frozenset({"DEAD"}))) == orphan
    limited = replace(_request(), max_concurrent={("m", "j"): 1})
    held = _row(id="r6", lease_owner="X", next_attempt_at=LATER)
    assert claim_candidate([early, held], limited) is None
    assert claim_candidate([early], replace(_request(), skip_ids=frozenset({"r2"}))) is None


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
