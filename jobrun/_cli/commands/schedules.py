"""The ``jobrun schedules`` command: each schedule of an app, its next slot and its last run."""

from __future__ import annotations

from typing import Any

import click
from rich import box
from rich.table import Table

from jobrun._cli.app import cli
from jobrun._cli.connect import run_on_store, url_option
from jobrun._cli.job_names import load_registry
from jobrun._cli.render import dumps, instant, now, status_text, terminal
from jobrun._core import JobRegistry, ScheduleRow, parse_instant
from jobrun.sql.store import SqlJobRunStore


async def _states(store: SqlJobRunStore, registry: JobRegistry) -> list[dict[str, Any]]:
    at = now()
    stored = {(row.module_id, row.job, row.schedule): row for row in await store.schedule_rows()}
    found = []
    for schedule in registry.schedules():
        row: ScheduleRow | None = stored.get(schedule.key)
        last_run = None
        if row is not None and row.last_run_id is not None:
            last_run = await store.get(row.last_run_id)
        last_slot_at = None
        if row is not None and row.last_run_id is not None:
            last_slot_at = parse_instant(row.last_slot_at).isoformat()
        found.append(
            {
                "module_id": schedule.module_id,
                "job": schedule.job,
                "instance": schedule.instance,
                "cron": schedule.cron,
                "catch_up": schedule.catch_up,
                "next_slot_at": schedule.next_slot(at).isoformat(),
                "last_slot_at": last_slot_at,
                "last_run_id": row.last_run_id if row is not None else None,
                # None: no run yet, or it was pruned since.
                "last_run_status": None if last_run is None else last_run.status,
            }
        )
    return found


def _table(states: list[dict[str, Any]]) -> Table:
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    for name in ("job", "instance", "cron", "catch up", "next slot", "last slot", "last run"):
        table.add_column(name, overflow="fold")
    for state in states:
        last_run = state["last_run_id"] or "-"
        status = state["last_run_status"]
        if state["last_run_id"] and status is None:
            status = "pruned"
        cell = status_text(status) if status else None
        table.add_row(
            f"{state['module_id']}/{state['job']}",
            state["instance"] or "(the slot)",
            state["cron"],
            state["catch_up"],
            instant(parse_instant(state["next_slot_at"])),
            instant(parse_instant(state["last_slot_at"])) if state["last_slot_at"] else "-",
            f"{last_run} {cell}" if cell else last_run,
        )
    return table


@cli.command("schedules")
@url_option
@click.option(
    "--app",
    required=True,
    metavar="MODULE:REGISTRY",
    help="The JobRegistry whose schedules to show, e.g. myapp.jobs:registry.",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts instead of a table.")
def schedules(url: str, app: str, as_json: bool) -> None:
    """List the app's schedules: cron, catch-up, next slot, and the last slot's run.

    \b
    Example:
      jobrun schedules --app myapp.jobs:registry --url sqlite+aiosqlite:///app.db
    """
    registry = load_registry(app)
    states = run_on_store(url, lambda store: _states(store, registry))
    if as_json:
        click.echo(dumps(states))
    elif not states:
        click.echo(f"{app} has no schedules")
    else:
        terminal().print(_table(states))
