"""Drive until idle: every due pass, the test clock moved through the waits, until none is left."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from jobrun._api import run_due_jobs
from jobrun._core import (
    PARKED_AT,
    DriveError,
    JobRegistry,
    JobRunStatus,
    PassEnd,
    PassStart,
    PassWatch,
    RunFilter,
    StepEnd,
    due_at,
    format_instant,
    is_due,
    is_paused,
    parse_instant,
)
from jobrun._testing.clock import FakeClock
from jobrun._testing.crash import CrashAfter, CrashingStore, SimulatedCrash

MAX_DRIVES = 1000


@dataclass(frozen=True, slots=True)
class PassRecord:
    """One pass as the kit saw it: how it ended and what each step did."""

    end: PassEnd
    steps: tuple[StepEnd, ...]

    def ran(self) -> list[str]:
        """Steps whose body ran in this pass."""
        return [step.name for step in self.steps if step.outcome == "ran"]

    def memo_hits(self) -> list[str]:
        """Steps answered from the ledger (their body did not run again)."""
        return [step.name for step in self.steps if step.outcome == "memo"]


@dataclass(slots=True)
class IdleReport:
    """What :func:`drive_until_idle` did, pass by pass."""

    drives: int = 0
    crashes: int = 0
    advanced_s: float = 0.0
    passes: list[PassRecord] = field(default_factory=list)
    errors: list[DriveError] = field(default_factory=list)

    def outcomes(self) -> list[str]:
        """Each pass's outcome in order: ``advanced``, ``completed``, ``retrying``,
        ``failed``, ``superseded``, ``deferred`` or ``interrupted`` (a crash)."""
        return [record.end.outcome for record in self.passes]


class _Recorder:
    """Observer collecting every pass and its steps."""

    def __init__(self, report: IdleReport) -> None:
        self._report = report

    def pass_started(self, start: PassStart) -> PassWatch:
        return _PassRecorder(self._report)


class _PassRecorder:
    def __init__(self, report: IdleReport) -> None:
        self._report = report
        self._steps: list[StepEnd] = []

    def step_started(self, name: str) -> None:
        pass

    def step_ended(self, end: StepEnd) -> None:
        self._steps.append(end)

    def pass_ended(self, end: PassEnd) -> None:
        self._report.passes.append(PassRecord(end, tuple(self._steps)))


async def _next_due_s(store: Any, registry: JobRegistry, clock: FakeClock) -> float | None:
    """Seconds until the earliest live run of a registered job is due, if any is waiting."""
    rows = await store.list(RunFilter(status=JobRunStatus.RUNNING.value, limit=10_000))
    now_at = format_instant(clock.now())
    # A paused run (or one waiting for a paused limit) waits for an unpause, not a time.
    waiting = [
        due_at(row)
        for row in rows
        if (row.module_id, row.job) in registry
        and not is_due(row, now_at)
        and not is_paused(row)
        and due_at(row) != PARKED_AT
    ]
    if not waiting:
        return None
    return (parse_instant(min(waiting)) - clock.now()).total_seconds()


async def drive_until_idle(
    store: Any,
    registry: JobRegistry,
    *,
    clock: FakeClock | None = None,
    crash: CrashAfter | None = None,
    max_drives: int = MAX_DRIVES,
    **options: Any,
) -> IdleReport:
    """Call ``run_due_jobs`` until no run of ``registry`` is due, now or later.

    With a :class:`FakeClock` the clock is moved to each retry's backoff, a
    deferral's delay or a dead pass's lease expiry, so retries, deferrals and
    takeovers run without waiting; without one, only what is due now is driven.
    ``crash`` kills the first pass that records that many steps (like a killed
    process: its lease stays held); the run is then taken over when the lease
    expires, and its replay shows which steps were memo hits. ``options`` go to
    ``run_due_jobs`` (``max_passes``, ``pass_timeout_s``, ``open_scope``...).
    Raises ``RuntimeError`` after ``max_drives`` drives, so a job that never
    settles fails the test.
    """
    report = IdleReport()
    observer = _Recorder(report)
    crashing = CrashingStore(store, crash) if crash is not None else None
    while report.drives < max_drives:
        report.drives += 1
        target = crashing if crashing is not None and not crashing.crashed else store
        try:
            drive = await run_due_jobs(target, registry, clock=clock, observer=observer, **options)
        except SimulatedCrash:
            report.crashes += 1
            continue
        report.errors.extend(drive.errors)
        if drive.attempted:
            continue
        wait_s = None if clock is None else await _next_due_s(store, registry, clock)
        if wait_s is None or clock is None:
            return report
        clock.advance(seconds=wait_s)
        report.advanced_s += wait_s
    raise RuntimeError(f"still not idle after {max_drives} drives; does a job never finish?")
