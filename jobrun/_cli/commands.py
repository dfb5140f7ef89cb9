"""The operator commands (runs, show, watch, cancel, resume, release, prune, health).

Each command is wiring only: parse the arguments, open the store from ``--url``
(or ``JOBRUN_DATABASE_URL``) and ``--schema`` (or ``JOBRUN_SCHEMA``), call
jobrun's public functions inside :func:`jobrun._cli.connect.run_action`, and
print through :mod:`jobrun._cli.render`. Exit codes: 0 success, 1 failure, 2 usage error.
"""

from __future__ import annotations

from collections.abc import Awaitable
from datetime import datetime, timedelta
from typing import Any

import click

from jobrun._cli.app import cli
from jobrun._cli.connect import run_on_store, url_option
from jobrun._cli.params import Duration
from jobrun._cli.render import (
    dumps,
    health_json,
    health_table,
    run_json,
    run_view,
    runs_table,
    step_json,
    terminal,
)
from jobrun._cli.render import now as utc_now
from jobrun._cli.workers_render import (
    NO_WORKER_KEY,
    add_worker_rows,
    health_workers_json,
    unserved_ids,
    unserved_lines,
    with_workers,
)
from jobrun._core import (
    JOB_RUN_LIST_MAX,
    STRANDED,
    JobRun,
    RunQuery,
    format_instant,
    get_job_run,
    job_run_of,
    job_runs,
    release_job_lease,
    served_jobs,
)
from jobrun._entry import (
    cancel_job_run,
    job_run_health,
    prune_job_runs,
    resume_job_run,
)
from jobrun.errors import JobRunNotFoundError
from jobrun.sql.store import SqlJobRunStore

json_option = click.option(
    "--json", "as_json", is_flag=True, help="Print JSON for scripts instead of a table."
)
run_id_argument = click.argument("run_id", metavar="RUN_ID")


async def _stranded_runs(
    store: SqlJobRunStore,
    module_id: str | None,
    job: str | None,
    instance: str | None,
    limit: int,
    at: datetime,
) -> list[JobRun]:
    """The console's "stranded" filter: the same read, so both list the same runs."""
    query = RunQuery(
        module_id=module_id,
        job=job,
        instance_prefix=instance,
        stranded_at=format_instant(at),
        limit=min(limit, JOB_RUN_LIST_MAX),
    )
    # The browse read matches an instance by prefix; --instance means that one.
    rows = [row for row in await store.find(query) if instance in (None, row.instance)]
    return [job_run_of(row) for row in rows]


async def _existing(store: SqlJobRunStore, run_id: str) -> JobRun:
    run = await get_job_run(store, run_id)
    if run is None:
        raise JobRunNotFoundError(run_id)
    return run


# -- reading ------------------------------------------------------------------------


@cli.command("runs")
@url_option
@click.option("--module", "-m", "module_id", help="Only runs of this module id.")
@click.option("--job", "-j", help="Only runs of this job.")
@click.option("--instance", "-i", help="Only runs of this instance.")
@click.option(
    "--status",
    "-s",
    type=click.Choice(["running", "done", "failed", "cancelled", STRANDED]),
    help="Only this status; failed includes the cancelled runs, cancelled only them; "
    "stranded: running runs whose lease expired with no driver taking them (as the console's).",
)
@click.option(
    "--limit", "-n", type=click.IntRange(min=1), default=50, show_default=True,
    help="At most this many runs (500 at most).",
)  # fmt: skip
@json_option
def runs(
    url: str,
    module_id: str | None,
    job: str | None,
    instance: str | None,
    status: str | None,
    limit: int,
    as_json: bool,
) -> None:
    """List runs, newest first.

    \b
    Example:
      jobrun runs --url sqlite+aiosqlite:///app.db --module shop --status failed
      jobrun runs --json --limit 500 | jq '.[] | select(.attempts > 3) | .id'
    """

    if status == STRANDED:
        at = utc_now()

        def read(store: SqlJobRunStore) -> Awaitable[list[JobRun]]:
            return _stranded_runs(store, module_id, job, instance, limit, at)
    else:

        def read(store: SqlJobRunStore) -> Awaitable[list[JobRun]]:
            return job_runs(
                store, module_id=module_id, job=job, instance=instance, status=status, limit=limit
            )

    found, workers, at = run_on_store(url, lambda store: with_workers(store, read))
    if as_json:
        unserved = unserved_ids(found, workers, at)
        click.echo(dumps([run_json(run) | {NO_WORKER_KEY: run.id in unserved} for run in found]))
    elif not found:
        click.echo("no runs match")
    else:
        out = terminal()
        out.print(runs_table(found, utc_now(), out.width))
        for line in unserved_lines(found, workers, at):
            click.echo(line)


