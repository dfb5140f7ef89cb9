"""``--schema`` on the operator commands and the console: two tenants in one Postgres
database, each command seeing and changing its own tenant only; SQLite refuses it.

The commands run in-process (``CliRunner``); each runs its own ``asyncio.run``,
so setup that needs the database runs on a private loop (``run_in_thread``).
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from click.testing import CliRunner
from sqlalchemy.ext.asyncio import create_async_engine

import jobrun
import jobrun._cli.commands.actions  # registers the commands on the group
import jobrun._cli.commands.health
import jobrun._cli.commands.runs
import jobrun._cli.commands.schedules
import jobrun._cli.commands.ui
import jobrun._cli.commands.worker
from jobrun._cli.app import cli
from jobrun.sql.postgres.tenancy import in_schema
from jobrun.sql.schema import SCHEMA_REVISION
from jobrun.ui import create_app
from tests.support import REPO, iso, run_in_thread, set_columns

TENANTS = ("tenant_a", "tenant_b")


def jobrun_cli(*args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    result = CliRunner().invoke(cli, list(args), env=env, catch_exceptions=False)
    return result.exit_code, result.output


def cli_json(*args: str) -> Any:
    code, output = jobrun_cli(*args, "--json")
    assert code == 0, output
    return json.loads(output)


@pytest.fixture
def tenants_url(empty_postgres_url: str) -> str:
    """One Postgres database with jobrun's tables in two schemas and none in public."""

    async def provision() -> None:
        engine = create_async_engine(empty_postgres_url)
        try:
            for tenant in TENANTS:
                await jobrun.upgrade(engine, schema=tenant)
        finally:
            await engine.dispose()

    run_in_thread(provision)
    return empty_postgres_url


def set_run_columns(url: str, schema: str, run_id: str, **values: Any) -> None:
    """Overwrite columns of one run of one tenant behind jobrun's back."""

    async def write() -> None:
        engine = create_async_engine(url)
        try:
            await set_columns(None, in_schema(engine, schema), run_id, **values)
        finally:
            await engine.dispose()

    run_in_thread(write)


def start_in_both(url: str) -> dict[str, str]:
    """The same key started in each tenant: a run of each, by tenant."""
    ids = {}
    for tenant in TENANTS:
        code, output = jobrun_cli("start", "--url", url, "--schema", tenant, "shop", "sync")
        assert code == 0, output
        assert output.startswith("started "), output  # a run of its own, not a join
        ids[tenant] = output.split()[1]
    assert ids["tenant_a"] != ids["tenant_b"]
    return ids


@pytest.mark.postgres
def test_a_run_started_in_one_schema_is_listed_in_that_schema_only(tenants_url: str) -> None:
    url = tenants_url
    code, output = jobrun_cli("start", "--url", url, "--schema", "tenant_a", "shop", "sync")
    assert code == 0, output
    run_id = output.split()[1]
    assert [run["id"] for run in cli_json("runs", "--url", url, "--schema", "tenant_a")] == [run_id]
    assert cli_json("runs", "--url", url, "--schema", "tenant_b") == []
    # JOBRUN_SCHEMA says the same as --schema.
    code, output = jobrun_cli("runs", "--url", url, "--json", env={"JOBRUN_SCHEMA": "tenant_a"})
    assert code == 0, output
    assert [run["id"] for run in json.loads(output)] == [run_id]
    # Without a schema the search path (public) has no jobrun tables: one line, exit 1.
    code, output = jobrun_cli("runs", "--url", url)
    assert code == 1
    assert output.startswith("Error: the database has no jobrun schema"), output
    assert len(output.splitlines()) == 1


@pytest.mark.postgres
def test_show_watch_cancel_and_resume_reach_their_own_schema_only(tenants_url: str) -> None:
    url = tenants_url
    ids = start_in_both(url)
    a, b = ids["tenant_a"], ids["tenant_b"]
    for command in (("show", a), ("watch", a), ("cancel", a, "--reason", "x"), ("resume", a)):
        code, output = jobrun_cli(command[0], "--url", url, "--schema", "tenant_b", *command[1:])
        assert code == 1, (command, output)
        assert output == f"Error: no job run has the id {a!r}\n", (command, output)
    shown = cli_json("show", "--url", url, "--schema", "tenant_a", a)
    assert shown["run"]["id"] == a
    cancelled = cli_json("cancel", "--url", url, "--schema", "tenant_a", a, "--reason", "wrong")
    assert cancelled["status"] == "failed"
    assert cli_json("show", "--url", url, "--schema", "tenant_b", b)["run"]["status"] == "running"
    code, output = jobrun_cli("watch", "--url", url, "--schema", "tenant_a", a)
    assert code == 1  # the watched run failed
    assert f"run {a} cancelled: wrong" in output
    assert cli_json("resume", "--url", url, "--schema", "tenant_a", a)["status"] == "running"


