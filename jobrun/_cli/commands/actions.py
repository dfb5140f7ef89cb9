"""The commands that act on runs by hand: cancel, resume, release, prune.

Each is wiring only: open the store from ``--url`` (or ``JOBRUN_DATABASE_URL``)
and ``--schema`` (or ``JOBRUN_SCHEMA``), call jobrun's operator function inside
:func:`jobrun._cli.connect.run_action`, and print the outcome (``--json`` for
scripts). Exit codes: 0 success, 1 failure (an unknown run, a run in the wrong
status), 2 usage error.
"""

from __future__ import annotations

from datetime import timedelta

import click

from jobrun._api import cancel_job_run, prune_job_runs, resume_job_run
from jobrun._cli.app import cli
from jobrun._cli.connect import existing_run, one_run_command, run_on_store, url_option
from jobrun._cli.params import duration_option, json_option, run_id_argument
from jobrun._cli.render import dumps, run_json
from jobrun._core import JobRun, release_job_lease
from jobrun.sql.store import SqlJobRunStore


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


@one_run_command("resume")
def resume(url: str, run_id: str, as_json: bool) -> None:
    """Put a failed run back to running, from its last committed cursor.

    Completed steps of its last pass are not repeated; attempts start again.

    \b
    Example:
      jobrun resume --url sqlite+aiosqlite:///app.db 01J0Z5K8QW3V2N8XG7S0R4M6TB
    """

    run = run_on_store(url, lambda store: resume_job_run(store, run_id))
    click.echo(dumps(run_json(run)) if as_json else f"resumed {run.id}")


@one_run_command("release")
def release(url: str, run_id: str, as_json: bool) -> None:
    """Clear a run's lease so any driver may take it at once.

    Use it when the holder is known to be dead; a holder still alive is refused
    at its next write and stops.

    \b
    Example:
      jobrun release --url sqlite+aiosqlite:///app.db 01J0Z5K8QW3V2N8XG7S0R4M6TB
    """

    async def act(store: SqlJobRunStore) -> tuple[JobRun, bool]:
        before = await existing_run(store, run_id)
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
@duration_option(
    "--older-than",
    required=True,
    help="Delete runs that ended longer ago than this: 7d, 12h, 30m, 45s, 2w, 1d12h.",
)
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