@cli.command("show")
@url_option
@run_id_argument
@json_option
def show(url: str, run_id: str, as_json: bool) -> None:
    """Show one run in full: its record, its lease and its step ledger.

    The ledger holds the steps of the pass in flight (or of the last pass that
    failed); it is emptied each time a pass commits.

    \b
    Example:
      jobrun show --url sqlite+aiosqlite:///app.db 01J0Z5K8QW3V2N8XG7S0R4M6TB
    """

    async def act(store: SqlJobRunStore) -> tuple[JobRun, dict[str, Any]]:
        run = await _existing(store, run_id)
        return run, await store.steps(run_id)

    run, steps = run_on_store(url, act)
    if as_json:
        ledger = [step_json(row) for row in steps.values()]
        click.echo(dumps({"run": run_json(run), "steps": ledger}))
    else:
        terminal().print(run_view(run, steps, utc_now()))


@cli.command("watch")
@url_option
@run_id_argument
@click.option(
    "--interval", type=click.FloatRange(min=0.01), default=1.0, show_default=True,
    metavar="SECONDS", help="Seconds between polls.",
)  # fmt: skip
def watch(url: str, run_id: str, interval: float) -> None:
    """Follow a run live until it ends; exit 0 when it is done, 1 when it failed
    (or was cancelled).

    Shows the counters with their rate per second between polls, the cursor,
    attempts, the last error and who holds the lease. When the counters include
    `total`, a progress bar shows the work done over it: the counter `done` if
    there is one, else `objects`, else the largest other counter.

    \b
    Example:
      jobrun watch --url sqlite+aiosqlite:///app.db 01J0Z5K8QW3V2N8XG7S0R4M6TB --interval 2
    """
    from jobrun._cli.watching import watch as watch_run  # rich's live display: watch only

    out = terminal()
    final = run_on_store(url, lambda store: watch_run(store, run_id, interval, out))
    if final.status == "done":
        out.print(f"run {final.id} is done")
        return
    if final.cancelled:
        # The stored reason already reads "cancelled: ...".
        out.print(f"run {final.id} {final.last_error}")
    else:
        out.print(f"run {final.id} {final.outcome}: {final.last_error or 'no error recorded'}")
    raise SystemExit(1)


# -- acting -------------------------------------------------------------------------


@cli.command("cancel")
@url_option
@run_id_argument
@click.option("--reason", required=True, help="Why, for the record (stored as the last error).")
@json_option
def cancel(url: str, run_id: str, reason: str, as_json: bool) -> None:
    """Fail a running run now. A pass in flight stops at its next step.

    \b
    Example:
      jobrun cancel --url sqlite+aiosqlite:///app.db 01J0Z5K8QW3V2N8XG7S0R4M6TB \\
          --reason "wrong shop"
    """

    run = run_on_store(url, lambda store: cancel_job_run(store, run_id, reason))
    click.echo(dumps(run_json(run)) if as_json else f"cancelled {run.id}: {run.last_error}")


