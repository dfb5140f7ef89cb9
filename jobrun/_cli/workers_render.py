"""The live workers (``jobrun._core.operator.worker_registry``) as ``jobrun health`` and
``jobrun runs`` show them: a line per worker, and the due runs nobody will take."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TypeVar

from jobrun._core import (
    Job,
    JobRun,
    WorkerRow,
    format_instant,
    parse_instant,
    served_jobs,
    span,
    waits_for_no_one,
)
from jobrun.sql.store import SqlJobRunStore

if TYPE_CHECKING:
    from rich.table import Table

T = TypeVar("T")

NO_WORKER = "no live worker runs this job"
NO_WORKER_KEY = "no_live_worker"
"""``jobrun runs --json``: true for a due run whose job no live worker registers."""


async def with_workers(
    store: SqlJobRunStore, read: Callable[[SqlJobRunStore], Awaitable[T]]
) -> tuple[T, list[WorkerRow], datetime]:
    """What ``read`` returns, the workers live now, and that now."""
    found = await read(store)
    now = datetime.now(UTC)
    return found, await store.live_workers(format_instant(now)), now


def worker_text(worker: WorkerRow, now: datetime) -> str:
    """``host pid 4242, 2 jobs (m/a, m/b), heartbeat 3s ago``."""
    jobs = worker.job_pairs
    shown = ", ".join(f"{module_id}/{job}" for module_id, job in jobs[:5])
    shown += ", …" if len(jobs) > 5 else ""
    beat = span(max(0.0, (now - parse_instant(worker.heartbeat_at)).total_seconds()))
    return (
        f"{worker.host} pid {worker.pid}, {len(jobs)} job{'' if len(jobs) == 1 else 's'}"
        f" ({shown}), heartbeat {beat} ago"
    )


def add_worker_rows(table: Table, workers: list[WorkerRow], now: datetime) -> None:
    table.add_row("live workers", str(len(workers)))
    for worker in workers:
        table.add_row(f"  worker {worker.name}", worker_text(worker, now))


def workers_json(workers: Iterable[WorkerRow]) -> list[dict[str, Any]]:
    return [
        {
            "id": worker.id,
            "name": worker.name,
            "host": worker.host,
            "pid": worker.pid,
            "jobs": [list(job) for job in worker.job_pairs],
            "started_at": worker.started_at,
            "heartbeat_at": worker.heartbeat_at,
            "expires_at": worker.expires_at,
        }
        for worker in workers
    ]


def health_workers_json(data: dict[str, Any], workers: list[WorkerRow]) -> dict[str, Any]:
    """``jobrun health --json`` with the live workers, and per job how many register it."""
    served = served_jobs(workers)
    for entry in data["due_by_job"]:
        entry["live_workers"] = served.get((entry["module_id"], entry["job"]), 0)
    return data | {"workers": workers_json(workers)}


def unserved_lines(runs: Iterable[JobRun], workers: list[WorkerRow], now: datetime) -> list[str]:
    """One line per job of ``runs`` whose due runs no live worker takes."""
    served = served_jobs(workers)
    counted: dict[Job, int] = {}
    for run in runs:
        if waits_for_no_one(run, now, served):
            key = (run.module_id, run.job)
            counted[key] = counted.get(key, 0) + 1
    return [
        f"! {module_id}/{job}: {NO_WORKER} ({due} due run{'' if due == 1 else 's'} above wait)"
        for (module_id, job), due in sorted(counted.items())
    ]


def unserved_ids(runs: Iterable[JobRun], workers: list[WorkerRow], now: datetime) -> set[str]:
    served: Mapping[Job, int] = served_jobs(workers)
    return {run.id for run in runs if waits_for_no_one(run, now, served)}
