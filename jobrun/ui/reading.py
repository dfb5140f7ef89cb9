"""The pages that only read: runs, one run (and its live fragment), health."""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from jobrun._core import (
    COUNT_CAP,
    DUE_KINDS,
    STRANDED,
    JobRun,
    JobRunStatus,
    Poll,
    StepRow,
    Waiting,
    driver_name,
    format_instant,
    is_number,
    job_run_of,
    parse_holder,
    parse_instant,
    progress_of,
    served_jobs,
    waiting_of,
    waits_for_no_one,
)
from jobrun.ui.databases import DATABASE_FAILURES, Database, revisions_of, upgrade_command
from jobrun.ui.filtering import PAGE_SIZE, STATUS_CHOICES, RunsFilter
from jobrun.ui.state import console_of, database_of, failure_text
from jobrun.ui.views import instant

FAILED_RECENTLY = timedelta(hours=1)
_MAX_ID = 200


def _now() -> datetime:
    return datetime.now(UTC)


async def _status_counts(
    database: Database, runs_filter: RunsFilter, now: datetime
) -> dict[str, int]:
    counts = {}
    for status in STATUS_CHOICES:
        query = runs_filter.with_status(status).query(now)
        counts[status] = await database.store.count(query, COUNT_CAP)
    return counts


async def runs_page(request: Request) -> Response:
    console = console_of(request)
    await console.guard.require_view(request)
    database = database_of(request)
    runs_filter = RunsFilter.of(request.query_params)
    before = request.query_params.get("before", "")[:_MAX_ID] or None
    problems = runs_filter.problems()
    if before is not None and "\x00" in before:
        problems.append("before must be a run id")
    context: dict[str, Any] = {
        "db": request.path_params["db"],
        "database": database,
        "filter": runs_filter,
        "statuses": STATUS_CHOICES,
        "problems": problems,
        "runs": [],
        "counts": {},
        "older": None,
        "before": before,
        "error": None,
    }
    if not context["problems"]:
        now = _now()
        try:
            # One row more than shown says whether an older page exists, with no count.
            rows = await database.store.find(
                runs_filter.query(now, before_id=before, limit=PAGE_SIZE + 1)
            )
            context["counts"] = await _status_counts(database, runs_filter, now)
            shown = rows[:PAGE_SIZE]
            context["runs"] = await _flagged(
                database, [run_line(job_run_of(row), now) for row in shown], now
            )
        except DATABASE_FAILURES as error:
            context["error"] = failure_text(error, database)
        else:
            if len(rows) > PAGE_SIZE:
                context["older"] = runs_filter.encoded(before=shown[-1].id)
    status = 400 if context["problems"] else 200
    return await console.pages.render(request, "runs.html", context, status)


@dataclass(frozen=True, slots=True)
class RunLine:
    """One run as the runs list shows it (``unserved``: due, and no live worker
    registers its job)."""

    run: JobRun
    progress: tuple[str, float, float] | None
    duration_s: float
    waiting: Waiting | None
    wait_s: float | None
    unserved: bool = False


async def _flagged(database: Database, lines: list[RunLine], now: datetime) -> list[RunLine]:
    """``lines`` with the due runs no live worker takes flagged; the workers are read only
    when a line is due."""
    if not any(line.waiting is not None and line.waiting.kind in DUE_KINDS for line in lines):
        return lines
    served = served_jobs(await database.store.live_workers(format_instant(now)))
    return [
        replace(line, unserved=True) if waits_for_no_one(line.run, now, served) else line
        for line in lines
    ]


def run_line(run: JobRun, now: datetime) -> RunLine:
    ended = run.ended_at or now
    waiting = waiting_of(run, now)
    return RunLine(
        run,
        progress_of(run.counters),
        max(0.0, (ended - run.started_at).total_seconds()),
        waiting,
        None if waiting is None else waiting.seconds_from(now),
    )


def _previous(run: JobRun, given: str | None) -> Poll | None:
    """The poll the browser saw last (sent back as JSON), to compute rates against."""
    if not given or len(given) > 20_000:
        return None
    try:
        seen = json.loads(given)
        at = float(seen["at"])
        counters = {
            str(name): value
            for name, value in dict(seen["counters"]).items()
            if is_number(value) and math.isfinite(value)
        }
    except (ValueError, TypeError, KeyError, RecursionError):
        return None
    if not math.isfinite(at):
        return None
    return Poll(replace(run, counters=counters), at)


def _live_context(run: JobRun, steps: dict[str, StepRow], given: str | None) -> dict[str, Any]:
    at = time.time()
    previous = _previous(run, given)
    poll = previous.follow(run, at) if previous is not None else Poll(run, at)
    progress = progress_of(run.counters)
    now = _now()
    waiting = waiting_of(run, now)
    return {
        "run": run,
        "steps": list(steps.values()),
        "rates": _meaningful_rates(poll, previous is not None, progress),
        "holder": parse_holder(run.lease_driver),
        "holder_name": driver_name(run.lease_driver) if run.lease_driver else None,
        "waiting": waiting,
        "wait_s": None if waiting is None else waiting.seconds_from(now),
        "progress": progress,
        "remaining_s": _remaining_s(poll, progress),
        "poll_state": json.dumps({"at": at, "counters": run.counters}),
        "now": now,
        "lease_left_s": (
            (run.lease_expires_at - now).total_seconds() if run.lease_expires_at else None
        ),
        "running": run.status == JobRunStatus.RUNNING,
        "deferred_text": waiting_text(run),
    }


