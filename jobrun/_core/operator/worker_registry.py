"""The workers that said they are alive: one row per worker per database (revision 0007).

A worker (``jobrun worker``, :func:`jobrun.run_worker`) writes its row when it
starts serving a database, writes it again every heartbeat, and deletes it when
it stops. Each write carries ``expires_at``, the instant after which readers take
the worker for gone (``GONE_AFTER_BEATS`` heartbeats after ``heartbeat_at``), so a
worker killed with ``kill -9`` drops out of every reading by itself, whatever
heartbeat the readers would have guessed; its row is deleted later by any
worker's heartbeat (:func:`sweep_due`). Readers compare ``expires_at`` with their
own clock: hosts whose clocks disagree by a good part of the bound see a worker
gone too early or too late.

What readers make of it: the workers holding nothing (a lease shows only a busy
driver), and the due runs whose job no live worker registers, which no worker
here will ever take (a job started under a mistyped name, a worker without it).
Drivers that are not workers (a loop of your own around ``run_due_jobs``) do not
register: their jobs show as unserved while runs of them are due.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

from jobrun._core.model.formats import format_instant
from jobrun._core.model.records import JobRun
from jobrun._core.model.worker_rows import Job, WorkerRow
from jobrun._core.operator.waiting import waiting_of
from jobrun._core.operator.workers import Driver

DEFAULT_HEARTBEAT_S = 10.0
"""How often a worker writes its row again, per database it serves."""
GONE_AFTER_BEATS = 3
"""A worker whose row has not been written for this many heartbeats is taken for gone."""
MAX_BEATS_PER_S = 2.0
"""The most rows a worker writes per second, all its databases together: over a
thousand databases each one's heartbeat is stretched instead (a write there is a
file opened, a row written and a wake-up of the worker's own drivers)."""
SWEEP_EVERY_BEATS = 10
"""Every this many heartbeats (and at its first) a worker deletes the rows of gone workers."""

DUE_KINDS = ("due", "stranded")
"""What a run waits for (``operator.waiting``) when any free driver would take it now."""


def beat_row(row: WorkerRow, now: datetime, heartbeat_s: float) -> WorkerRow:
    """``row`` as written by a heartbeat at ``now``: gone after ``GONE_AFTER_BEATS`` more."""
    gone = now + timedelta(seconds=heartbeat_s * GONE_AFTER_BEATS)
    return WorkerRow(
        row.id,
        row.name,
        row.host,
        row.pid,
        row.jobs,
        row.started_at,
        format_instant(now),
        format_instant(gone),
    )


def heartbeat_for(heartbeat_s: float, databases: int) -> float:
    """The heartbeat of each of ``databases`` served by one worker whose own is
    ``heartbeat_s``: stretched so that its writes stay within ``MAX_BEATS_PER_S``."""
    return max(heartbeat_s, databases / MAX_BEATS_PER_S)


def sweep_due(beats: int) -> bool:
    """Whether heartbeat number ``beats`` (0: the first) also deletes gone workers' rows."""
    return beats % SWEEP_EVERY_BEATS == 0


def worker_is_live(row: WorkerRow, now_at: str) -> bool:
    """The worker wrote its row recently enough: its expiry is still ahead of ``now_at``.
    (SQL twin: ``jobrun.sql.statements.operator.worker_is_live``.)"""
    return row.expires_at > now_at


def served_jobs(workers: Iterable[WorkerRow]) -> dict[Job, int]:
    """How many of ``workers`` register each job."""
    counted: dict[Job, int] = {}
    for worker in workers:
        for job in worker.job_pairs:
            counted[job] = counted.get(job, 0) + 1
    return counted


def unserved(due_by_job: Mapping[Job, int], workers: Iterable[WorkerRow]) -> dict[Job, int]:
    """The jobs of ``due_by_job`` (due runs per job) that none of ``workers`` (the live
    ones) registers, with their due runs: nothing here will take them."""
    served = served_jobs(workers)
    return {job: due for job, due in due_by_job.items() if due and job not in served}


def waits_for_no_one(run: JobRun, now: datetime, served: Mapping[Job, int]) -> bool:
    """``run`` is due (or stranded) as of ``now`` and its job is not in ``served`` (the
    jobs live workers register, :func:`served_jobs`): no worker here will take it."""
    waiting = waiting_of(run, now)
    due = waiting is not None and waiting.kind in DUE_KINDS
    return due and (run.module_id, run.job) not in served


@dataclass(frozen=True, slots=True)
class WorkerSeen:
    """A live worker as the console shows it: its row, the runs it holds a lease on now
    (0: idle) and its jobs."""

    row: WorkerRow
    runs_held: int
    jobs: list[Job]


def workers_seen(workers: Iterable[WorkerRow], drivers: Iterable[Driver]) -> list[WorkerSeen]:
    """Each live worker with the leases its drivers (same host and pid) hold."""
    held: dict[tuple[str, int], int] = {}
    for driver in drivers:
        identity = driver.identity
        if identity is not None and identity.pid is not None:
            key = (identity.host, identity.pid)
            held[key] = held.get(key, 0) + driver.runs
    return [WorkerSeen(row, held.get((row.host, row.pid), 0), row.job_pairs) for row in workers]
