"""The ``jobrun health`` command: the counts of a dashboard, and the jobs no worker runs."""

from __future__ import annotations

import click

from jobrun._api import job_run_health
from jobrun._cli.app import cli
from jobrun._cli.connect import run_on_store, url_option
from jobrun._cli.params import json_option
from jobrun._cli.render import dumps, health_json, health_table, terminal
from jobrun._cli.workers_render import add_worker_rows, health_workers_json, with_workers
from jobrun._core import served_jobs


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
        from jobrun._cli.job_names import load_registry

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
