"""``DriveOptions``: every bad value refused once, as a validation error naming its field."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime
from typing import Any

import pytest

import jobrun
from jobrun.testing import FakeClock, MemoryJobRunStore


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("limit", 0),
        ("limit", -1),
        ("limit", True),
        ("limit", 2.0),
        ("limit", "5"),
        ("limit", None),
        ("max_passes", False),
        ("max_passes", 1.5),
        ("max_passes", None),
        ("pass_timeout_s", 0),
        ("pass_timeout_s", -1.0),
        ("pass_timeout_s", float("inf")),
        ("pass_timeout_s", float("nan")),
        ("pass_timeout_s", True),
        ("pass_timeout_s", "5"),
        ("open_scope", "engine"),
        ("driver_name", 7),
        # Named: repr(object()) holds an address, so the id would differ per process.
        pytest.param("observer", object(), id="'observer'-object()"),
        ("clock", "now"),
        ("random", 0.5),
    ],
    ids=lambda value: repr(value),
)
def test_each_bad_value_is_a_validation_error_naming_its_field(field: str, value: Any) -> None:
    with pytest.raises(jobrun.JobValidationError) as caught:
        jobrun.DriveOptions(**{field: value})
    assert caught.value.code == "validation_failed"
    assert caught.value.errors[0]["path"] == field
    assert str(caught.value).startswith(field)


@pytest.mark.parametrize("max_passes", [0, -5])
def test_max_passes_below_one_counts_as_one(max_passes: int) -> None:
    assert jobrun.DriveOptions(max_passes=max_passes).max_passes == 1


def test_the_defaults_and_accepted_values() -> None:
    clock = FakeClock(datetime(2025, 1, 1, tzinfo=UTC))
    options = jobrun.DriveOptions(pass_timeout_s=5, clock=clock, driver_name="d1")
    assert (options.limit, options.max_passes, options.pass_timeout_s) == (50, 1, 5.0)
    assert isinstance(options.pass_timeout_s, float)
    assert options.clock is clock
    assert jobrun.DriveOptions(clock=lambda: datetime(2025, 1, 1, tzinfo=UTC)).clock is not None


def test_options_are_frozen() -> None:
    options = jobrun.DriveOptions()
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.limit = 0
    # A changed copy is judged like a new one.
    with pytest.raises(jobrun.JobValidationError, match="limit"):
        dataclasses.replace(options, limit=0)


async def test_the_driver_refuses_what_is_not_options() -> None:
    store = jobrun.testing.MemoryJobRunStore()
    with pytest.raises(jobrun.JobValidationError, match="options") as caught:
        await jobrun.run_due_jobs(store, jobrun.JobRegistry(), options={"limit": 5})
    assert caught.value.errors[0]["path"] == "options"


@pytest.mark.parametrize(
    ("keywords", "text"),
    [
        ({"observer": 5}, "observer must be a PassObserver, got int"),
        ({"clock": 5}, "clock must be a Clock or a callable returning a datetime, got int"),
        ({"options": 5}, "options must be a DriveOptions, got int"),
    ],
    ids=["observer", "clock", "options"],
)
async def test_a_bad_drive_option_is_named_with_its_type(
    keywords: dict[str, Any], text: str
) -> None:
    with pytest.raises(jobrun.JobValidationError) as caught:
        await jobrun.run_due_jobs(MemoryJobRunStore(), jobrun.JobRegistry(), **keywords)
    assert str(caught.value) == text
