"""State changes: one run's buttons, and bulk actions behind a confirmation.

Each goes through the public operator functions (``cancel_job_run`` and the
rest), so the console changes nothing the command line could not.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from jobrun._api import (
    cancel_job_run,
    pause_job_run,
    resume_job_run,
    start_job_run,
    unpause_job_run,
)
from jobrun._core import (
    BrowsableStore,
    JobRunStatus,
    RunQuery,
    format_instant,
    get_job_run,
    job_runs,
    refuse,
    release_job_lease,
)
from jobrun.errors import JobConflictError, JobRunNotFoundError, JobValidationError
from jobrun.ui.audit import log_action
from jobrun.ui.databases import DATABASE_FAILURES
from jobrun.ui.filtering import RunsFilter
from jobrun.ui.security import ACTIONS, Refused
from jobrun.ui.state import console_of, database_of, failure_text, first, form_of

DEFAULT_REASON = "cancelled from the console"
DEFAULT_PAUSE_REASON = "paused from the console"
BULK_ACTIONS = ("cancel", "resume", "release", "pause", "unpause")
BULK_MAX = 10_000
"""At most this many runs per bulk action (the newest first)."""
_BATCH = 500
_MAX_SELECTED = 500
# What one run's action answers when it does not apply (a conflict, not a crash).
_EXPECTED = (JobConflictError, JobRunNotFoundError, JobValidationError)


def _reason(form: dict[str, str], action: str = "cancel") -> str:
    if action == "pause":
        # The run page's pause field has a name of its own, beside the cancel's reason.
        given = form.get("pause_reason") or form.get("reason", "")
        return given.strip()[:1000] or DEFAULT_PAUSE_REASON
    return form.get("reason", "").strip()[:1000] or DEFAULT_REASON


async def _act_on_one(store: BrowsableStore, action: str, run_id: str, reason: str) -> str:
    """Do ``action`` to one run; the notice to show on its page after."""
    if action == "cancel":
        await cancel_job_run(store, run_id, reason)
        return "cancelled"
    if action == "pause":
        await pause_job_run(store, run_id, reason=reason)
        return "paused"
    if action == "unpause":
        await unpause_job_run(store, run_id)
        return "unpaused"
    if action == "resume":
        await resume_job_run(store, run_id)
        return "resumed"
    return "released" if await release_job_lease(store, run_id) else "not-released"


async def _start_again(store: BrowsableStore, run_id: str) -> tuple[str, str]:
    """Start a run of the same key and payload; ``(run id, notice)``."""
    run = await get_job_run(store, run_id)
    if run is None:
        raise JobRunNotFoundError(run_id)
    if run.decode_error is not None:
        raise refuse(
            "payload",
            run.decode_error,
            message=f"run {run_id}'s payload cannot be read, so it cannot be started again",
        )
    live = await job_runs(
        store, module_id=run.module_id, job=run.job, instance=run.instance, status="running"
    )
    started = await start_job_run(
        store, module_id=run.module_id, job=run.job, instance=run.instance, payload=run.payload
    )
    return started.id, "joined" if live else "started"


async def run_action(request: Request) -> Response:
    console = console_of(request)
    action = request.path_params["action"]
    if action not in ACTIONS:
        raise Refused(404, "no such action")
    form = first(await form_of(request))
    await console.guard.check_post(request, form, action)
    database = database_of(request)
    run_id = request.path_params["run_id"]
    if "\x00" in run_id:
        raise Refused(404, "no run has this id")
    base = request.scope.get("root_path", "").rstrip("/")
    db = request.path_params["db"]
    try:
        if action == "start":
            target, notice = await _start_again(database.store, run_id)
        else:
            target, notice = (
                run_id,
                await _act_on_one(database.store, action, run_id, _reason(form, action)),
            )
    except _EXPECTED as error:
        raise Refused(409, error.message) from error
    except DATABASE_FAILURES as error:
        raise Refused(503, failure_text(error, database)) from error
    touched = [run_id] if target == run_id else [run_id, target]
    if notice == "not-released":
        log_action(request, database.name, action, [], touched)
    else:
        log_action(request, database.name, action, touched)
    location = f"{base}/db/{db}/runs/{quote(target, safe='')}?notice={notice}"
    return RedirectResponse(location, status_code=303)


# -- bulk ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Bulk:
    """A bulk action as asked: on the selected ids, or on everything the filter matches."""

    action: str
    run_ids: tuple[str, ...]
    runs_filter: RunsFilter | None

    @classmethod
    def of(cls, fields: dict[str, list[str]]) -> Bulk:
        action = (fields.get("action") or [""])[0]
        if action not in BULK_ACTIONS:
            raise Refused(400, f"the bulk action must be one of {', '.join(BULK_ACTIONS)}")
        if (fields.get("scope") or [""])[0] == "filter":
            runs_filter = RunsFilter.of({name: values[0] for name, values in fields.items()})
            if runs_filter.problems():
                raise Refused(400, "; ".join(runs_filter.problems()))
            return cls(action, (), runs_filter)
        run_ids = tuple(dict.fromkeys(value[:200] for value in fields.get("run_id", []) if value))
        if any("\x00" in run_id for run_id in run_ids):
            raise Refused(400, "a run id must not contain NUL characters")
        if not run_ids:
            raise Refused(400, "select at least one run first")
        if len(run_ids) > _MAX_SELECTED:
            raise Refused(400, f"select at most {_MAX_SELECTED} runs")
        return cls(action, run_ids, None)

    def query(self, now: datetime) -> RunQuery | None:
        """The runs the filter selects that this action applies to; ``None``: none can."""
        assert self.runs_filter is not None
        query = self.runs_filter.query(now, limit=_BATCH)
        if self.action == "release":
            # Only stranded leases: releasing a healthy holder's lease in bulk would
            # make every live pass lose its run.
            return replace(query, stranded_at=format_instant(now))
        if self.action in ("pause", "unpause"):
            # Running runs not paused yet, or the paused ones.
            paused = self.action == "unpause"
            running = JobRunStatus.RUNNING.value
            if (query.statuses and running not in query.statuses) or query.paused == (not paused):
                return None
            return replace(query, statuses=(running,), paused=paused)
        wanted = JobRunStatus.RUNNING.value if self.action == "cancel" else "failed"
        if query.statuses and wanted not in query.statuses:
            return None
        return replace(query, statuses=(wanted,))


async def bulk_confirm(request: Request) -> Response:
    console = console_of(request)
    await console.guard.require_view(request)
    bulk = Bulk.of({name: request.query_params.getlist(name) for name in request.query_params})
    if not await console.guard.allows(request, bulk.action):
        raise Refused(403, f"you may not {bulk.action} runs here")
    database = database_of(request)
    context: dict[str, Any] = {"db": request.path_params["db"], "bulk": bulk, "error": None}
    if bulk.runs_filter is None:
        context["how_many"] = len(bulk.run_ids)
    else:
        query = bulk.query(datetime.now(UTC))
        try:
            found = 0 if query is None else await database.store.count(query, BULK_MAX + 1)
        except DATABASE_FAILURES as error:
            context["error"] = failure_text(error, database)
            found = 0
        context["how_many"] = min(found, BULK_MAX)
        context["more"] = found > BULK_MAX
    context.setdefault("more", False)
    context["bulk_max"] = BULK_MAX
    context["default_reason"] = DEFAULT_REASON
    context["default_pause_reason"] = DEFAULT_PAUSE_REASON
    return await console.pages.render(request, "bulk_confirm.html", context)


async def _targets(store: BrowsableStore, bulk: Bulk) -> list[str]:
    if bulk.runs_filter is None:
        return list(bulk.run_ids)
    query = bulk.query(datetime.now(UTC))
    found: list[str] = []
    while query is not None and len(found) < BULK_MAX:
        rows = await store.find(query)
        found.extend(row.id for row in rows)
        query = replace(query, before_id=rows[-1].id) if len(rows) == query.limit else None
    return found[:BULK_MAX]


async def bulk_act(request: Request) -> Response:
    console = console_of(request)
    fields = await form_of(request)
    bulk = Bulk.of(fields)
    await console.guard.check_post(request, first(fields), bulk.action)
    database = database_of(request)
    reason = _reason(first(fields), bulk.action)
    done: list[str] = []
    refused: list[tuple[str, str]] = []
    error = None
    try:
        for run_id in await _targets(database.store, bulk):
            try:
                notice = await _act_on_one(database.store, bulk.action, run_id, reason)
            except _EXPECTED as problem:
                refused.append((run_id, problem.message))
            else:
                if notice == "not-released":
                    refused.append((run_id, "held no lease"))
                else:
                    done.append(run_id)
    except DATABASE_FAILURES as failure:
        error = failure_text(failure, database)
    log_action(
        request, database.name, f"bulk {bulk.action}", done, [run_id for run_id, _ in refused]
    )
    context = {
        "db": request.path_params["db"],
        "bulk": bulk,
        "done": done,
        "refused": refused,
        "error": error,
    }
    return await console.pages.render(request, "bulk_done.html", context)
