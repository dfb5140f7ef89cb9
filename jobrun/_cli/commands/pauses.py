"""``jobrun pause`` and ``jobrun unpause``: a run, every run of a job, or a limit key.

One target per call: a RUN_ID, or ``--module`` with ``--job`` (as ``jobrun runs``
names a job), or ``--limit-key``. Anything else (none, two, a module without its
job) is refused in one line with exit status 2 before the database is touched.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import click

from jobrun._api import (
    pause_job,
    pause_job_run,
    pause_limit,
    unpause_job,
    unpause_job_run,
    unpause_limit,
)
from jobrun._cli.app import cli
from jobrun._cli.connect import OneLineUsageError, run_on_store, url_option
from jobrun._cli.render import dumps, run_json
from jobrun.sql.store import SqlJobRunStore

Act = Callable[[SqlJobRunStore], Awaitable[Any]]


def _target_options(command: Callable[..., None]) -> Callable[..., None]:
    for option in reversed(
        [
            url_option,
            click.argument("run_id", metavar="[RUN_ID]", required=False),
            click.option("--module", "-m", "module_id", help="With --job: every run of that job."),
            click.option("--job", "-j", help="With --module: every run of that job."),
            click.option(
                "--limit-key",
                "limit_key",
                metavar="KEY",
                help="A rate limit's or concurrency key: every step that names it.",
            ),
            click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts."),
        ]
    ):
        command = option(command)
    return command


def _target(given: dict[str, Any]) -> str:
    """Which one thing the call names: ``run``, ``job`` or ``limit`` (else exit 2)."""
    run_id, module_id, job, key = (
        given[name] for name in ("run_id", "module_id", "job", "limit_key")
    )
    if (module_id is None) != (job is None):
        raise OneLineUsageError("--module and --job name a job together: give both")
    named = [name for name, value in (("run", run_id), ("job", job), ("limit", key)) if value]
    if len(named) != 1:
        raise OneLineUsageError("give one of RUN_ID, --module with --job, or --limit-key")
    return named[0]


def _job_said(verb: str, module_id: str, job: str, count: int) -> str:
    return f"{verb} job {module_id}/{job}: {count} run{'' if count == 1 else 's'} {verb}"


@cli.command("pause")
@_target_options
@click.option("--reason", default=None, help="Why, for the record (shown with the pause).")
def pause(reason: str | None, **given: Any) -> None:
    """Pause a run, a job or a limit key: no driver takes it until unpaused.

    A run: a pass in flight stops at its next step boundary, charged nothing, its
    finished steps kept; the run stays live (a start of its key joins it). A job
    (--module and --job): every live run of it, and every run of it started until
    `jobrun unpause` of the job. A limit key (--limit-key): every step naming it
    defers its pass until the key is unpaused. Pausing what is paused changes nothing.

    \b
    Example:
      jobrun pause --url sqlite+aiosqlite:///app.db 01J0Z5K8QW3V2N8XG7S0R4M6TB --reason deploy
      jobrun pause --url sqlite+aiosqlite:///app.db --module shop --job reindex
      jobrun pause --url sqlite+aiosqlite:///app.db --limit-key shopify --reason "429 storm"
    """
    target, url, as_json = _target(given), given["url"], given["as_json"]
    if target == "run":
        run_id = str(given["run_id"])
        run = run_on_store(url, lambda store: pause_job_run(store, run_id, reason=reason))
        click.echo(dumps(run_json(run)) if as_json else f"paused {run.id}")
    elif target == "job":
        module, name = str(given["module_id"]), str(given["job"])
        count = run_on_store(
            url, lambda store: pause_job(store, module_id=module, job=name, reason=reason)
        )
        shown = {"module_id": module, "job": name, "paused_runs": count}
        click.echo(dumps(shown) if as_json else _job_said("paused", module, name, count))
    else:
        key = str(given["limit_key"])
        fresh = run_on_store(url, lambda store: pause_limit(store, key, reason=reason))
        said = f"paused limit {key!r}" if fresh else f"limit {key!r} was already paused"
        click.echo(dumps({"key": key, "newly_paused": fresh}) if as_json else said)


@cli.command("unpause")
@_target_options
def unpause(**given: Any) -> None:
    """Unpause a run, a job or a limit key: what it held is due at once.

    A job's unpause unpauses every paused run of it (paused with the job or on
    its own) and ends the pause of its new starts. Unpausing what is not paused
    changes nothing.

    \b
    Example:
      jobrun unpause --url sqlite+aiosqlite:///app.db 01J0Z5K8QW3V2N8XG7S0R4M6TB
      jobrun unpause --url sqlite+aiosqlite:///app.db --module shop --job reindex
      jobrun unpause --url sqlite+aiosqlite:///app.db --limit-key shopify
    """
    target, url, as_json = _target(given), given["url"], given["as_json"]
    if target == "run":
        run_id = str(given["run_id"])
        run = run_on_store(url, lambda store: unpause_job_run(store, run_id))
        click.echo(dumps(run_json(run)) if as_json else f"unpaused {run.id}")
    elif target == "job":
        module, name = str(given["module_id"]), str(given["job"])
        count = run_on_store(url, lambda store: unpause_job(store, module_id=module, job=name))
        shown = {"module_id": module, "job": name, "unpaused_runs": count}
        click.echo(dumps(shown) if as_json else _job_said("unpaused", module, name, count))
    else:
        key = str(given["limit_key"])
        woken = run_on_store(url, lambda store: unpause_limit(store, key))
        said = f"unpaused limit {key!r}: {woken} run{'' if woken == 1 else 's'} due again"
        click.echo(dumps({"key": key, "woken_runs": woken}) if as_json else said)
