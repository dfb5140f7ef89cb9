"""The commands that read runs: runs (a list), show (one run in full), watch (one run live).

Each is wiring only: open the store from ``--url`` (or ``JOBRUN_DATABASE_URL``)
and ``--schema`` (or ``JOBRUN_SCHEMA``), read through jobrun's functions inside
:func:`jobrun._cli.connect.run_action`, and print through
:mod:`jobrun._cli.render`. Exit codes: 0 success, 1 failure (and, for watch, a
run that failed), 2 usage error.
"""

from __future__ import annotations

from collections.abc import Awaitable
from datetime import datetime
from typing import Any

import click

from jobrun._cli.app import cli
from jobrun._cli.connect import existing_run, one_run_command, run_on_store, url_option
from jobrun._cli.params import json_option, run_id_argument
from jobrun._cli.render import dumps, run_json, run_view, runs_table, step_json, terminal
from jobrun._cli.render import now as utc_now
from jobrun._cli.workers_render import NO_WORKER_KEY, unserved_ids, unserved_lines, with_workers
from jobrun._core import (
    JOB_RUN_LIST_MAX,
    STRANDED,
    JobRun,
    RunQuery,
    format_instant,
    job_run_of,
    job_runs,
)
from jobrun.sql.store import SqlJobRunStore


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


@cli.command("runs")
@url_option
@click.option("--module", "-m", "module_id", help="Only runs of this module id.")
@click.option("--job", "-j", help="Only runs of this job.")
@click.option("--instance", "-i", help="Only runs of this instance.")
@click.option(
    "--status",
    "-s",
    type=click.Choice(["running", "done", "failed", "cancelled", "paused", STRANDED]),
    help="Only this status; failed includes the cancelled runs, cancelled only them; running "
    "includes the paused runs, paused only them; stranded: running runs whose lease expired "
    "with no driver taking them (as the console's).",
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


@one_run_command("show")
def show(url: str, run_id: str, as_json: bool) -> None:
    """Show one run in full: its record, its lease and its step ledger.

    The ledger holds the steps of the pass in flight (or of the last pass that
    failed); it is emptied each time a pass commits.

    \b
    Example:
      jobrun show --url sqlite+aiosqlite:///app.db 01J0Z5K8QW3V2N8XG7S0R4M6TB
    """

    async def act(store: SqlJobRunStore) -> tuple[JobRun, dict[str, Any]]:
        run = await existing_run(store, run_id)
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
