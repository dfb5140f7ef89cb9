"""Plain helpers shared by several test files (fixtures live in ``conftest.py``).

Rows written "behind jobrun's back" go through the engine on SQL backends and
into ``store.runs`` on the memory store (``engine`` is None there).
"""

from __future__ import annotations

import asyncio
import dataclasses
import sys
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import insert, update
from sqlalchemy.ext.asyncio import AsyncEngine

import jobrun
import jobrun.worker as worker_module
from jobrun._core.formats import add_milliseconds, format_instant
from jobrun._core.records import ClaimRequest, RunRow
from jobrun.sql.migrate import current_revision
from jobrun.sql.schema import job_runs as runs_table
from jobrun.testing import FakeClock, MemoryJobRunStore

REPO = Path(__file__).resolve().parents[1]
ALEMBIC = Path(sys.executable).with_name("alembic")
SQL_BACKENDS = [
    pytest.param("sqlite", id="sqlite"),
    pytest.param("postgres", id="postgres", marks=pytest.mark.postgres),
]


def fixed_random() -> float:
    """Jitter factor exactly 1.0 (0.8 + 0.5 * 0.4), so backoff is predictable."""
    return 0.5


def iso(moment: datetime) -> str:
    """Stored timestamp text, written out independently of jobrun's formatter."""
    utc = moment.astimezone(UTC)
    return utc.strftime("%Y-%m-%dT%H:%M:%S.") + f"{utc.microsecond // 1000:03d}Z"


async def start(store: Any, clock: FakeClock, **kw: Any) -> jobrun.JobRun:
    """Start a run of ``crm``/``import`` unless ``module_id``/``job`` say otherwise."""
    kw.setdefault("module_id", "crm")
    kw.setdefault("job", "import")
    return await jobrun.start_job_run(store, clock=clock, **kw)


async def drive(
    store: Any, registry: jobrun.JobRegistry, clock: FakeClock, **options: Any
) -> jobrun.JobDriveReport:
    """``run_due_jobs`` with a jitter factor of exactly 1.0 unless ``random`` is given."""
    options.setdefault("random", fixed_random)
    return await jobrun.run_due_jobs(store, registry, clock=clock, **options)


async def row_of(store: Any, run_id: str) -> RunRow:
    row = await store.get(run_id)
    assert row is not None
    return row


def sized_store(store: Any, engine: AsyncEngine | None, **limits: int) -> Any:
    """A store of the same backend with other size caps."""
    if engine is None:
        return MemoryJobRunStore(jobrun.StoreLimits(**limits))
    return jobrun.SqlJobRunStore(engine, **limits)


def hand_made_row(
    index: int,
    *,
    module_id: str = "elsewhere",
    job: str = "theirs",
    at: str = "2025-12-31T00:00:00.000Z",
) -> RunRow:
    """A due, running row whose id sorts before every minted ULID, in ``index`` order.

    By default its job is one no test registers.
    """
    return RunRow(
        id=f"{index:026d}",
        module_id=module_id,
        job=job,
        instance=f"i{index}",
        payload="null",
        status="running",
        cursor=None,
        counters="{}",
        attempts=0,
        last_error=None,
        started_at=at,
        updated_at=at,
        next_attempt_at=None,
        ended_at=None,
    )


async def put_rows(store: Any, engine: AsyncEngine | None, rows: list[RunRow]) -> None:
    """Write whole run rows behind jobrun's back."""
    if not rows:
        return
    if engine is None:
        for row in rows:
            store.runs[row.id] = row
        return
    async with engine.begin() as connection:
        await connection.execute(insert(runs_table), [dataclasses.asdict(row) for row in rows])


async def set_columns(store: Any, engine: AsyncEngine | None, run_id: str, **values: Any) -> None:
    """Overwrite columns of one row behind jobrun's back."""
    if engine is None:
        store.runs[run_id] = dataclasses.replace(store.runs[run_id], **values)
        return
    async with engine.begin() as connection:
        await connection.execute(
            update(runs_table).where(runs_table.c.id == run_id).values(**values)
        )


async def revision_of(engine: AsyncEngine) -> str | None:
    """The database's current migration revision (None before the first)."""
    async with engine.connect() as connection:
        return await connection.run_sync(current_revision)


async def run_alembic(*args: str, env: dict[str, str]) -> tuple[int, str]:
    """``alembic ...`` as a user would type it at the repository root: exit code, output."""
    process = await asyncio.create_subprocess_exec(
        str(ALEMBIC),
        *args,
        cwd=REPO,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    output, _ = await asyncio.wait_for(process.communicate(), timeout=60)
    return process.returncode or 0, output.decode()


class StatementLog:
    """A ``statement_hook`` that records every statement a store sends, as
    ``(operation, sql, parameters)``; ``before``/``after`` (if set) run around each one."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str, Sequence[Any]]] = []
        self.before: Any = None
        self.after: Any = None

    @asynccontextmanager
    async def __call__(
        self, operation: str, sql: str, parameters: Sequence[Any]
    ) -> AsyncIterator[None]:
        self.seen.append((operation, sql, parameters))
        if self.before is not None:
            await self.before(operation, sql)
        yield
        if self.after is not None:
            await self.after(operation, sql)

    def sql(self, containing: str = "") -> list[str]:
        return [sql for _, sql, _ in self.seen if containing in sql]


def logged_store(engine: AsyncEngine, **options: Any) -> tuple[jobrun.SqlJobRunStore, StatementLog]:
    """A SQL store on ``engine`` whose statements are recorded (the path users run)."""
    log = StatementLog()
    return jobrun.SqlJobRunStore(engine, statement_hook=log, **options), log


def log_worker_statements(monkeypatch: pytest.MonkeyPatch) -> StatementLog:
    """Every statement of the stores ``run_worker`` builds, through the store's own hook."""
    log = StatementLog()

    # A subclass, not a partial: run_worker also asks isinstance(database, SqlJobRunStore)
    # (so give it engines or URLs, not stores of your own).
    class LoggedStore(jobrun.SqlJobRunStore):
        def __init__(self, engine: AsyncEngine, **options: Any) -> None:
            super().__init__(engine, statement_hook=log, **options)

    monkeypatch.setattr(worker_module, "SqlJobRunStore", LoggedStore)
    return log


async def claim_as(
    store: Any,
    clock: Any,
    token: str,
    *,
    driver: str = "dead-host:1",
    lease_ms: int = 1000,
    job: tuple[str, str] = ("m", "j"),
) -> RunRow | None:
    """Claim through the store port like a driver that then does nothing else."""
    now_at = format_instant(clock())
    claimed = await store.claim(
        ClaimRequest(now_at, token, driver, {job: add_milliseconds(now_at, lease_ms)})
    )
    return None if claimed is None else claimed.row
