"""A real wall-clock step steals no lease (issue 31 item 3), under libfaketime.

Three driver processes of ``tests/chaos`` (3 s lease, 100-200 ms bodies), the
wall clock stepped while a body runs and the monotonic clock left alone: the
whole host +90 s and -90 s on SQLite, one client +90 s and the holder -90 s on
Postgres. The referee, reading the bodies' own log on the monotonic clock, finds
no two bodies of one run at once, and every run finishes. Before the change, the
+90 s cases and the holder's -90 s case each overlapped (the stepped claimer took
the live lease, or the holder renewed to an expiry already past).

The drivers call ``run_due_jobs`` in a loop, except in the two ``-worker`` cases
(the whole host +90 s on SQLite, one client +90 s on Postgres), where each is a
real ``jobrun worker`` process (``tests/processes/chaos_worker.py``), as in the
issue's report.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.chaos.clock_steps import (
    ClockStep,
    clock_steps,
    faketime_missing,
)
from tests.chaos.stage import assert_a_clean_scenario
from tests.support import IN_CI

POSTGRES_URL = os.environ.get("JOBRUN_TEST_POSTGRES_URL", "")


def _cases() -> list[object]:
    cases: list[object] = []
    for fault in clock_steps():
        for backend in fault.backends:
            marks = [pytest.mark.postgres] if backend == "postgres" else []
            name = f"{fault.whom}{fault.seconds:+d}-{backend}{fault.suffix}"
            cases.append(pytest.param(fault, backend, id=name, marks=marks))
    return cases


@pytest.mark.chaos
@pytest.mark.timeout(120)
@pytest.mark.parametrize(("fault", "backend"), _cases())
async def test_a_stepped_wall_clock_overlaps_no_bodies(
    fault: ClockStep, backend: str, tmp_path: Path
) -> None:
    missing = faketime_missing()
    if missing:
        # Under CI a missing libfaketime is a failure (.ci/run installs it); elsewhere
        # the test says what to install.
        if IN_CI:
            pytest.fail(missing)
        pytest.skip(missing)
    await assert_a_clean_scenario(fault, backend, POSTGRES_URL, tmp_path)
