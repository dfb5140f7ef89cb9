"""Tenants in Postgres schemas, the refusals around them, and a DML-only application role."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path

import pytest
from click.testing import CliRunner
from sqlalchemy import inspect, make_url, text
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

import jobrun
import jobrun._cli.commands.db  # registers the db commands on the group
from jobrun._cli.app import cli
from jobrun.sql.postgres.tenancy import notify_channel
from jobrun.sql.schema import COMPAT_TABLE, SCHEMA_REVISION, VERSION_TABLE, metadata
from jobrun.testing import FakeClock
from tests.support import drive, revision_of, run_in_thread

JOBRUN_TABLES = {*metadata.tables, VERSION_TABLE, COMPAT_TABLE}


@pytest.fixture
async def blank_engine(empty_postgres_url: str) -> AsyncIterator[AsyncEngine]:
    engine = create_async_engine(empty_postgres_url)
    try:
        yield engine
    finally:
        await engine.dispose()


async def tables_by_schema(engine: AsyncEngine) -> dict[str, set[str]]:
    async with engine.connect() as connection:
        rows = await connection.execute(
            text(
                "SELECT table_schema, table_name FROM information_schema.tables "
                "WHERE table_schema NOT IN ('pg_catalog', 'information_schema')"
            )
        )
        found: dict[str, set[str]] = {}
        for schema, table in rows:
            found.setdefault(schema, set()).add(table)
        return found


def one_pass_registry() -> jobrun.JobRegistry:
    registry = jobrun.JobRegistry()

    async def handler(p: jobrun.JobPass) -> jobrun.PassResult:
        await p.step("only", lambda: {"tenant": p.run.instance})
        return jobrun.PassResult(cursor="end", done=True)

    registry.register("shop", "sync", handler)
    return registry


@pytest.mark.postgres
async def test_two_tenants_in_one_database_are_isolated_both_ways(blank_engine: AsyncEngine):
    for tenant in ("tenant_a", "tenant_b"):
        await jobrun.upgrade(blank_engine, schema=tenant)
    assert await tables_by_schema(blank_engine) == {
        "tenant_a": JOBRUN_TABLES,
        "tenant_b": JOBRUN_TABLES,
    }  # nothing in public
    clock = FakeClock()
    a = jobrun.SqlJobRunStore(blank_engine, schema="tenant_a")
    b = jobrun.SqlJobRunStore(blank_engine, schema="tenant_b")
    assert a.engine is blank_engine  # the host's engine is left as it was
    run_a = await jobrun.start_job_run(a, module_id="shop", job="sync", clock=clock)
    assert await jobrun.job_runs(b) == []
    assert await jobrun.get_job_run(b, run_a.id) is None
    # The same key in the other tenant is a run of its own, not a join.
    run_b = await jobrun.start_job_run(b, module_id="shop", job="sync", clock=clock)
    assert run_b.id != run_a.id
    report = await drive(a, one_pass_registry(), clock)
    assert report.completed == 1
    assert (await jobrun.get_job_run(a, run_a.id)).status == "done"
    assert (await jobrun.get_job_run(b, run_b.id)).status == "running"
    assert [run.id for run in await jobrun.job_runs(b)] == [run_b.id]
    async with blank_engine.connect() as connection:
        for tenant in ("tenant_a", "tenant_b"):
            revision = await connection.run_sync(
                jobrun.sql.upgrades.migrate.current_revision, tenant
            )
            assert revision == SCHEMA_REVISION
    assert await revision_of(blank_engine) is None  # no version table on the search path
    # Down in one tenant leaves the other alone.
    await jobrun.sql.upgrades.migrate.downgrade(blank_engine, schema="tenant_a")
    assert (await tables_by_schema(blank_engine))["tenant_a"] == {VERSION_TABLE}
    assert [run.id for run in await jobrun.job_runs(b)] == [run_b.id]


@pytest.mark.postgres
async def test_a_start_announces_on_its_own_tenants_channel_only(blank_engine: AsyncEngine):
    for tenant in ("tenant_a", "tenant_b"):
        await jobrun.upgrade(blank_engine, schema=tenant)
    heard: asyncio.Queue[str] = asyncio.Queue()
    channels = [notify_channel(None), notify_channel("tenant_a"), notify_channel("tenant_b")]
    async with blank_engine.connect() as connection:
        raw = (await connection.get_raw_connection()).driver_connection
        assert raw is not None
        for channel in channels:
            await raw.add_listener(
                channel, lambda _c, _p, channel, _payload: heard.put_nowait(channel)
            )
        for tenant in ("tenant_a", "tenant_b"):
            store = jobrun.SqlJobRunStore(blank_engine, schema=tenant)
            await jobrun.start_job_run(store, module_id="shop", job="sync")
        # Notifications arrive in commit order: had tenant_a's start been announced
        # on another channel too, it would come before tenant_b's.
        assert [await heard.get(), await heard.get()] == [
            "jobrun_started.tenant_a",
            "jobrun_started.tenant_b",
        ]
        assert heard.empty()
        for channel in channels:
            await raw.remove_listener(channel, lambda *_: None)


@pytest.mark.postgres
async def test_a_worker_for_one_tenant_drives_that_tenant_only(blank_engine: AsyncEngine):
    for tenant in ("tenant_a", "tenant_b"):
        await jobrun.upgrade(blank_engine, schema=tenant)
    a = jobrun.SqlJobRunStore(blank_engine, schema="tenant_a")
    b = jobrun.SqlJobRunStore(blank_engine, schema="tenant_b")
    waiting = await jobrun.start_job_run(b, module_id="shop", job="sync")
    stop = asyncio.Event()
    registry = jobrun.JobRegistry()
    seen: list[str] = []

    def handler(p: jobrun.JobPass) -> jobrun.PassResult:
        seen.append(p.run.id)
        stop.set()
        return jobrun.PassResult(cursor="end", done=True)

    registry.register("shop", "sync", handler)
    worker = asyncio.create_task(
        jobrun.run_worker([blank_engine], registry, schema="tenant_a", stop=stop, interval_s=60)
    )
    run = await jobrun.start_job_run(a, module_id="shop", job="sync")
    await asyncio.wait_for(worker, timeout=60)  # woken by the NOTIFY, not a 60 s poll
    assert seen == [run.id]
    assert (await jobrun.get_job_run(b, waiting.id)).status == "running"


@pytest.mark.postgres
async def test_a_schema_translate_map_is_refused_before_anything_changes(
    blank_engine: AsyncEngine,
):
    mapped = blank_engine.execution_options(schema_translate_map={None: "tenant_a"})
    with pytest.raises(jobrun.JobValidationError, match="schema_translate_map"):
        await jobrun.upgrade(mapped)
    with pytest.raises(jobrun.JobValidationError, match="schema_translate_map"):
        await jobrun.upgrade(mapped, schema="tenant_a")
    with pytest.raises(jobrun.JobValidationError, match="schema_translate_map"):
        jobrun.SqlJobRunStore(mapped)
    assert await tables_by_schema(blank_engine) == {}
    async with blank_engine.connect() as connection:
        schemas = await connection.run_sync(lambda sync: inspect(sync).get_schema_names())
    assert "tenant_a" not in schemas


@pytest.mark.postgres
@pytest.mark.parametrize("name", ["Tenant", "1tenant", "a-b", "a" * 49, "", 'x"; drop'])
async def test_a_schema_name_jobrun_cannot_use_is_refused(blank_engine: AsyncEngine, name: str):
    with pytest.raises(jobrun.JobValidationError, match="schema"):
        await jobrun.upgrade(blank_engine, schema=name)
    with pytest.raises(jobrun.JobValidationError, match="schema"):
        jobrun.SqlJobRunStore(blank_engine, schema=name)
    assert await tables_by_schema(blank_engine) == {}


@pytest.mark.parametrize("blank_url", ["sqlite"], indirect=True)
async def test_sqlite_refuses_a_schema(blank_url: str) -> None:
    engine = create_async_engine(blank_url)
    try:
        with pytest.raises(jobrun.JobValidationError, match="needs Postgres"):
            await jobrun.upgrade(engine, schema="tenant_a")
        with pytest.raises(jobrun.JobValidationError, match="needs Postgres"):
            jobrun.SqlJobRunStore(engine, schema="tenant_a")
        assert await revision_of(engine) is None
    finally:
        await engine.dispose()


def cli_result(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    return result.exit_code, result.output


@pytest.mark.postgres
def test_the_db_commands_take_a_schema(empty_postgres_url: str) -> None:
    url = empty_postgres_url
    code, output = cli_result("db", "upgrade", "--url", url, "--schema", "tenant_c")
    assert code == 0, output
    assert f"to {SCHEMA_REVISION} (head)" in output
    code, output = cli_result("db", "current", "--url", url, "--schema", "tenant_c")
    assert f"current: {SCHEMA_REVISION}" in output
    code, output = cli_result("db", "check", "--url", url, "--schema", "tenant_c")
    assert code == 0, output
    code, output = cli_result("db", "current", "--url", url)
    assert "current: none" in output  # the default search path has no jobrun tables
    code, output = cli_result("db", "upgrade", "--url", url, "--schema", "Bad-Name")
    assert code == 2, output
    assert "lower-case" in output


# -- least privilege -----------------------------------------------------------------

GRANTS = """
GRANT USAGE ON SCHEMA public TO {role};
GRANT SELECT, INSERT, UPDATE, DELETE ON _substrat_job_runs, _substrat_job_steps TO {role};
GRANT SELECT ON jobrun_alembic_version, jobrun_schema_compat TO {role};
GRANT SELECT, INSERT, UPDATE, DELETE ON _substrat_job_schedules, _substrat_job_retention TO {role};
GRANT SELECT, INSERT, UPDATE, DELETE ON _substrat_job_workers TO {role};
GRANT SELECT, INSERT, UPDATE, DELETE ON _substrat_job_pauses, _substrat_job_limit_pauses TO {role};
GRANT SELECT, INSERT, UPDATE, DELETE
    ON _substrat_rate_buckets, _substrat_concurrency_slots TO {role};