def _meaningful_rates(
    poll: Poll, compared: bool, progress: tuple[str, float, float] | None
) -> dict[str, float | None]:
    """The rates worth showing: only between two reads of a running run, and not for
    the total a progress bar measures against (``None``: show none)."""
    if not compared or poll.run.status != JobRunStatus.RUNNING:
        return {}
    return dict(poll.work_rates())


def waiting_text(run: JobRun) -> str | None:
    """The text "waiting until <instant> (Retry-After: <reason>)" while a run waits out the
    delay its last pass asked for (``RetryAfter``); else ``None``."""
    if run.status != JobRunStatus.RUNNING or run.lease_driver is not None:
        return None
    if not run.deferrals or run.next_attempt_at is None:
        return None
    why = f"Retry-After: {run.deferred_reason}" if run.deferred_reason else "Retry-After"
    return f"waiting until {instant(run.next_attempt_at)} ({why})"


def _remaining_s(poll: Poll, progress: tuple[str, float, float] | None) -> float | None:
    if progress is None or poll.run.status != JobRunStatus.RUNNING:
        return None
    name, done, total = progress
    rate = poll.rates.get(name, 0.0)  # all rates, the shown ones or not
    return (total - done) / rate if rate > 0 and done < total else None


async def _run_context(request: Request) -> dict[str, Any]:
    database = database_of(request)
    run_id = request.path_params["run_id"][:_MAX_ID]
    context: dict[str, Any] = {
        "db": request.path_params["db"],
        "database": database,
        "run_id": run_id,
        "run": None,
        "error": None,
        "notice": _NOTICES.get(request.query_params.get("notice", "")),
    }
    if "\x00" in run_id:  # no id holds one, and Postgres text cannot
        return context
    try:
        row = await database.store.get(run_id)
        steps = await database.store.steps(run_id) if row is not None else {}
    except DATABASE_FAILURES as error:
        context["error"] = failure_text(error, database)
        return context
    if row is not None:
        context |= _live_context(job_run_of(row), steps, request.query_params.get("prev"))
    return context


_NOTICES = {
    "cancelled": "Cancelled.",
    "paused": "Paused: no driver takes the run until it is unpaused (a pass in flight "
    "stops at its next step).",
    "unpaused": "Unpaused: the run is due again.",
    "resumed": "Resumed: the run is due again from its committed cursor.",
    "released": "Lease released: any driver may take the run now.",
    "not-released": "The run held no lease; nothing was released.",
    "started": "Started again: this is the new run of the same key.",
    "joined": "A run of this key was already live: this is it.",
}


async def run_page(request: Request) -> Response:
    return await _run_response(request, "run.html")


async def run_live(request: Request) -> Response:
    """The changing part of the run page, fetched by the page's script while it runs."""
    return await _run_response(request, "run_live.html")


async def _run_response(request: Request, template: str) -> Response:
    """One run through ``template``; 404 when there is no such run."""
    console = console_of(request)
    await console.guard.require_view(request)
    context = await _run_context(request)
    status = 404 if context["run"] is None and context["error"] is None else 200
    return await console.pages.render(request, template, context, status)


async def _database_health(database: Database, now: datetime) -> dict[str, Any]:
    part: dict[str, Any] = {
        "database": database,
        "error": None,
        "jobs": [],
        "revisions": None,
        "upgrade": upgrade_command(database),
        "limits": None,
        "versions": {},
        "workers": 0,
        "served": {},
        "paused": 0,
        "paused_jobs": {},
        "paused_limits": {},
    }
    try:
        part["revisions"] = await revisions_of(database)
        workers = await database.store.live_workers(format_instant(now))
        part["workers"], part["served"] = len(workers), served_jobs(workers)
        loads = await database.store.job_loads(
            format_instant(now), format_instant(now - FAILED_RECENTLY)
        )
        part["limits"] = await database.store.limit_usage(format_instant(now))
        # Revision 0009: what operators paused (runs, jobs, limit keys).
        part["paused"] = (await database.store.health(format_instant(now))).paused
        part["paused_jobs"], part["paused_limits"] = await database.store.pauses()
        # Versioned jobs only: runs of a version no worker's code has are never claimed.
        part["versions"] = {
            job: counts
            for job, counts in (await database.store.versions_by_job()).items()
            if set(counts) != {1}
        }
    except DATABASE_FAILURES as error:
        part["error"] = failure_text(error, database)
        return part
    part["jobs"] = [
        {
            "load": load,
            "oldest_due_age_s": (
                max(0.0, (now - parse_instant(load.oldest_due_at)).total_seconds())
                if load.oldest_due_at
                else None
            ),
        }
        for load in loads
    ]
    totals = {
        name: sum(getattr(load, name) for load in loads)
        for name in ("running", "due", "stranded", "failed_recently")
    }
    part["totals"] = totals
    return part


async def health_page(request: Request) -> Response:
    console = console_of(request)
    await console.guard.require_view(request)
    now = _now()
    parts = [await _database_health(database, now) for database in console.databases]
    context = {"parts": parts, "now": now, "stranded": STRANDED}
    return await console.pages.render(request, "health.html", context)
