"""Tenants spread over several Postgres servers by configuration (docs/explanation/scaling-out.md).

Three databases stand in for three servers. A placement file maps each tenant to
its server's URL; the application reads it to start a tenant's runs, and each
server gets one ``jobrun.run_worker`` given only that server's URL. Public API only.
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from sqlalchemy import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

import jobrun

pytestmark = pytest.mark.postgres

TENANTS = [f"tenant-{letter}" for letter in "abcdef"]


async def admin(statement: str) -> None:
    engine = create_async_engine(
        os.environ["JOBRUN_TEST_POSTGRES_URL"], isolation_level="AUTOCOMMIT"
    )
    try:
        async with engine.connect() as connection:
            await connection.exec_driver_sql(statement)
    finally:
        await engine.dispose()


@pytest.fixture
async def servers(postgres_template: str) -> AsyncIterator[list[str]]:
    """Three migrated databases, one per stand-in server, dropped afterwards."""
    names = [f"jobrun_server_{number}_{uuid.uuid4().hex[:8]}" for number in range(3)]
    base = make_url(os.environ["JOBRUN_TEST_POSTGRES_URL"])
    try:
        for name in names:
            await admin(f'CREATE DATABASE "{name}" TEMPLATE "{postgres_template}"')
        yield [base.set(database=name).render_as_string(hide_password=False) for name in names]
    finally:
        for name in names:
            await admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def write_placement(path: Path, servers: list[str]) -> None:
    """The operator's placement: two tenants per server, one line per tenant."""
    lines = [f"{tenant} {servers[index % len(servers)]}" for index, tenant in enumerate(TENANTS)]
    path.write_text("# tenant  database URL\n" + "\n".join(lines) + "\n")


# --8<-- [start:placement]
def read_placement(path: Path) -> dict[str, str]:
    """What the application and the workers both read: tenant -> database URL."""
    placement = {}
    for line in path.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            tenant, url = line.split()
            placement[tenant] = url
    return placement


class Tenants:
    """The application's side: one engine and store per database, a tenant's by placement."""

    def __init__(self, placement: dict[str, str]) -> None:
        self.placement = placement
        self.engines: dict[str, AsyncEngine] = {}
        self.stores: dict[str, jobrun.SqlJobRunStore] = {}

    def store(self, tenant: str) -> jobrun.SqlJobRunStore:
        url = self.placement[tenant]
        if url not in self.stores:
            self.engines[url] = create_async_engine(url)
            self.stores[url] = jobrun.SqlJobRunStore(self.engines[url])
        return self.stores[url]

    async def start(self, tenant: str) -> jobrun.JobRun:
        payload = {"tenant": tenant}
        store = self.store(tenant)
        return await jobrun.start_job_run(
            store, module_id="tenants", job="sync", instance=tenant, payload=payload
        )

    async def close(self) -> None:
        for engine in self.engines.values():
            await engine.dispose()


# --8<-- [end:placement]


class SyncJob:
    """Each run: a first pass that waits for ``release`` (so it is live when started
    again), then a step that notes the database it runs in; a second pass ends it."""

    def __init__(self) -> None:
        self.entered = {tenant: asyncio.Event() for tenant in TENANTS}
        self.release = asyncio.Event()
        self.ran_in: dict[str, str | None] = {}
        self.registry = jobrun.JobRegistry()
        self.registry.register("tenants", "sync", self.sync)

    async def sync(self, p: jobrun.JobPass) -> jobrun.PassResult:
        tenant = p.payload["tenant"]
        if p.cursor is None:
            self.entered[tenant].set()
            await self.release.wait()
            scope = await p.scope()  # the store's engine: the database this run lives in
            await p.step("where", lambda: self.ran_in.setdefault(tenant, scope.url.database))
            return jobrun.PassResult(cursor=1)
        return jobrun.PassResult(done=True)


async def until_done(tenants: Tenants, runs: dict[str, str], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    for tenant, run_id in runs.items():
        while (await jobrun.get_job_run(tenants.store(tenant), run_id)).status == "running":
            assert time.monotonic() < deadline, f"{tenant}'s run is still running"
            await asyncio.sleep(0.05)  # poll interval while the workers drive


async def test_tenants_spread_over_servers_by_placement(servers: list[str], tmp_path: Path) -> None:
    placement_file = tmp_path / "placement.txt"
    write_placement(placement_file, servers)
    placement = read_placement(placement_file)
    job, stop = SyncJob(), asyncio.Event()
    tenants = Tenants(placement)
    # One worker per server, given only its server's URL (from the same file).
    workers = [
        asyncio.ensure_future(
            jobrun.run_worker(
                [url], job.registry, stop=stop, concurrency=len(TENANTS), interval_s=0.5
            )
        )
        for url in sorted(set(placement.values()))
    ]
    try:
        runs = {tenant: (await tenants.start(tenant)).id for tenant in TENANTS}
        await asyncio.wait_for(asyncio.gather(*(e.wait() for e in job.entered.values())), 60)
        # Every run is in its first pass now: a start for its tenant joins it.
        again = {tenant: await tenants.start(tenant) for tenant in TENANTS}
        assert {tenant: run.id for tenant, run in again.items()} == runs
        assert {run.status for run in again.values()} == {"running"}
        job.release.set()
        await until_done(tenants, runs, timeout_s=60)
    finally:
        job.release.set()  # so that no pass in flight keeps a worker from stopping
        stop.set()
        await asyncio.gather(*workers)
    try:
        await assert_each_database_holds_its_tenants(tenants, servers, runs)
    finally:
        await tenants.close()
    # Each tenant's pass ran in its own database, driven by that server's worker.
    assert job.ran_in == {tenant: make_url(url).database for tenant, url in placement.items()}


async def assert_each_database_holds_its_tenants(
    tenants: Tenants, servers: list[str], runs: dict[str, str]
) -> None:
    for url in servers:
        store = tenants.stores[url]
        placed_here = {tenant for tenant, placed in tenants.placement.items() if placed == url}
        seen = await jobrun.job_runs(store, module_id="tenants")
        # No database sees another's runs, and each of its own ran there and ended done.
        assert {run.instance for run in seen} == placed_here
        assert {run.id for run in seen} == {runs[tenant] for tenant in placed_here}
        assert {run.status for run in seen} == {"done"}
        assert len(placed_here) == 2
    for tenant, run_id in runs.items():
        record = await jobrun.get_job_run(tenants.store(tenant), run_id)
        assert (record.instance, record.cursor, record.passes_committed) == (tenant, 1, 2)
