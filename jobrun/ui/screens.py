"""The pages that answer "what is happening": activity over time, the drivers
holding leases (workers), and the failures of a window grouped by error."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from jobrun._core import (
    JOB_RUN_LIST_MAX,
    PER_MINUTE,
    RESOLUTIONS,
    RunQuery,
    RunRow,
    activity_query,
    buckets_of,
    drivers_of,
    format_instant,
    group_errors,
    idle_presences,
    unserved,
    workers_seen,
)
from jobrun.ui.chart import chart_of
from jobrun.ui.databases import DATABASE_FAILURES, Database
from jobrun.ui.state import console_of, database_of, failure_text

WORKERS_MAX = 5_000
"""The workers page reads at most this many leased runs."""
ERRORS_MAX = 5_000
"""The errors page groups at most this many failed runs (the newest)."""
ERROR_HOURS_DEFAULT = 24
ERROR_HOURS_MAX = 24 * 90
GROUP_IDS = 200
"""A group's bulk resume acts on its newest this many runs."""


def _now() -> datetime:
    return datetime.now(UTC)


def _field(request: Request, name: str) -> str | None:
    value = request.query_params.get(name, "").strip()[:1000]
    return value if value and "\x00" not in value else None


async def activity_page(request: Request) -> Response:
    console = console_of(request)
    await console.guard.require_view(request)
    database = database_of(request)
    module_id, job = _field(request, "module"), _field(request, "job")
    resolution = RESOLUTIONS.get(request.query_params.get("per", ""), PER_MINUTE)
    now = _now()
    context: dict[str, Any] = {
        "db": request.path_params["db"],
        "database": database,
        "module": module_id or "",
        "job": job or "",
        "resolution": resolution,
        "resolutions": RESOLUTIONS,
        "chart": None,
        "error": None,
        "jobs": [],
    }
    try:
        counted = await database.store.activity(activity_query(now, resolution, module_id, job))
        loads = await database.store.job_loads(
            format_instant(now), format_instant(now - timedelta(days=1))
        )
    except DATABASE_FAILURES as error:
        context["error"] = failure_text(error, database)
    else:
        context["chart"] = chart_of(buckets_of(counted, now, resolution), resolution)
        context["jobs"] = [(load.module_id, load.job) for load in loads]
    return await console.pages.render(request, "activity.html", context)


async def _all(database: Database, query: RunQuery, most: int) -> tuple[list[RunRow], bool]:
    """The runs ``query`` selects, newest first, ``most`` at most; and whether more match."""
    found: list[RunRow] = []
    while True:
        rows = await database.store.find(query)
        found.extend(rows)
        if len(rows) < query.limit or len(found) >= most:
            return found[:most], len(found) > most or len(rows) == query.limit
        query = RunQuery(**{**_fields(query), "before_id": rows[-1].id})


def _fields(query: RunQuery) -> dict[str, Any]:
    return {name: getattr(query, name) for name in query.__dataclass_fields__}


async def workers_page(request: Request) -> Response:
    console = console_of(request)
    await console.guard.require_view(request)
    database = database_of(request)
    now = _now()
    context: dict[str, Any] = {
        "db": request.path_params["db"],
        "database": database,
        "workers": [],
        "unserved": [],
        "drivers": [],
        "idle": [],
        "more": False,
        "now": now,
        "error": None,
    }
    # Running leads, so the page reads the running runs' index range, not the history.
    query = RunQuery(leased_at=format_instant(now), statuses=("running",), limit=JOB_RUN_LIST_MAX)
    try:
        rows, more = await _all(database, query, WORKERS_MAX)
        presences = await database.store.live_presences()
        workers = await database.store.live_workers(format_instant(now))
        due_by_job = await database.store.due_by_job(format_instant(now))
    except DATABASE_FAILURES as error:
        context["error"] = failure_text(error, database)
    else:
        drivers = drivers_of(rows)
        context |= {
            "workers": workers_seen(workers, drivers),
            "unserved": sorted(unserved(due_by_job, workers).items()),
            "drivers": drivers,
            "idle": idle_presences(presences, drivers),
            "more": more,
            "postgres": database.engine is not None
            and database.engine.dialect.name == "postgresql",
        }
    context.setdefault("postgres", False)
    return await console.pages.render(request, "workers.html", context)


def _hours(request: Request) -> int | None:
    text = request.query_params.get("hours", "").strip()
    if not text:
        return ERROR_HOURS_DEFAULT
    return int(text) if text.isdigit() and 1 <= int(text) <= ERROR_HOURS_MAX else None


async def errors_page(request: Request) -> Response:
    console = console_of(request)
    await console.guard.require_view(request)
    database = database_of(request)
    hours = _hours(request)
    context: dict[str, Any] = {
        "db": request.path_params["db"],
        "database": database,
        "hours": hours or request.query_params.get("hours", "")[:20],
        "groups": [],
        "more": False,
        "total": 0,
        "error": None,
        "problem": None,
        "group_ids": GROUP_IDS,
    }
    if hours is None:
        context["problem"] = f"hours must be a whole number from 1 to {ERROR_HOURS_MAX}"
        return await console.pages.render(request, "errors.html", context, 400)
    since_at = format_instant(_now() - timedelta(hours=hours))
    query = RunQuery(failed_since_at=since_at, statuses=("failed",), limit=JOB_RUN_LIST_MAX)
    try:
        rows, more = await _all(database, query, ERRORS_MAX)
    except DATABASE_FAILURES as error:
        context["error"] = failure_text(error, database)
    else:
        context |= {"groups": group_errors(rows, GROUP_IDS), "more": more, "total": len(rows)}
    return await console.pages.render(request, "errors.html", context)