@cli.command("resume")
@url_option
@run_id_argument
@json_option
def resume(url: str, run_id: str, as_json: bool) -> None:
    """Put a failed run back to running, from its last committed cursor.

    Completed steps of its last pass are not repeated; attempts start again.

    \b
    Example:
      jobrun resume --url sqlite+aiosqlite:///app.db 01J0Z5K8QW3V2N8XG7S0R4M6TB
    """

    run = run_on_store(url, lambda store: resume_job_run(store, run_id))
    click.echo(dumps(run_json(run)) if as_json else f"resumed {run.id}")


@cli.command("release")
@url_option
@run_id_argument
@json_option
def release(url: str, run_id: str, as_json: bool) -> None:
    """Clear a run's lease so any driver may take it at once.

    Use it when the holder is known to be dead; a holder still alive is refused
    at its next write and stops.

    \b
    Example:
      jobrun release --url sqlite+aiosqlite:///app.db 01J0Z5K8QW3V2N8XG7S0R4M6TB
    """

    async def act(store: SqlJobRunStore) -> tuple[JobRun, bool]:
        before = await _existing(store, run_id)
        return before, await release_job_lease(store, run_id)

    before, released = run_on_store(url, act)
    if as_json:
        holder = before.lease_driver if released else None
        click.echo(dumps({"run_id": run_id, "released": released, "held_by": holder}))
    elif released:
        click.echo(f"released the lease of {run_id} (was held by {before.lease_driver})")
    else:
        click.echo(f"{run_id} held no lease; nothing to release")


@cli.command("prune")
@url_option
@click.option(
    "--older-than", type=Duration(), required=True, metavar="DURATION",
    help="Delete runs that ended longer ago than this: 7d, 12h, 30m, 45s, 2w, 1d12h.",
)  # fmt: skip
@click.option(
    "--status", "statuses", type=click.Choice(["done", "failed"]), multiple=True,
    help="Which finished runs (repeatable); default: done only.",
)  # fmt: skip
@json_option
def prune(url: str, older_than: timedelta, statuses: tuple[str, ...], as_json: bool) -> None:
    """Delete finished runs (and their ledgers) that ended before a cutoff.

    Running runs are never deleted.

    \b
    Example:
      jobrun prune --url sqlite+aiosqlite:///app.db --older-than 30d --status done --status failed
    """

    deleted = run_on_store(
        url,
        lambda store: prune_job_runs(store, older_than=older_than, statuses=statuses or ("done",)),
    )
    if as_json:
        click.echo(dumps({"deleted": deleted}))
    else:
        click.echo(f"pruned {deleted} run{'' if deleted == 1 else 's'}")


@cli.command("health")
@url_option
@click.option(
    "--app", "app", metavar="MODULE:REGISTRY", default=None,
    help="Mark the due runs of jobs this JobRegistry does not register (nothing runs them), "
    "and the runs of a version newer than its code (which it never claims).",
)  # fmt: skip
@json_option
def health(url: str, app: str | None, as_json: bool) -> None:
    """Counts for a dashboard: running, due now, leased, failed, the oldest due wait,
    and the due runs of each job.

    A job with due runs that no worker registers never drains: with --app, the
    jobs that registry lacks are marked, and so are runs committed by a newer
    version of a job than the registry's code (after a rollback nothing takes them).

    \b
    Example:
      jobrun health --url sqlite+aiosqlite:///app.db --json
      jobrun health --url sqlite+aiosqlite:///app.db --app myapp.jobs:registry
    """
    registered = None
    if app is not None:
        from jobrun._cli.worker_command import load_registry

        registered = {(job.module_id, job.name): job.version for job in load_registry(app)}
    counts, workers, at = run_on_store(
        url, lambda store: with_workers(store, lambda store: job_run_health(store, by_job=True))
    )
    if as_json:
        click.echo(dumps(health_workers_json(health_json(counts, registered), workers)))
    else:
        table = health_table(counts, registered, served_jobs(workers))
        add_worker_rows(table, workers, at)
        terminal().print(table)
