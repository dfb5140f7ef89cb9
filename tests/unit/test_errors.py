"""The errors (``jobrun/errors.py``): one root, a code each (documented in the module's table),
messages that read as sentences, and what ``RetryAfter``'s constructor accepts, refuses and
cuts (the passes it defers are tested in tests/contract/test_deferral.py)."""

from __future__ import annotations

import inspect
import re
from typing import Any

import pytest

import jobrun
import jobrun.errors

EXPECTED_CODES = {
    "JobValidationError": "validation_failed",
    "ArgumentTypeError": "validation_failed",
    "HandlerMistakeError": "handler_mistake",
    "JobConflictError": "conflict",
    "StepReusedError": "conflict",
    "StepFailedError": "step_failed",
    "StepTimeoutError": "step_timeout",
    "PassTimeoutError": "pass_timeout",
    "SchemaOutdatedError": "schema_outdated",
    "CodeOutdatedError": "code_outdated",
    "StoreError": "store_failed",
    "LeaseLostError": "lease_lost",
    "JobRunNotFoundError": "not_found",
    "RetryAfter": "deferred",
}


def error_classes() -> dict[str, type[BaseException]]:
    return {
        name: value
        for name, value in vars(jobrun.errors).items()
        if inspect.isclass(value)
        and issubclass(value, BaseException)
        and value.__module__ == "jobrun.errors"
    }


def test_every_error_class_derives_from_the_root_and_is_exported() -> None:
    classes = error_classes()
    assert set(classes) == set(EXPECTED_CODES) | {"JobRunError"}
    assert set(classes) == set(jobrun.errors.__all__)
    for error in classes.values():
        assert issubclass(error, jobrun.JobRunError)


def test_each_error_has_its_code_and_the_codes_are_documented() -> None:
    classes = error_classes()
    module_doc = jobrun.errors.__doc__ or ""
    for name, code in EXPECTED_CODES.items():
        error = classes[name]
        assert error.code == code  # type: ignore[attr-defined]
        assert error.__doc__, f"{name} has no docstring"
        assert re.search(rf"{name}\s+{code}\b", module_doc), f"{name}/{code} not in the table"


def test_codes_are_distinct_apart_from_the_conflict_subtype() -> None:
    direct = [
        error.code  # type: ignore[attr-defined]
        for error in error_classes().values()
        if error.__bases__[0] is jobrun.JobRunError
    ]
    subtypes = {"handler_mistake", "step_timeout"}
    assert sorted(direct) == sorted(set(EXPECTED_CODES.values()) - subtypes)
    assert issubclass(jobrun.StepReusedError, jobrun.JobConflictError)
    # A step that timed out is a failed attempt, with a code of its own.
    assert jobrun.StepTimeoutError.__bases__ == (jobrun.StepFailedError,)
    # A handler mistake is refused input too, with a code of its own.
    assert jobrun.HandlerMistakeError.__bases__ == (jobrun.JobValidationError,)


def test_validation_errors_are_value_errors_with_entries() -> None:
    error = jobrun.JobValidationError("bad", [{"path": "payload", "message": "a bytes"}])
    assert isinstance(error, ValueError)
    assert error.code == "validation_failed"
    assert error.errors == [{"path": "payload", "message": "a bytes"}]
    assert str(error) == "bad"


def test_conflicts_carry_a_reason() -> None:
    assert jobrun.JobConflictError("taken", "some_reason").reason == "some_reason"
    reused = jobrun.StepReusedError("fetch")
    assert (reused.code, reused.reason, reused.step) == ("conflict", "job_step_reused", "fetch")
    assert "fetch" in str(reused)


def test_the_other_errors_read_as_sentences() -> None:
    policy = jobrun.RetryPolicy()
    step = jobrun.StepFailedError("fetch-page-3", 2, policy, "TimeoutError: upstream timed out")
    assert str(step) == "step 'fetch-page-3' failed: TimeoutError: upstream timed out"
    assert (step.step, step.attempts, step.policy) == ("fetch-page-3", 2, policy)
    assert "2.5 s" in str(jobrun.PassTimeoutError(2.5))
    outdated = jobrun.SchemaOutdatedError(None, "0001")
    assert "upgrade" in str(outdated)
    assert "0001" in str(outdated)
    cause = OSError("disk full\nsecond line")
    store = jobrun.StoreError("commit", cause)
    assert str(store) == "commit failed: OSError: disk full"


def test_describe_exception_names_the_type_of_foreign_errors() -> None:
    assert jobrun.errors.describe_exception(KeyError("x")) == "KeyError: 'x'"
    assert jobrun.errors.describe_exception(RuntimeError()) == "RuntimeError"
    assert jobrun.errors.describe_exception(jobrun.StepReusedError("s")) == str(
        jobrun.StepReusedError("s")
    )


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
