"""Claims and takeovers as pure functions: which run a claim gets and what it
writes, decided from rows with no store (``jobrun/_core/leases/claims.py``)."""

from __future__ import annotations

from dataclasses import replace

from jobrun._core.leases.claims import Claimed, PreviousHolder, claim_candidate, claim_transition
from jobrun._core.model.records import ClaimRequest, RunRow
from tests.support import hand_made_row

NOW = "2026-01-01T00:00:10.000Z"
LATER = "2026-01-01T00:01:10.000Z"


def _row(**fields: object) -> RunRow:
    """A due running run of job ``m``/``j`` with two attempts and an error behind it."""
    base = hand_made_row(1, module_id="m", job="j", at="2026-01-01T00:00:00.000Z")
    earlier: dict[str, object] = {"id": "r1", "attempts": 2, "last_error": "ValueError: earlier"}
    return replace(base, **(earlier | fields))


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
