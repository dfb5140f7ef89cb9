"""No run is stuck behind a connection (issue 31, item 2).

A store call of a pass that never answers (a connection gone silent: a dead
network path, a half-open socket, a thread blocked in the file system) is
abandoned at the pass's fence: the renewer stops renewing once a call of its
pass has been in flight for a renewal interval, the fence comes, the pass is
cancelled where it waits, its connection is discarded, and the run moves on.

* memory, SQLite, Postgres, on a ``FakeClock``: a step write that never
  answers while renewals go through (the issue's case) stops renewals and ends
  the pass within a lease and a renewal interval; the next pass finishes the run;
* SQLite: the connection's own thread blocked inside a call (no network, but a
  hung call all the same): the connection is given up, the run finishes on a
  fresh one;
* Postgres through ``tests/faultproxy.py``: one pool connection black-holed at
  the step write, the pass's chunks dropped for a while and then healed, the
  step write's connection half-closed: each run finishes.
"""

from __future__ import annotations

import asyncio
import itertools
import sqlite3
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from sqlalchemy import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

import jobrun
from jobrun.sql.executor import _sqlite_connection_of
from jobrun.testing import FakeClock
from tests.faultproxy import FaultProxy
from tests.support import row_of, start_id

MODULE, JOB = "stuck", "walk"
WEDGE = "wedge"


class HangingStepWrite:
    """A store whose first write of step ``WEDGE`` never answers; the rest pass through."""

    def __init__(self, inner: Any, clock: FakeClock) -> None:
        self.inner = inner
        self.clock = clock
        self.hung_at: float | None = None
        self.abandoned = False
        self.abandoned_at: float | None = None
        self.renewed_at: list[float] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def record_step(self, run_id: str, row: Any, now_at: str, token: str) -> bool:
        if row.step == WEDGE and self.hung_at is None:
            self.hung_at = self.clock.monotonic()
            try:
                await asyncio.Event().wait()  # never answers
            except asyncio.CancelledError:
                self.abandoned = True
                self.abandoned_at = self.clock.monotonic()
                raise
        return bool(await self.inner.record_step(run_id, row, now_at, token))

    async def extend_lease(self, *arguments: Any) -> bool:
        self.renewed_at.append(self.clock.monotonic())
        return bool(await self.inner.extend_lease(*arguments))


LEASE_MS = 4000


def walk(
    bodies: list[str],
    before: Callable[[str], Awaitable[None]] | None = None,
    lease_ms: int = LEASE_MS,
) -> jobrun.JobRegistry:
    registry = jobrun.JobRegistry()

    async def handler(p: jobrun.JobPass) -> jobrun.PassResult:
        for name in ("s1", WEDGE, "s3"):

            async def body(name: str = name) -> str:
                if before is not None:
                    await before(name)
                bodies.append(name)
                return name

            await p.step(name, body)
        return jobrun.PassResult(done=True)

    registry.register(MODULE, JOB, handler, lease_ms=lease_ms)
    return registry


async def test_a_step_write_that_never_answers_is_abandoned_at_the_fence(
    store: Any, clock: FakeClock
) -> None:
    hanging = HangingStepWrite(store, clock)
    bodies: list[str] = []
    run_id = await start_id(store, clock, module_id=MODULE, job=JOB)
    registry = walk(bodies)
    superseded = completed = 0
    # Bounds a hang only: before the fix the lease was renewed for as long as one looked.
    for _ in range(600):  # 30 s on the fake clock: seven leases
        if completed:
            break
        driving = asyncio.create_task(jobrun.run_due_jobs(hanging, registry, clock=clock))
        while not driving.done() and clock.monotonic() < 30:
            await asyncio.sleep(0.001)  # real time for the store's I/O between clock moves
            clock.advance(milliseconds=50)
        assert driving.done(), "the pass stayed stuck behind a write that never answered"
        report = driving.result()
        superseded, completed = superseded + report.superseded, completed + report.completed
    assert hanging.abandoned, "the write was abandoned (cancelled where it waited)"
    assert (superseded, completed) == (1, 1)
    assert hanging.hung_at is not None
    assert hanging.abandoned_at is not None
    interval_s = LEASE_MS / 4000
    # No renewal once the write had been in flight a renewal interval (the check and
    # the call are a few ticks of this clock apart: it moves while the store answers),
    # until the pass was abandoned: later renewals are the next pass's (under load its
    # real round trips let this clock pass its first renewal interval).
    late = [
        at
        for at in hanging.renewed_at
        if hanging.hung_at + 2 * interval_s <= at <= hanging.abandoned_at
    ]
    assert late == [], "renewed while the pass could not go on"
    row = await row_of(store, run_id)
    assert row.status == "done"
    # The wedged step ran once, was not recorded, and ran again in the next pass.
    assert bodies == ["s1", WEDGE, "s1", WEDGE, "s3"] or bodies == ["s1", WEDGE, WEDGE, "s3"]


