"""The chaos check (issue 21): the quick set of faults, injected into real drivers.

Each case runs one scenario of ``tests/chaos`` (three driver processes, two
runs of 100-200 ms step bodies, a 3 s lease, one fault) and asks the referee,
which reads the bodies' own log, for the promise: no two bodies of one run
executed at the same time, every run finished, and no run failed (none of
their bodies ever raises). ``make chaos`` runs the same scenarios and more
(Postgres restarts, disk full, on a throwaway cluster) and prints the figures.

Before the lease changes of issue 21, the presence, idle-timeout, proxy-cut and
SQLite-lock cases broke the promise (overlapping bodies in every run; see
``docs/explanation/promises.md``).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.chaos.faults import (
    BlackholedConnection,
    IdleSessionTimeout,
    KillHolder,
    ProxyCut,
    SqliteLocked,
    StopHolder,
    TerminatePresence,
)
from tests.chaos.idle_survivor import IdleSurvivor
from tests.chaos.stage import Fault, assert_a_clean_scenario
from tests.support import REPO

POSTGRES_URL = os.environ.get("JOBRUN_TEST_POSTGRES_URL", "")
POSTGRES = pytest.mark.postgres


def case(fault: Fault, backend: str, *marks: pytest.MarkDecorator) -> object:
    marks += (POSTGRES,) if backend == "postgres" else ()
    label = getattr(fault, "case_id", type(fault).__name__)
    return pytest.param(fault, backend, id=f"{label}-{backend}", marks=marks)


QUICK = [
    case(KillHolder(), "sqlite"),
    case(KillHolder(), "postgres"),
    case(IdleSurvivor(), "sqlite"),
    case(IdleSurvivor(), "postgres"),
    case(StopHolder(), "sqlite"),
    case(StopHolder(), "postgres"),
    case(TerminatePresence(), "postgres"),
    case(IdleSessionTimeout(1, "database"), "postgres"),
    case(ProxyCut(), "postgres"),
    case(BlackholedConnection(), "postgres"),
    case(SqliteLocked(10, quick=True), "sqlite"),
]


@pytest.mark.chaos
@pytest.mark.timeout(90)
@pytest.mark.parametrize(("fault", "backend"), QUICK)
async def test_no_two_bodies_of_a_run_overlap_and_no_run_is_lost(
    fault: Fault, backend: str, tmp_path: Path
) -> None:
    await assert_a_clean_scenario(fault, backend, POSTGRES_URL, tmp_path)


@pytest.mark.chaos
@pytest.mark.timeout(120)
def test_the_runner_writes_the_table(tmp_path: Path) -> None:
    """``python -m tests.chaos`` (``make chaos``): one scenario, its row in the table
    the promises page shows, and the JSON records beside it."""
    out = tmp_path / "chaos-results"
    command = [sys.executable, "-m", "tests.chaos", "--only", "kill -9 holder mid-step sqlite"]
    command += ["--out", str(out)]
    done = subprocess.run(
        command, cwd=REPO, capture_output=True, text=True, timeout=110, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    header, blank, columns, _rule, row, *more = out.with_suffix(".md").read_text().splitlines()
    assert header.startswith("Chaos run of ")
    assert (blank, more) == ("", [])
    assert columns.startswith("| scenario | backend | overlaps |")
    assert row.startswith("| kill -9 holder mid-step | sqlite | 0 | ")
    assert out.with_suffix(".json").exists()
