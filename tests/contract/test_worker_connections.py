"""The worker's connection budget on an engine handed in, and a first read that waits
(issue 33 item 3).

``run_worker`` with the caller's own engine (its default pool: 5 and 10 more) kept up
to the pool's size less one, plus the presence: 6 server connections per process where
the docs budget 2 kept + 1 presence (+ 1 readiness probe). And a store that failed the
worker's first read at start (a pooler still queueing clients) ended the worker.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest
from sqlalchemy import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.pool import NullPool

import jobrun
from jobrun.errors import StoreError
from tests.faultproxy import FaultProxy
from tests.support import SQL_BACKENDS

ON_POSTGRES = pytest.mark.parametrize("backend", ["postgres"])
POSTGRES = pytest.mark.postgres
MODULE, JOB = "walk", "pages"
RUNS = 8
PAGES = 6
DRIVERS = 8
# max_connections_per_database (2, the default) and the presence's own connection.
BUDGET = 2 + 1


def pages_registry() -> jobrun.JobRegistry:
    registry = jobrun.JobRegistry()

    @registry.job(MODULE, JOB)
    async def pages(p: jobrun.JobPass) -> dict[str, Any]:
        page = int(p.cursor or 0)
        for index in range(3):
            await p.step(f"item-{index}", lambda index=index: index)
        return {"cursor": page + 1, "done": page + 1 >= PAGES}

    return registry


@pytest.fixture
async def admin(database_url: str) -> AsyncIterator[Any]:
    """A connection to the server's own ``postgres`` database, so it is not counted."""
    url = make_url(database_url).set(drivername="postgresql", database="postgres")
    connection = await asyncpg.connect(url.render_as_string(False))
    try:
        yield connection
    finally:
        await connection.close()


READER = "jobrun-test-reader"


async def most_connections(
    admin: Any, database: str, until: asyncio.Event, seen: list[int]
) -> None:
    """Count the server connections on ``database`` but the test's own reader's, until
    ``until`` is set."""
    while not until.is_set():
        seen.append(
            await admin.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = $1 "
                "AND application_name IS DISTINCT FROM $2",
                database,
                READER,
            )
        )
        await asyncio.sleep(0.005)


async def all_ended(engine: AsyncEngine, stop: asyncio.Event) -> None:
    store = jobrun.SqlJobRunStore(engine)
    while True:
        health = await jobrun.job_run_health(store)
        if health.running == 0:
            stop.set()
            return
        # sleep: a poll interval; the test's own timeout only bounds a hang
        await asyncio.sleep(0.05)


async def drive_counting(database_url: str, admin: Any, given: Any) -> list[int]:
    """Drive ``RUNS`` runs with ``DRIVERS`` drivers on what ``given(engine)`` hands the
    worker; the connection counts seen on the way."""
    engine = create_async_engine(database_url)  # the caller's own, with its default pool
    # The test's own reads, on connections of their own that are not counted.
    reader = create_async_engine(
        database_url,
        poolclass=NullPool,
        connect_args={"server_settings": {"application_name": READER}},
    )
    try:
        # As the walk example does: the runs started on the engine the worker gets.
        store = jobrun.SqlJobRunStore(engine)
        for index in range(RUNS):
            await jobrun.start_job_run(store, module_id=MODULE, job=JOB, instance=str(index))
        stop, sampled, seen = asyncio.Event(), asyncio.Event(), []
        sampler = asyncio.create_task(
            most_connections(admin, make_url(database_url).database or "", sampled, seen)
        )
        try:
            worker = jobrun.run_worker(
                [given(engine)], pages_registry(), concurrency=DRIVERS, stop=stop, interval_s=0.5
            )
            async with asyncio.timeout(120):  # bounds a hang only
                await asyncio.gather(worker, all_ended(reader, stop))
        finally:
            sampled.set()
            await sampler
        return seen
    finally:
        await reader.dispose()
        await engine.dispose()