@pytest.mark.postgres
def test_release_acts_in_its_own_schema_only(tenants_url: str) -> None:
    url = tenants_url
    ids = start_in_both(url)
    held = {
        "lease_owner": "token",
        "lease_driver": "dead-host",
        "lease_began_at": iso(datetime.now(UTC)),
    }
    for tenant in TENANTS:
        set_run_columns(url, tenant, ids[tenant], **held)
    code, output = jobrun_cli("release", "--url", url, "--schema", "tenant_b", ids["tenant_a"])
    assert code == 1, output
    released = cli_json("release", "--url", url, "--schema", "tenant_a", ids["tenant_a"])
    assert released == {"run_id": ids["tenant_a"], "released": True, "held_by": "dead-host"}
    still = cli_json("show", "--url", url, "--schema", "tenant_b", ids["tenant_b"])["run"]
    assert still["lease_driver"] == "dead-host"


@pytest.mark.postgres
def test_prune_and_health_count_their_own_schema_only(tenants_url: str) -> None:
    url = tenants_url
    ids = start_in_both(url)
    code, output = jobrun_cli(
        "start", "--url", url, "--schema", "tenant_b", "shop", "sync", "-i", "2"
    )
    assert code == 0, output
    long_ago = iso(datetime.now(UTC) - timedelta(days=30))
    for tenant in TENANTS:
        set_run_columns(url, tenant, ids[tenant], status="done", ended_at=long_ago)
    health = {tenant: cli_json("health", "--url", url, "--schema", tenant) for tenant in TENANTS}
    assert health["tenant_a"]["running"] == 0
    assert health["tenant_b"]["running"] == 1
    pruned = cli_json("prune", "--url", url, "--schema", "tenant_a", "--older-than", "7d")
    assert pruned == {"deleted": 1}
    assert cli_json("runs", "--url", url, "--schema", "tenant_a") == []
    left = {run["id"] for run in cli_json("runs", "--url", url, "--schema", "tenant_b")}
    assert ids["tenant_b"] in left
    assert len(left) == 2


@pytest.mark.postgres
def test_schedules_reads_its_own_schema(tenants_url: str) -> None:
    app = ("--app", "tests.processes.schedule_app:registry")
    listed = cli_json("schedules", "--url", tenants_url, "--schema", "tenant_a", *app)
    assert ("clock", "every2s") in {(state["module_id"], state["job"]) for state in listed}
    code, output = jobrun_cli("schedules", "--url", tenants_url, *app)
    assert code == 1  # the search path (public) has no jobrun tables
    assert output.startswith("Error: the database has no jobrun schema"), output


def runs_listed(page: str) -> set[str]:
    return set(re.findall(r'href="/db/0/runs/([0-9A-Z]{26})"', page))


@pytest.mark.postgres
async def test_the_console_on_a_tenant_store_shows_that_tenant_only(tenants_url: str) -> None:
    engine = create_async_engine(tenants_url)
    try:
        stores = {tenant: jobrun.SqlJobRunStore(engine, schema=tenant) for tenant in TENANTS}
        runs = {
            tenant: await jobrun.start_job_run(stores[tenant], module_id="shop", job="sync")
            for tenant in TENANTS
        }
        app = create_app([stores["tenant_a"]])
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://console.test") as client:
            page = await client.get("/db/0/runs")
            assert runs_listed(page.text) == {runs["tenant_a"].id}
            other = await client.get(f"/db/0/runs/{runs['tenant_b'].id}")
            assert other.status_code == 404
            health = await client.get("/health")
            # The revision is read from the tenant's own version table.
            assert f"at head {SCHEMA_REVISION}" in health.text
            assert "schema tenant_a" in health.text
    finally:
        await engine.dispose()