"""


@pytest.fixture
async def app_role_url(empty_postgres_url: str) -> AsyncIterator[str]:
    """The database migrated by its owner, and the URL of a role with the documented
    grants only (DML on jobrun's tables, SELECT on the version table)."""
    role = f"jobrun_app_{uuid.uuid4().hex[:10]}"
    owner = create_async_engine(empty_postgres_url, isolation_level="AUTOCOMMIT")
    try:
        await jobrun.upgrade(owner)
        async with owner.connect() as connection:
            await connection.exec_driver_sql(f'CREATE ROLE "{role}" LOGIN')
            database = make_url(empty_postgres_url).database
            await connection.exec_driver_sql(f'REVOKE ALL ON DATABASE "{database}" FROM PUBLIC')
            await connection.exec_driver_sql(f'GRANT CONNECT ON DATABASE "{database}" TO "{role}"')
            for grant in filter(None, (part.strip() for part in GRANTS.split(";"))):
                await connection.exec_driver_sql(grant.format(role=f'"{role}"'))
        yield make_url(empty_postgres_url).set(username=role).render_as_string(hide_password=False)
    finally:
        async with owner.connect() as connection:
            await connection.exec_driver_sql(f'DROP OWNED BY "{role}"')
        await owner.dispose()
        # The role's connections are gone with its engine; the database is dropped after.
        admin = create_async_engine(empty_postgres_url, isolation_level="AUTOCOMMIT")
        async with admin.connect() as connection:
            await connection.exec_driver_sql(
                f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = '{role}'"
            )
            await connection.exec_driver_sql(f'DROP ROLE IF EXISTS "{role}"')
        await admin.dispose()


@pytest.mark.postgres
async def test_a_dml_only_role_drives_lists_and_acts(app_role_url: str, tmp_path: Path):
    engine = create_async_engine(app_role_url)
    try:
        async with engine.connect() as connection:
            with pytest.raises(Exception, match="permission denied"):
                await connection.exec_driver_sql("CREATE TABLE intruder (id int)")
        store = jobrun.SqlJobRunStore(engine)
        clock = FakeClock()
        done = await jobrun.start_job_run(store, module_id="shop", job="sync", clock=clock)
        assert (await drive(store, one_pass_registry(), clock)).completed == 1
        assert (await jobrun.get_job_run(store, done.id)).status == "done"
        other = await jobrun.start_job_run(
            store, module_id="shop", job="sync", instance="x", clock=clock
        )
        await jobrun.cancel_job_run(store, other.id, "operator test", clock=clock)
        assert (await jobrun.resume_job_run(store, other.id, clock=clock)).status == "running"
        assert {run.id for run in await jobrun.job_runs(store)} == {done.id, other.id}
        clock.advance(seconds=2 * 86400)
        assert await jobrun.prune_job_runs(store, older_than=timedelta(days=1), clock=clock) == 1
        assert (await jobrun.job_run_health(store)).running == 1
        # Starting up with jobrun.upgrade at head writes nothing, so it works too.
        await jobrun.upgrade(engine)
    finally:
        await engine.dispose()
    code, output = await asyncio.to_thread(cli_result, "db", "check", "--url", app_role_url)
    assert code == 0, output


@pytest.mark.postgres
def test_db_check_names_each_missing_privilege(app_role_url: str, empty_postgres_url: str):
    role = make_url(app_role_url).username

    async def revoke() -> None:
        owner = create_async_engine(empty_postgres_url, isolation_level="AUTOCOMMIT")
        async with owner.connect() as connection:
            await connection.exec_driver_sql(f'REVOKE INSERT ON _substrat_job_steps FROM "{role}"')
            await connection.exec_driver_sql(
                f'REVOKE SELECT ON jobrun_alembic_version FROM "{role}"'
            )
        await owner.dispose()

    run_in_thread(revoke)
    code, output = cli_result("db", "check", "--url", app_role_url)
    assert code == 1, output
    assert output.splitlines() == [
        f"missing privilege: INSERT on public._substrat_job_steps for role {role} "
        f'(GRANT INSERT ON "public"."_substrat_job_steps" TO "{role}")',
        f"missing privilege: SELECT on public.{VERSION_TABLE} for role {role} "
        f'(GRANT SELECT ON "public"."{VERSION_TABLE}" TO "{role}")',
    ]
