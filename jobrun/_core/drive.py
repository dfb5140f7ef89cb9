"""The bounded driver: find due runs and give each up to ``max_passes`` passes."""

from __future__ import annotations

import random as random_module
from collections.abc import Callable

from jobrun._core.formats import Clock, format_instant, system_clock
from jobrun._core.passes import OpenScope, run_job_pass
from jobrun._core.port import JobRunStore
from jobrun._core.records import DriveError, JobDriveReport, JobRunStatus, RunRow
from jobrun._core.registry import JobRegistry, RegisteredJob
from jobrun.errors import JobValidationError

JOB_DRIVE_LIMIT = 50
JOB_DRIVE_SCAN_MAX = 500


def _check_count(value: object, argument: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{argument} must be an int, got {type(value).__name__}")
    return value


async def _collect(
    store: JobRunStore, registry: JobRegistry, limit: int, clock: Clock
) -> list[tuple[RunRow, RegisteredJob]]:
    """Up to ``limit`` due runs this host can run, oldest first.

    Runs of jobs this host does not register are passed over without a write
    (another deployment may own them); paging stops after about 500 rows.
    """
    runnable: list[tuple[RunRow, RegisteredJob]] = []
    scanned = 0
    after_id: str | None = None
    while len(runnable) < limit and scanned < JOB_DRIVE_SCAN_MAX:
        page = await store.due(format_instant(clock()), limit, after_id)
        if not page:
            break
        scanned += len(page)
        for row in page:
            registered = registry.get(row.module_id, row.job)
            if registered is not None and len(runnable) < limit:
                runnable.append((row, registered))
        after_id = page[-1].id
        if len(page) < limit:
            break
    return runnable


async def run_due_jobs(
    store: JobRunStore,
    registry: JobRegistry,
    *,
    limit: int = JOB_DRIVE_LIMIT,
    max_passes: int = 1,
    open_scope: OpenScope | None = None,
    clock: Clock = system_clock,
    random: Callable[[], float] = random_module.random,
    pass_timeout_s: float | None = None,
) -> JobDriveReport:
    """Advance up to ``limit`` due runs by up to ``max_passes`` passes each.

    A run's failure is recorded on the run and reported, never raised; only the
    store's own failures (a lost database) escape. Runs are driven one after the
    other, oldest first; leftovers stay due for the next call.
    """
    _check_count(limit, "limit")
    if limit < 1:
        raise JobValidationError(
            f"limit must be at least 1, got {limit}", [{"path": "limit", "message": "below 1"}]
        )
    passes = max(1, _check_count(max_passes, "max_passes"))
    if pass_timeout_s is not None and not pass_timeout_s > 0:
        raise ValueError(f"pass_timeout_s must be positive, got {pass_timeout_s!r}")
    scope_opener: OpenScope = open_scope or (lambda _run: store.default_scope)
    report = JobDriveReport()
    for row, registered in await _collect(store, registry, limit, clock):
        report.attempted += 1
        current = row
        ledger_known_empty = False
        for number in range(passes):
            outcome = await run_job_pass(
                store=store,
                row=current,
                handler=registered.handler,
                retry=registered.retry,
                clock=clock,
                random=random,
                open_scope=scope_opener,
                timeout_s=pass_timeout_s,
                ledger_known_empty=ledger_known_empty,
            )
            if outcome.status != "advanced":
                setattr(report, outcome.status, getattr(report, outcome.status) + 1)
                if outcome.error is not None:
                    report.errors.append(DriveError(current.id, outcome.error))
                break
            report.advanced += 1
            if number + 1 >= passes:
                break
            # Re-read: the next pass resumes from what the store holds, not from memory.
            fresh = await store.get(current.id)
            if fresh is None or fresh.status != JobRunStatus.RUNNING.value:
                break
            current = fresh
            # This driver just dropped the ledger in the commit it made.
            ledger_known_empty = True
    return report