@pytest.fixture
def served(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """``jobrun ui`` up to the point of serving: its app is asked for its runs page
    instead of listening on a port."""
    pages: dict[str, str] = {}

    async def serve(server: uvicorn.Server, *args: Any) -> None:
        transport = httpx.ASGITransport(app=server.config.app)
        # The console answers to loopback names only unless --allowed-host says otherwise.
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as client:
            pages["runs"] = (await client.get("/db/0/runs")).text

    monkeypatch.setattr(uvicorn.Server, "serve", serve)
    return pages


@pytest.mark.postgres
def test_jobrun_ui_with_a_schema_lists_that_tenants_runs(
    tenants_url: str, served: dict[str, str]
) -> None:
    ids = start_in_both(tenants_url)
    code, output = jobrun_cli("ui", "--url", tenants_url, "--schema", "tenant_b", "--read-only")
    assert code == 0, output
    assert runs_listed(served["runs"]) == {ids["tenant_b"]}
    assert "schema tenant_b" in served["runs"]


STORE_COMMANDS = [
    ("runs",),
    ("show", "01J0Z5K8QW3V2N8XG7S0R4M6TB"),
    ("watch", "01J0Z5K8QW3V2N8XG7S0R4M6TB"),
    ("start", "shop", "sync"),
    ("cancel", "01J0Z5K8QW3V2N8XG7S0R4M6TB", "--reason", "r"),
    ("resume", "01J0Z5K8QW3V2N8XG7S0R4M6TB"),
    ("release", "01J0Z5K8QW3V2N8XG7S0R4M6TB"),
    ("prune", "--older-than", "1d"),
    ("health",),
    ("schedules", "--app", "tests.processes.schedule_app:registry"),
    ("db", "upgrade"),
    ("db", "current"),
    ("db", "check"),
    ("ui", "--read-only"),
    ("worker", "--app", "tests.processes.worker_app:registry"),
]


@pytest.mark.parametrize("command", STORE_COMMANDS, ids=lambda command: " ".join(command[:2]))
def test_sqlite_refuses_a_schema_in_one_line(
    command: tuple[str, ...], sqlite_url: str, served: dict[str, str]
) -> None:
    before = Path(sqlite_url.split("///", 1)[1]).read_bytes()
    code, output = jobrun_cli(*command, "--url", sqlite_url, "--schema", "tenant_a")
    assert code == 2
    assert output == (
        "Error: schema='tenant_a' needs Postgres; on sqlite use one database per tenant instead\n"
    )
    assert served == {}  # the console never started
    assert Path(sqlite_url.split("///", 1)[1]).read_bytes() == before  # nothing written


@pytest.mark.postgres
def test_a_schema_name_jobrun_cannot_use_is_refused_in_one_line(tenants_url: str) -> None:
    code, output = jobrun_cli("runs", "--url", tenants_url, "--schema", "Tenant-A")
    assert code == 2
    assert output.startswith("Error: schema 'Tenant-A' is not usable"), output
    assert len(output.splitlines()) == 1


README_URL = "postgresql://postgres@127.0.0.1/app"


def _readme_tenant_session() -> list[tuple[str, list[str]]]:
    """The README's tenant example: each ``$ jobrun ...`` line with the lines it shows."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    block = text.split(f"$ jobrun db upgrade --url {README_URL} --schema tenant_a", 1)[1]
    block = f"$ jobrun db upgrade --url {README_URL} --schema tenant_a" + block.split("```", 1)[0]
    session: list[tuple[str, list[str]]] = []
    for line in block.splitlines():
        if line.startswith("$ "):
            session.append((line[2:], []))
        elif line.strip():
            session[-1][1].append(line)
    return session


def _same_but_ids(line: str) -> str:
    """A line with its run ids and revision numbers made generic (they differ per run)."""
    return re.sub(r"\b0\d{3}\b", "REV", re.sub(r"\b[0-9A-Z]{26}\b", "RUN_ID", line))


@pytest.mark.postgres
def test_the_readme_tenant_example_prints_what_it_shows(empty_postgres_url: str) -> None:
    url = empty_postgres_url.replace("+asyncpg", "")
    env: dict[str, str] = {}
    session = _readme_tenant_session()
    assert len(session) >= 8, session  # the example is still there, whole
    for command, shown in session:
        words = command.replace(README_URL, url).split()
        if words[0] == "export":
            name, _, value = words[1].partition("=")
            env[name] = value
            continue
        assert words[0] == "jobrun", command
        _code, output = jobrun_cli(*words[1:], env=env)
        printed = [_same_but_ids(line) for line in output.splitlines()]
        for line in shown:
            assert _same_but_ids(line) in printed, (command, output)
