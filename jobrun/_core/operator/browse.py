"""The console's reads: a filtered page of runs by keyset, bounded counts, load per job.

Pages are cut by id (``id < before_id``, newest first), never by offset, so the
thousandth page costs what the first does; counts stop at a cap, so a history
of millions of finished runs is never counted in full.

The words (due, leased, stranded) are those of :mod:`jobrun._core.model.predicates`;
:func:`run_matches` is the console filter's one definition, and
``jobrun.sql.statements.browse.run_matches`` its SQL twin. Stranded goes by the lease
alone: whether a holder is provably dead (an orphan, ``jobrun._core.leases.proof_of_death``) is
the claim's question, which takes such a run over before its lease expires.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from jobrun._core.model.ids import first_id_at
from jobrun._core.model.predicates import (
    is_cancelled,
    is_failed_since,
    is_leased,
    is_paused,
    is_stranded,
)
from jobrun._core.model.records import JOB_RUN_LIST_MAX, JobRunStatus, RunRow
from jobrun._core.model.refusals import is_number, refuse
from jobrun._core.operator.activity import ActivityQuery, Counts
from jobrun._core.operator.workers import PresenceSeen
from jobrun._core.port import OperatorStore

COUNT_CAP = 10_000
"""Counts shown by the console stop here (shown as "10,000+")."""


@dataclass(frozen=True, slots=True)
class RunQuery:
    """Which runs a console page shows; every given field must hold (``None``: any).

    ``statuses`` empty means any status. ``stranded_at`` set means only runs
    stranded as of that stored instant. ``before_id`` is the keyset cursor: only
    runs with a smaller id (older), for the next page.

    ``started_since_at`` selects runs started at or after it *and* whose id was
    minted at or after it (``id >= first_id_at(started_since_at)``). A run's id is
    minted from the wall clock as it starts, so the two agree for every run started
    normally; the id bound is what lets a store answer from its primary key
    instead of reading the whole history. A run started with an injected clock
    ahead of the wall clock (or a hand-made id) can fall outside it.

    ``leased_at`` set means only runs leased as of that instant (the workers
    page); ``failed_since_at`` only runs that ended failed at or after it (the
    errors page). ``cancelled`` True means only runs an operator cancelled
    (:func:`jobrun._core.model.predicates.is_cancelled`), False only the others.
    """

    module_id: str | None = None
    job: str | None = None
    instance_prefix: str | None = None
    statuses: tuple[str, ...] = ()
    started_since_at: str | None = None
    stranded_at: str | None = None
    before_id: str | None = None
    limit: int = 50
    leased_at: str | None = None
    failed_since_at: str | None = None
    cancelled: bool | None = None
    paused: bool | None = None

    def __post_init__(self) -> None:
        if not is_number(self.limit) or not 1 <= self.limit <= JOB_RUN_LIST_MAX:
            raise refuse("limit", f"must be in [1, {JOB_RUN_LIST_MAX}], got {self.limit!r}")
        allowed = {member.value for member in JobRunStatus}
        unknown = [status for status in self.statuses if status not in allowed]
        if unknown:
            raise refuse("statuses", f"must be drawn from {sorted(allowed)}, got {unknown!r}")


@dataclass(frozen=True, slots=True)
class JobLoad:
    """How one job of one database is doing (times as stored text): its running
    runs, how many of them are due (stranded ones included) and since when the
    oldest waits, how many are stranded, and its runs failed lately."""

    module_id: str
    job: str
    running: int
    due: int
    oldest_due_at: str | None
    stranded: int
    failed_recently: int


def run_matches(row: RunRow, query: RunQuery) -> bool:
    """Whether ``row`` is one ``query`` selects (ignoring ``limit``)."""
    return (
        (query.module_id is None or row.module_id == query.module_id)
        and (query.job is None or row.job == query.job)
        and (query.instance_prefix is None or row.instance.startswith(query.instance_prefix))
        and (not query.statuses or row.status in query.statuses)
        and (
            query.started_since_at is None
            or (
                row.started_at >= query.started_since_at
                and row.id >= first_id_at(query.started_since_at)
            )
        )
        and (query.stranded_at is None or is_stranded(row, query.stranded_at))
        and (query.before_id is None or row.id < query.before_id)
        and (query.leased_at is None or is_leased(row, query.leased_at))
        and (query.failed_since_at is None or is_failed_since(row, query.failed_since_at))
        and (query.cancelled is None or is_cancelled(row) == query.cancelled)
        and (query.paused is None or is_paused(row) == query.paused)
    )


class BrowsableStore(OperatorStore, Protocol):
    """An operator store the console can page through."""

    async def find(self, query: RunQuery) -> list[RunRow]:
        """Runs ``query`` selects, newest id first, ``query.limit`` at most.

        Must stay cheap with millions of finished runs kept: ordered by the
        primary key, cut by ``before_id``, never by an offset.
        """
        ...

    async def count(self, query: RunQuery, cap: int) -> int:
        """How many runs ``query`` selects (``limit`` ignored), counting ``cap`` at most."""
        ...

    async def job_loads(self, now_at: str, failed_since_at: str) -> list[JobLoad]:
        """Per ``(module_id, job)`` with live runs or runs failed since ``failed_since_at``:
        running, due by ``now_at`` (stranded ones included), the oldest due
        instant, stranded, and failed since then; ordered by module id and job."""
        ...

    async def activity(self, query: ActivityQuery) -> dict[str, Counts]:
        """Runs started, finished and failed per bucket since ``query.since_at``, as
        :func:`jobrun._core.operator.activity.count_activity` counts them (buckets with none
        left out). Must stay cheap with millions of runs kept: started by the
        primary key's range, finished by an index on ``ended_at``."""
        ...

    async def live_presences(self) -> list[PresenceSeen]:
        """The driver presences held in the database now (Postgres; elsewhere none)."""
        ...