async def test_sqlite_a_connection_whose_thread_is_blocked_is_given_up(sqlite_url: str) -> None:
    """SQLite has no network, but a call can still hang: the connection's thread
    blocked (a file system that stopped answering, say). The pass is fenced, the
    connection given up (its thread left to finish on its own), the run finishes
    on a fresh connection."""
    engine = create_async_engine(sqlite_url)
    store = jobrun.SqlJobRunStore(engine)
    release = threading.Event()
    run_id = await start_id(store, module_id=MODULE, job=JOB)
    connection = _sqlite_connection_of(engine)
    blocked = BlockingDriver(connection.driver, release)
    connection.driver = blocked
    try:
        bodies: list[str] = []
        registry = walk(bodies, lambda name: _arm(blocked, name), lease_ms=2000)
        totals = await drive_until_done(store, registry, run_id, 60)
        assert blocked.blocked, "the step write was held in the connection's thread"
        assert connection.driver is not blocked, "the blocked connection was given up"
        assert totals["superseded"] >= 1
        assert (await row_of(store, run_id)).status == "done"
    finally:
        release.set()
        # The given-up connection's thread ends once free; its last answers need this loop.
        await asyncio.to_thread(blocked.inner._thread.join, 30)
        await engine.dispose()


class BlockingDriver:
    """An aiosqlite connection whose next write, once armed, first blocks its thread."""

    def __init__(self, inner: Any, release: threading.Event) -> None:
        self.inner = inner
        self.release = release
        self.armed = False
        self.blocked = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def execute(self, sql: str, parameters: Any) -> Any:
        if self.armed:
            self.armed, self.blocked = False, True
            # In the connection's own thread, as a hung system call would be.
            await self.inner._execute(self.release.wait)
        return await self.inner.execute(sql, parameters)


async def _arm(driver: BlockingDriver, step: str) -> None:
    if step == WEDGE and not driver.blocked:
        driver.armed = True


# --- Postgres through the fault proxy --------------------------------------------------

POSTGRES = pytest.mark.postgres


@pytest.fixture
async def proxied(database_url: str | None) -> AsyncIterator[tuple[FaultProxy, AsyncEngine]]:
    assert database_url is not None
    url = make_url(database_url)
    async with FaultProxy(url.host or "127.0.0.1", url.port or 5432) as proxy:
        engine = create_async_engine(url.set(host="127.0.0.1", port=proxy.port))
        try:
            yield proxy, engine
        finally:
            await engine.dispose()


async def drive_until_done(
    store: Any, registry: jobrun.JobRegistry, run_id: str, deadline_s: float
) -> dict[str, int]:
    """Drive as a worker does (a store error is tried again shortly) until the run is
    done; the totals of the reports. ``deadline_s`` bounds a hang only."""
    totals = {"superseded": 0, "completed": 0, "store_errors": 0}
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        try:
            report = await asyncio.wait_for(jobrun.run_due_jobs(store, registry), deadline_s)
        except (OSError, TimeoutError, sqlite3.Error, jobrun.JobRunError, *_store_errors()):
            totals["store_errors"] += 1
            await asyncio.sleep(0.05)  # sleep: a worker's pause after a store error
            continue
        totals["superseded"] += report.superseded
        totals["completed"] += report.completed
        if totals["completed"]:
            return totals
        await asyncio.sleep(0.02)  # sleep: a worker's poll interval
    raise AssertionError(f"the run {run_id} was not done within {deadline_s} s: {totals}")


