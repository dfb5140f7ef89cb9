"""``jobrun.RetryAfter`` itself: what its constructor accepts, refuses and cuts, and
the job option that caps deferrals in a row (the passes it defers are tested in
tests/contract/test_deferral.py)."""

from __future__ import annotations

from typing import Any

import pytest

import jobrun

MODULE, JOB = "@test/jobs", "later"


@pytest.mark.parametrize(
    ("seconds", "reason", "kind"),
    [
        (True, "", jobrun.ArgumentTypeError),
        ("5", "", jobrun.ArgumentTypeError),
        (None, "", jobrun.ArgumentTypeError),
        (-1, "", jobrun.JobValidationError),
        (float("nan"), "", jobrun.JobValidationError),
        (float("inf"), "", jobrun.JobValidationError),
        (1, 42, jobrun.ArgumentTypeError),
    ],
)
def test_bad_arguments_are_refused_by_the_constructor(
    seconds: Any, reason: Any, kind: type[Exception]
) -> None:
    with pytest.raises(kind) as refused:
        jobrun.RetryAfter(seconds, reason)
    assert refused.value.errors[0]["path"] in ("seconds", "reason")  # type: ignore[attr-defined]


def test_a_long_delay_is_cut_to_30_days_and_the_reason_to_one_short_line() -> None:
    deferral = jobrun.RetryAfter(10**400, reason="line one\nline\x00two " + "x" * 500)
    assert deferral.seconds == jobrun.errors.MAX_RETRY_AFTER_S == 30 * 24 * 3600
    assert deferral.reason.startswith("line one line two xxx")
    assert len(deferral.reason) == 200
    assert deferral.reason.endswith("...")
    assert deferral.code == "deferred"
    assert isinstance(deferral, jobrun.JobRunError)
    assert str(jobrun.RetryAfter(2.5, "quota")) == "retry after 2.5 s: quota"


@pytest.mark.parametrize(("value", "kind"), [(-1, ValueError), (True, TypeError), (1.5, TypeError)])
def test_max_deferrals_is_checked_at_registration(value: Any, kind: type[Exception]) -> None:
    with pytest.raises(kind):
        jobrun.JobRegistry().register(MODULE, JOB, lambda p: None, max_deferrals=value)