@POSTGRES
@ON_POSTGRES
@pytest.mark.parametrize("hand", ["engine", "store"])
async def test_a_worker_keeps_its_connection_budget_on_an_engine_handed_in(
    database_url: str, admin: Any, hand: str
) -> None:
    def given(engine: AsyncEngine) -> Any:
        return engine if hand == "engine" else jobrun.SqlJobRunStore(engine)

    seen = await drive_counting(database_url, admin, given)
    assert seen, "no sample taken"
    assert max(seen) <= BUDGET, f"{max(seen)} connections at once"


class FailingFirst(jobrun.SqlJobRunStore):
    """A store whose first ``failures`` clock reads fail, as behind a pooler whose
    clients queue (``query_wait_timeout``) while the worker starts."""

    def __init__(self, engine: AsyncEngine, failures: int) -> None:
        super().__init__(engine)
        self.failures = failures
        self.failed = 0

    async def clock_offset_s(self) -> float:
        if self.failed < self.failures:
            self.failed += 1
            raise StoreError("clock_offset", ConnectionError("query_wait_timeout"))
        return await super().clock_offset_s()


@pytest.mark.parametrize("backend", SQL_BACKENDS, indirect=True)
async def test_a_worker_whose_first_reads_fail_waits_and_then_drives(
    engine: AsyncEngine, caplog: pytest.LogCaptureFixture
) -> None:
    store = FailingFirst(engine, failures=0)
    await jobrun.start_job_run(store, module_id=MODULE, job=JOB, instance="a")
    store.failures = 3  # from the worker's start on
    stop = asyncio.Event()
    caplog.set_level(logging.DEBUG, logger="jobrun.worker")
    async with asyncio.timeout(120):  # bounds a hang only
        await asyncio.gather(
            jobrun.run_worker([store], pages_registry(), stop=stop, interval_s=0.5),
            all_ended(engine, stop),
        )
    assert store.failed == 3
    run = (await jobrun.job_runs(store, module_id=MODULE, job=JOB))[0]
    assert (run.status, run.cursor) == ("done", PAGES)
    warnings = [
        record.getMessage() for record in caplog.records if "at start failed" in record.getMessage()
    ]
    assert warnings, caplog.text
    assert "query_wait_timeout" in warnings[0]


class Heard(logging.Handler):
    """Sets ``seen`` once a record whose message holds ``text`` is logged."""

    def __init__(self, text: str) -> None:
        super().__init__(logging.WARNING)
        self.text = text
        self.seen = asyncio.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if self.text in record.getMessage():
            self.seen.set()


@POSTGRES
@ON_POSTGRES
async def test_a_worker_started_while_the_network_holds_every_byte_waits_and_then_drives(
    database_url: str,
) -> None:
    """A real fault: the worker's server is behind a proxy that passes nothing when it
    starts (its connects time out), then heals."""
    direct = create_async_engine(database_url)
    heard = Heard("at start failed")
    logging.getLogger("jobrun.worker").addHandler(heard)
    async with FaultProxy() as proxy:
        url = make_url(database_url).set(host="127.0.0.1", port=proxy.port)
        # A short connect timeout, so that the held connects fail soon.
        proxied = create_async_engine(url, connect_args={"timeout": 1})
        try:
            await jobrun.start_job_run(
                jobrun.SqlJobRunStore(direct), module_id=MODULE, job=JOB, instance="a"
            )
            proxy.blackhole()
            stop = asyncio.Event()
            worker = asyncio.create_task(
                jobrun.run_worker([proxied], pages_registry(), stop=stop, interval_s=0.5)
            )
            async with asyncio.timeout(120):  # bounds a hang only
                warned = asyncio.create_task(heard.seen.wait())
                await asyncio.wait([warned, worker], return_when=asyncio.FIRST_COMPLETED)
                if worker.done():
                    warned.cancel()
                    pytest.fail(f"the worker ended at its first failed read: {worker.exception()}")
                proxy.heal()
                await asyncio.gather(worker, all_ended(direct, stop))
            run = (await jobrun.job_runs(jobrun.SqlJobRunStore(direct)))[0]
            assert (run.status, run.cursor) == ("done", PAGES)
        finally:
            logging.getLogger("jobrun.worker").removeHandler(heard)
            await proxied.dispose()
            await direct.dispose()
