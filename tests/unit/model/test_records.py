"""The records jobrun hands back: a run's status and fields, a drive's report, a run's key,
and the bound on a list of runs."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

import jobrun


def field_names(cls: Any) -> set[str]:
    return {field.name for field in dataclasses.fields(cls)}


def test_job_run_status_members_are_their_strings() -> None:
    assert [member.value for member in jobrun.JobRunStatus] == ["running", "done", "failed"]
    assert jobrun.JobRunStatus.RUNNING == "running"
    assert jobrun.JobRunStatus.DONE == "done"
    assert jobrun.JobRunStatus.FAILED == "failed"
    assert str(jobrun.JobRunStatus.FAILED) == "failed"
    assert jobrun.JobRunStatus("done") is jobrun.JobRunStatus.DONE


def test_job_run_has_the_operator_fields() -> None:
    assert field_names(jobrun.JobRun) >= {
        "id",
        "module_id",
        "job",
        "instance",
        "status",
        "payload",
        "cursor",
        "counters",
        "attempts",
        "last_error",
        "started_at",
        "updated_at",
        "next_attempt_at",
        "ended_at",
        "decode_error",
    }


def test_job_drive_report_counts_outcomes() -> None:
    assert field_names(jobrun.JobDriveReport) >= {
        "attempted",
        "advanced",
        "completed",
        "retrying",
        "failed",
        "errors",
    }
    report = jobrun.JobDriveReport()
    assert (report.attempted, report.advanced, report.completed) == (0, 0, 0)
    assert (report.retrying, report.failed, report.errors) == (0, 0, [])
    assert jobrun.JobDriveReport().errors is not report.errors
    assert field_names(jobrun.DriveError) >= {"run_id", "error"}


def test_run_key_has_the_id_and_the_coalescing_key() -> None:
    assert field_names(jobrun.RunKey) == {"id", "module_id", "job", "instance"}


# How it clamps numbers: test_job_run_list_limit_clamps in tests/contract/test_operator_read.py.
@pytest.mark.parametrize("bad", [True, False, "5", [5]], ids=repr)
def test_job_run_list_limit_refuses_non_numbers(bad: Any) -> None:
    with pytest.raises(TypeError, match="limit"):
        jobrun.job_run_list_limit(bad)