def _store_errors() -> tuple[type[BaseException], ...]:
    import asyncpg
    from sqlalchemy.exc import SQLAlchemyError

    return (SQLAlchemyError, asyncpg.PostgresError, asyncpg.InterfaceError)


@pytest.mark.parametrize("backend", [pytest.param("postgres", marks=POSTGRES)])
async def test_postgres_one_blackholed_connection_wedges_no_run(
    proxied: tuple[FaultProxy, AsyncEngine],
) -> None:
    proxy, engine = proxied
    store = jobrun.SqlJobRunStore(engine)
    run_id = await start_id(store, module_id=MODULE, job=JOB)
    bodies: list[str] = []
    marks: list[float] = []

    async def before(name: str) -> None:
        marks.append(time.monotonic())
        if name == WEDGE and proxy.silenced == 0:
            # The next chunk naming this run and this step (the step write) goes silent.
            proxy.blackhole_when(run_id.encode(), WEDGE.encode())

    registry = walk(bodies, before, lease_ms=2000)
    totals = await drive_until_done(store, registry, run_id, 60)
    assert proxy.silenced == 1, "the step write's connection was black-holed"
    assert totals["superseded"] >= 1
    stalled_s = max(later - earlier for earlier, later in itertools.pairwise(marks))
    print(f"\nblack-holed step write: longest gap between bodies {stalled_s:.2f} s (lease 2 s)")


@pytest.mark.parametrize("backend", [pytest.param("postgres", marks=POSTGRES)])
async def test_postgres_runs_finish_after_dropped_chunks_heal(
    proxied: tuple[FaultProxy, AsyncEngine],
) -> None:
    proxy, engine = proxied
    store = jobrun.SqlJobRunStore(engine)
    run_id = await start_id(store, module_id=MODULE, job=JOB)
    bodies: list[str] = []

    async def before(name: str) -> None:
        if name == WEDGE and not proxy.dropped:
            # Every chunk naming this step lost for a while (its write: not the
            # renewals, nor the presence's checks, which would stop the pass on
            # their own), then healed: the write lost waits for an answer that
            # never comes, on a connection that works again.
            proxy.drop(1.0, seed=31, only_with=WEDGE.encode())
            asyncio.get_running_loop().call_later(1.0, proxy.heal)

    registry = walk(bodies, before, lease_ms=2000)
    totals = await drive_until_done(store, registry, run_id, 60)
    assert proxy.dropped >= 1
    print(f"\ndropped chunks: {proxy.dropped}; {totals}")


@pytest.mark.parametrize("backend", [pytest.param("postgres", marks=POSTGRES)])
async def test_postgres_half_closed_connections_wedge_no_run(
    proxied: tuple[FaultProxy, AsyncEngine],
) -> None:
    proxy, engine = proxied
    store = jobrun.SqlJobRunStore(engine)
    run_id = await start_id(store, module_id=MODULE, job=JOB)
    bodies: list[str] = []
    closed: list[int] = []

    async def before(name: str) -> None:
        if name == WEDGE and not closed:
            # The server ends the session of the step write's connection (a FIN
            # from its side of the proxy); the client is told nothing.
            proxy.blackhole_when(run_id.encode(), WEDGE.encode(), half_close=True)
            closed.append(1)

    registry = walk(bodies, before, lease_ms=2000)
    totals = await drive_until_done(store, registry, run_id, 60)
    assert proxy.silenced == 1, "the step write's connection was half-closed"
    print(f"\nhalf-closed the step write's connection; {totals}")
