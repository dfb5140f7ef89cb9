"""The ``jobrun`` command line, end to end on SQLite and Postgres.

Most tests call the click group in-process (``CliRunner``); a few run the real
program (``python -m jobrun``) to prove the entry point, the environment
variable and the exit codes survive a process boundary. Test data is made
through jobrun's public functions, on a private event loop in a thread, since
every command runs its own ``asyncio.run``.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

import pytest
from click.testing import CliRunner, Result
from sqlalchemy import text, update
from sqlalchemy.ext.asyncio import create_async_engine

import jobrun
import jobrun._cli.commands  # registers the commands on the group
from jobrun._cli.app import cli
from jobrun._cli.params import parse_duration
from jobrun._cli.watching import Poll, line, progress_of
from jobrun.sql.schema import SCHEMA_REVISION
from jobrun.sql.schema import job_runs as runs_table
from jobrun.sql.upgrades.migrate import downgrade
from tests.support import REPO, SQL_BACKENDS, run_in_thread

T = TypeVar("T")
ONCE = jobrun.RetryPolicy(max_attempts=1, base_delay_ms=0)

registry = jobrun.JobRegistry()


@registry.job("shop", "walk", retry=ONCE)
async def walk(p: jobrun.JobPass) -> jobrun.PassResult:
    """Three pages of ten objects; the first pass also says how many there are."""
    page = p.cursor or 0
    if page == 0:
        p.count("total", 30)
    await p.step(f"page-{page}", lambda: page)
    p.count("objects", 10)
    return jobrun.PassResult(cursor=page + 1, done=page + 1 >= 3)


@registry.job("shop", "flaky", retry=ONCE)
async def flaky(p: jobrun.JobPass) -> jobrun.PassResult:
    """Completes one step, then fails: the run fails with its ledger kept."""
    await p.step("fetch", lambda: {"rows": 3})
    raise RuntimeError("the API said no")


@pytest.fixture(params=SQL_BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    """Only the SQL backends: the command line always speaks to a database."""
    return str(request.param)


# --- helpers -----------------------------------------------------------------------------


def with_store(url: str, use: Callable[[jobrun.SqlJobRunStore], Awaitable[T]]) -> T:
    async def go() -> T:
        engine = create_async_engine(url)
        try:
            return await use(jobrun.SqlJobRunStore(engine))
        finally:
            await engine.dispose()

    return run_in_thread(go)


def start(url: str, job: str = "walk", instance: str = "default") -> str:
    async def go(store: jobrun.SqlJobRunStore) -> str:
        run = await jobrun.start_job_run(
            store, module_id="shop", job=job, instance=instance, payload={"n": 1}
        )
        return run.id

    return with_store(url, go)


async def drive_to_end(store: jobrun.SqlJobRunStore, run_id: str, pause_s: float = 0) -> None:
    while True:
        run = await jobrun.get_job_run(store, run_id)
        assert run is not None
        if run.status != "running":
            return
        await jobrun.run_due_jobs(store, registry, max_passes=1)
        # sleep: pacing, so the watch sees several changes; no assertion depends on it
        await asyncio.sleep(pause_s)


def finish(url: str, run_id: str) -> None:
    with_store(url, lambda store: drive_to_end(store, run_id))


def execute(url: str, statement: Any) -> None:
    async def go() -> None:
        engine = create_async_engine(url)
        try:
            async with engine.begin() as connection:
                await connection.execute(statement)
        finally:
            await engine.dispose()

    run_in_thread(go)


def invoke(*args: str, env: dict[str, str | None] | None = None) -> Result:
    # Exceptions other than exits propagate: a traceback is a test failure.
    return CliRunner().invoke(cli, list(args), env=env, catch_exceptions=False)


def ok(*args: str) -> Result:
    result = invoke(*args)
    assert result.exit_code == 0, result.output
    return result


def fails(code: int, *args: str, env: dict[str, str | None] | None = None) -> Result:
    result = invoke(*args, env=env)
    assert result.exit_code == code, result.output
    assert "Traceback" not in result.output
    return result


def file_url(path: Path) -> str:
    return f"sqlite+aiosqlite:///{path}"


# --- db ---------------------------------------------------------------------------------


def _db_upgrade_current_check(url: str) -> None:
    assert "no jobrun schema" in fails(1, "db", "check", "--url", url).stdout
    assert "upgraded from none" in ok("db", "upgrade", "--url", url).stdout
    assert f"already at head: {SCHEMA_REVISION}" in ok("db", "upgrade", "--url", url).stdout
    current = ok("db", "current", "--url", url).stdout
    assert f"current: {SCHEMA_REVISION}" in current
    assert f"head:    {SCHEMA_REVISION}" in current
    assert f"ok: at head {SCHEMA_REVISION}" in ok("db", "check", "--url", url).stdout


def test_db_upgrade_on_a_new_sqlite_file(tmp_path: Path) -> None:
    url = file_url(tmp_path / "fresh.db")
    fails(1, "db", "current", "--url", url)  # reading never creates the file
    assert not (tmp_path / "fresh.db").exists()
    assert "upgraded from none" in ok("db", "upgrade", "--url", url).stdout
    empty = file_url(tmp_path / "empty.db")
    (tmp_path / "empty.db").touch()
    _db_upgrade_current_check(empty)


@pytest.mark.postgres
def test_db_upgrade_on_an_empty_postgres(empty_postgres_url: str) -> None:
    _db_upgrade_current_check(empty_postgres_url)


def test_db_current_and_check_report_a_schema_behind(database_url: str) -> None:
    async def to_0001() -> None:
        engine = create_async_engine(database_url)
        try:
            await downgrade(engine, "0001")
        finally:
            await engine.dispose()

    run_in_thread(to_0001)
    assert "current: 0001  (behind" in ok("db", "current", "--url", database_url).stdout
    drift = fails(1, "db", "check", "--url", database_url).stdout
    assert f"drift: the database is at 0001, head is {SCHEMA_REVISION}" in drift
    # Every other command refuses, naming the fix.
    refused = fails(1, "runs", "--url", database_url)
    assert "revision 0001" in refused.stderr
    assert "run `jobrun db upgrade`" in refused.stderr
    ok("db", "upgrade", "--url", database_url)
    ok("runs", "--url", database_url)


def test_db_check_finds_a_table_that_differs(database_url: str) -> None:
    execute(database_url, text("ALTER TABLE _substrat_job_steps ADD COLUMN extra INTEGER"))
    result = fails(1, "db", "check", "--url", database_url)
    assert "drift: remove_column" in result.stdout
    assert "extra" in result.stdout


def test_db_check_ignores_a_hosts_tables(database_url: str) -> None:
    execute(database_url, text("CREATE TABLE orders (id INTEGER PRIMARY KEY)"))
    ok("db", "check", "--url", database_url)


# --- start, runs, show ---------------------------------------------------------------------


def test_start_says_started_then_joined(database_url: str) -> None:
    first = ok("start", "--url", database_url, "shop", "walk", "--payload", '{"shop": 42}')
    verb, run_id = first.stdout.split()
    assert verb == "started"
    again = ok("start", "--url", database_url, "shop", "walk", "--payload", '{"shop": 7}')
    assert again.stdout.split() == ["joined", run_id]
    other = ok("start", "--url", database_url, "shop", "walk", "--instance", "b")
    assert other.stdout.split()[0] == "started"
    assert other.stdout.split()[1] != run_id
    shown = json.loads(ok("show", "--url", database_url, run_id, "--json").stdout)
    assert shown["run"]["payload"] == {"shop": 42}  # the live run's payload won


APP = "tests.processes.worker_app:registry"


def test_start_with_app_refuses_a_job_the_registry_lacks(database_url: str) -> None:
    refused = fails(2, "start", "--url", database_url, "demo", "pagse", "--app", APP)
    assert "registers no job demo/pagse; did you mean demo/pages?" in refused.stderr
    far = fails(2, "start", "--url", database_url, "shop", "zzz", "--app", APP)
    assert "registers no job shop/zzz (it registers" in far.stderr
    # Nothing was written: the runs list is empty.
    assert json.loads(ok("runs", "--url", database_url, "--json").stdout) == []
    started = ok("start", "--url", database_url, "demo", "pages", "--app", APP)
    assert started.stdout.split()[0] == "started"
    assert "warning" not in started.stderr


def test_start_without_app_warns_that_the_name_is_unchecked(database_url: str) -> None:
    started = ok("start", "--url", database_url, "shop", "heartbeet")
    assert started.stdout.split()[0] == "started"
    assert "shop/heartbeet is not checked against any registry" in started.stderr


def test_start_and_the_actions_print_json_for_scripts(database_url: str) -> None:
    first = json.loads(ok("start", "--url", database_url, "shop", "walk", "--json").stdout)
    assert first["started"] is True
    run_id = first["run"]["id"]
    assert first["run"]["status"] == "running"
    joined = json.loads(ok("start", "--url", database_url, "shop", "walk", "--json").stdout)
    assert (joined["started"], joined["run"]["id"]) == (False, run_id)

    released = json.loads(ok("release", "--url", database_url, run_id, "--json").stdout)
    assert released == {"run_id": run_id, "released": False, "held_by": None}
    cancelled = json.loads(
        ok("cancel", "--url", database_url, run_id, "--reason", "x", "--json").stdout
    )
    assert (cancelled["id"], cancelled["status"]) == (run_id, "failed")
    assert cancelled["last_error"] == "cancelled: x"
    resumed = json.loads(ok("resume", "--url", database_url, run_id, "--json").stdout)
    assert (resumed["id"], resumed["status"], resumed["attempts"]) == (run_id, "running", 0)
    pruned = json.loads(ok("prune", "--url", database_url, "--older-than", "1d", "--json").stdout)
    assert pruned == {"deleted": 0}


def test_runs_table_and_json(database_url: str) -> None:
    done_id = start(database_url, instance="one")
    finish(database_url, done_id)
    live_id = start(database_url, instance="two")

    table = ok("runs", "--url", database_url).stdout
    for expected in (done_id, live_id, "shop/walk/one", "objects=30", "total=30", "done"):
        assert expected in table
    assert table.index(live_id) < table.index(done_id)  # newest first

    records = json.loads(ok("runs", "--url", database_url, "--json").stdout)
    assert [record["id"] for record in records] == [live_id, done_id]
    assert records[1]["counters"] == {"objects": 30, "total": 30}
    assert records[1]["cursor"] == 3
    assert records[1]["ended_at"].endswith("+00:00")  # ISO text

    only_done = json.loads(ok("runs", "--url", database_url, "-s", "done", "--json").stdout)
    assert [record["id"] for record in only_done] == [done_id]
    limited = json.loads(ok("runs", "--url", database_url, "--limit", "1", "--json").stdout)
    assert [record["id"] for record in limited] == [live_id]
    filtered = ok("runs", "--url", database_url, "-m", "shop", "-j", "walk", "-i", "two").stdout
    assert live_id in filtered
    assert done_id not in filtered
    assert "no runs match" in ok("runs", "--url", database_url, "--module", "nope").stdout


def test_runs_lists_the_stranded_runs_as_the_console_does(database_url: str) -> None:
    stranded_id = start(database_url, instance="stranded")
    held_id = start(database_url, instance="held")
    idle_id = start(database_url, instance="idle")
    for run_id, expires_at in (
        (stranded_id, "2000-01-01T00:00:00.000Z"),  # a lease long expired, untaken
        (held_id, "2999-01-01T00:00:00.000Z"),  # a lease still good
    ):
        execute(
            database_url,
            update(runs_table)
            .where(runs_table.c.id == run_id)
            .values(lease_owner="token", lease_driver="gone:1", next_attempt_at=expires_at),
        )
    listed = json.loads(ok("runs", "--url", database_url, "-s", "stranded", "--json").stdout)
    assert [record["id"] for record in listed] == [stranded_id]
    assert idle_id not in ok("runs", "--url", database_url, "--status", "stranded").stdout
    only = ["runs", "--url", database_url, "-s", "stranded", "-i", "stranded", "--json"]
    assert [record["id"] for record in json.loads(ok(*only).stdout)] == [stranded_id]
    other = ["runs", "--url", database_url, "-s", "stranded", "-i", "strand", "--json"]
    assert json.loads(ok(*other).stdout) == []  # --instance is exact, as for other statuses


def test_show_has_the_record_the_lease_and_the_ledger(database_url: str) -> None:
    run_id = start(database_url, job="flaky")
    finish(database_url, run_id)
    shown = ok("show", "--url", database_url, run_id).stdout
    for expected in (run_id, "shop/flaky/default", "failed", "the API said no", "fetch"):
        assert expected in shown
    assert "not leased" in shown

    data = json.loads(ok("show", "--url", database_url, run_id, "--json").stdout)
    assert data["run"]["status"] == "failed"
    assert data["steps"] == [
        {"step": "fetch", "result": {"rows": 3}, "attempts": 1, "last_error": None,
         "completed": True}
    ]  # fmt: skip


def _lease(url: str, run_id: str) -> None:
    execute(
        url,
        update(runs_table)
        .where(runs_table.c.id == run_id)
        .values(
            lease_owner="token",
            lease_driver="host-a:123",
            lease_began_at="2030-01-01T00:00:00.000Z",
            next_attempt_at="2999-01-01T00:00:00.000Z",
            lease_epoch=7,
        ),
    )


def test_show_says_how_long_a_deferred_run_waits_and_why(database_url: str) -> None:
    run_id = start(database_url)
    execute(
        database_url,
        update(runs_table)
        .where(runs_table.c.id == run_id)
        .values(
            next_attempt_at="2999-01-01T00:05:00.000Z",
            deferrals=3,
            deferred_reason="rate limited by the API",
        ),
    )
    shown = " ".join(ok("show", "--url", database_url, run_id).stdout.split())
    assert (
        "waiting until 2999-01-01 00:05:00 (Retry-After: rate limited by the API); "
        "deferred 3 times in a row"
    ) in shown
    data = json.loads(ok("show", "--url", database_url, run_id, "--json").stdout)
    assert (data["run"]["deferrals"], data["run"]["deferred_reason"]) == (
        3,
        "rate limited by the API",
    )


def test_show_and_release_a_lease(database_url: str) -> None:
    run_id = start(database_url)
    _lease(database_url, run_id)
    shown = ok("show", "--url", database_url, run_id).stdout
    assert "held by host-a:123" in shown
    assert "fencing epoch 7" in shown
    assert "0 committed" in shown
    data = json.loads(ok("show", "--url", database_url, run_id, "--json").stdout)
    assert data["run"]["lease_driver"] == "host-a:123"
    assert (data["run"]["lease_epoch"], data["run"]["passes_committed"]) == (7, 0)
    assert data["run"]["lease_expires_at"].startswith("2999-01-01")

    released = ok("release", "--url", database_url, run_id).stdout
    assert "released the lease" in released
    assert "host-a:123" in released
    assert "held no lease" in ok("release", "--url", database_url, run_id).stdout
    assert "not leased" in ok("show", "--url", database_url, run_id).stdout


def test_bracketed_text_is_printed_as_stored(database_url: str) -> None:
    # A real driver's lease_driver ends in "[jobrun host=...]" and error texts quote
    # code ("[red]"): both are data, never rich markup to be swallowed.
    run_id = start(database_url)
    driver = "vm:15368 [jobrun host=vm pid=15368]"
    execute(
        database_url,
        update(runs_table)
        .where(runs_table.c.id == run_id)
        .values(
            lease_owner="token",
            lease_driver=driver,
            next_attempt_at="2999-01-01T00:00:00.000Z",
            last_error="KeyError: [red]items[/red]",
        ),
    )
    shown = " ".join(ok("show", "--url", database_url, run_id).stdout.split())
    assert f"held by {driver}, expires" in shown
    assert "KeyError: [red]items[/red]" in shown
    listed = ok("runs", "--url", database_url).stdout
    assert "[red]items" in listed


# --- acting -------------------------------------------------------------------------------


def test_cancel_resume_and_prune(database_url: str) -> None:
    run_id = start(database_url)
    cancelled = ok("cancel", "--url", database_url, run_id, "--reason", "wrong shop").stdout
    assert cancelled.strip() == f"cancelled {run_id}: cancelled: wrong shop"
    again = fails(1, "cancel", "--url", database_url, run_id, "--reason", "twice")
    assert "not running" in again.stderr
    fails(2, "cancel", "--url", database_url, run_id, "--reason", "   ")  # refused input

    assert ok("resume", "--url", database_url, run_id).stdout.strip() == f"resumed {run_id}"
    assert "not failed" in fails(1, "resume", "--url", database_url, run_id).stderr
    finish(database_url, run_id)

    assert ok("prune", "--url", database_url, "--older-than", "1d").stdout.strip() == (
        "pruned 0 runs"
    )
    execute(
        database_url,
        update(runs_table).values(ended_at="2000-01-01T00:00:00.000Z"),
    )
    failed_id = start(database_url, job="flaky", instance="f")
    finish(database_url, failed_id)
    execute(
        database_url,
        update(runs_table).where(runs_table.c.id == failed_id).values(
            ended_at="2000-01-01T00:00:00.000Z"
        ),
    )  # fmt: skip
    assert ok("prune", "--url", database_url, "--older-than", "7d").stdout.strip() == (
        "pruned 1 run"
    )
    pruned = ok(
        "prune", "--url", database_url, "--older-than", "12h", "--status", "done",
        "--status", "failed",
    )  # fmt: skip
    assert pruned.stdout.strip() == "pruned 1 run"
    fails(1, "show", "--url", database_url, run_id)


def test_health(database_url: str) -> None:
    start(database_url, instance="a")
    start(database_url, instance="b")
    failed_id = start(database_url, job="flaky")
    finish(database_url, failed_id)
    counts = json.loads(ok("health", "--url", database_url, "--json").stdout)
    assert counts["running"] == 2
    assert counts["due"] == 2
    assert counts["failed"] == 1
    assert counts["leased"] == 0
    table = ok("health", "--url", database_url).stdout
    assert "due now" in table
    assert "oldest due waited" in table


def test_health_with_an_app_names_runs_of_a_newer_job_version(database_url: str) -> None:
    """After a rollback: runs committed by version-2 code of demo/pages, which the app's
    version-1 code never claims."""
    newer = start(database_url, instance="a")
    start(database_url, instance="b")
    execute(
        database_url,
        update(runs_table).where(runs_table.c.id == newer).values(
            module_id="demo", job="pages", job_version=2
        ),
    )  # fmt: skip
    counts = json.loads(ok("health", "--url", database_url, "--app", APP, "--json").stdout)
    assert {
        "module_id": "demo",
        "job": "pages",
        "runs_by_version": {"2": 1},
        "runs_beyond_code": 1,
        "needs_version": 2,
    } in counts["versions_by_job"]
    table = ok("health", "--url", database_url, "--app", APP).stdout
    assert "beyond code demo/pages" in table
    assert "versions demo/pages" in table


# --- watch --------------------------------------------------------------------------------


def test_watch_follows_a_run_to_done(database_url: str) -> None:
    run_id = start(database_url)

    async def drive(store: jobrun.SqlJobRunStore) -> None:
        await asyncio.sleep(0.2)  # let the watch see the run before it moves
        await drive_to_end(store, run_id, pause_s=0.1)

    driver = threading.Thread(target=with_store, args=(database_url, drive))
    driver.start()
    try:
        result = invoke("watch", "--url", database_url, run_id, "--interval", "0.05")
    finally:
        driver.join()
    assert result.exit_code == 0, result.output
    output = result.stdout
    # Off a terminal: a line per change (how many depends on timing), the last one done.
    changes = [line for line in output.splitlines() if " attempts=" in line]
    assert changes
    assert " done objects=30 total=30" in changes[-1]
    # A total is the size of the work, not work done: it gets no rate.
    assert "total/s" not in output
    # Then the final view, with its progress bar and counters table.
    assert "30 / 30 objects (100.0%)" in output
    assert "per second" in output
    assert "per second" in output
    assert output.rstrip().endswith(f"run {run_id} is done")


def test_watch_exits_1_for_a_failed_run(database_url: str) -> None:
    run_id = start(database_url, job="flaky")
    finish(database_url, run_id)
    result = fails(1, "watch", "--url", database_url, run_id, "--interval", "0.05")
    assert "the API said no" in result.stdout
    assert f"run {run_id} failed" in result.stdout


def test_watch_ends_cancelled_for_a_cancelled_run(database_url: str) -> None:
    run_id = start(database_url)
    ok("cancel", "--url", database_url, run_id, "--reason", "wrong shop")
    result = fails(1, "watch", "--url", database_url, run_id, "--interval", "0.05")
    assert f"run {run_id} cancelled: wrong shop" in result.stdout
    assert " cancelled " in result.stdout.splitlines()[0]  # the line per change


def test_runs_status_cancelled_and_health_count_the_cancelled_apart(database_url: str) -> None:
    cancelled_id = start(database_url, instance="a")
    ok("cancel", "--url", database_url, cancelled_id, "--reason", "x")
    failed_id = start(database_url, job="flaky")
    finish(database_url, failed_id)
    live_id = start(database_url, instance="b")

    def listed(status: str) -> list[str]:
        found = ok("runs", "--url", database_url, "--status", status, "--json").stdout
        return [record["id"] for record in json.loads(found)]

    assert listed("cancelled") == [cancelled_id]
    assert listed("failed") == [failed_id, cancelled_id]  # the stored status
    assert listed("running") == [live_id]
    records = json.loads(ok("runs", "--url", database_url, "--json").stdout)
    assert {record["id"]: record["outcome"] for record in records} == {
        cancelled_id: "cancelled",
        failed_id: "failed",
        live_id: "running",
    }
    table = ok("runs", "--url", database_url, "--status", "cancelled").stdout
    assert "cancelled" in table
    assert failed_id not in table
    assert "cancelled" in ok("show", "--url", database_url, cancelled_id).stdout
    counts = json.loads(ok("health", "--url", database_url, "--json").stdout)
    assert (counts["failed"], counts["cancelled"]) == (2, 1)
    assert "cancelled" in ok("health", "--url", database_url).stdout


def test_watch_of_an_unknown_run(database_url: str) -> None:
    result = fails(1, "watch", "--url", database_url, "no-such-run")
    assert "no job run has the id 'no-such-run'" in result.stderr


def test_rates_are_per_counter_per_second_between_polls() -> None:
    def record(**counters: int) -> jobrun.JobRun:
        epoch = datetime(2030, 1, 1, tzinfo=UTC)
        return jobrun.JobRun(
            id="r", module_id="m", job="j", instance="i", status="running", payload=None,
            cursor=None, counters=dict(counters), attempts=0, last_error=None,
            started_at=epoch, updated_at=epoch, next_attempt_at=None, ended_at=None,
        )  # fmt: skip

    first = Poll(record(objects=10), at=100.0)
    second = first.follow(record(objects=30, pages=2), at=102.0)
    assert second.rates == {"objects": 10.0, "pages": 1.0}
    assert "objects/s=10.0" in line(second)
    assert first.follow(record(objects=10), at=100.0).rates == {}  # no time passed


def test_progress_rule() -> None:
    assert progress_of({"objects": 5}) is None
    assert progress_of({"total": 0, "done": 1}) is None
    assert progress_of({"total": 10, "done": 2, "objects": 7, "pages": 9}) == ("done", 2, 10)
    assert progress_of({"total": 10, "objects": 7, "pages": 9}) == ("objects", 7, 10)
    assert progress_of({"total": 10, "pages": 9, "rows": 4}) == ("pages", 9, 10)
    assert progress_of({"total": 10}) is None


# --- errors and usage ----------------------------------------------------------------------


def test_unknown_run_ids_fail_with_one_line(database_url: str) -> None:
    for command in (["show"], ["resume"], ["release"], ["cancel", "--reason", "x"]):
        result = fails(1, *command, "--url", database_url, "nope")
        assert result.stderr.strip() == "Error: no job run has the id 'nope'"


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("not a url", "cannot parse the database URL"),
        ("mysql+aiomysql://u@h/db", "unsupported database"),
        ("sqlite+nodriver:///x.db", "unknown database driver"),
        ("postgresql+psycopg2://u@h/db", "not an asyncio driver"),
        ("postgresql+asyncpg://u:secret@127.0.0.1:1/db", "cannot connect to the database"),
    ],
)
def test_bad_urls_fail_with_one_line(url: str, message: str) -> None:
    result = fails(1, "runs", "--url", url)
    assert message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert "secret" not in result.stderr


def test_a_database_without_the_schema(tmp_path: Path) -> None:
    empty = tmp_path / "empty.db"
    empty.touch()
    result = fails(1, "runs", "--url", file_url(empty))
    assert "has no jobrun schema" in result.stderr
    assert "run `jobrun db upgrade`" in result.stderr
    missing = fails(1, "health", "--url", file_url(tmp_path / "missing.db"))
    assert "no SQLite database at" in missing.stderr


def test_plain_sqlite_url_and_the_environment_variable(sqlite_url: str) -> None:
    plain = sqlite_url.replace("sqlite+aiosqlite:", "sqlite:")
    result = invoke("start", "shop", "walk", env={"JOBRUN_DATABASE_URL": plain})
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("started ")


def test_usage_errors_exit_2(sqlite_url: str) -> None:
    fails(2, "runs", env={"JOBRUN_DATABASE_URL": None})  # no URL at all
    fails(2, "runs", "--url", sqlite_url, "--status", "paused")
    fails(2, "runs", "--url", sqlite_url, "--limit", "0")
    fails(2, "prune", "--url", sqlite_url, "--older-than", "soon")
    fails(2, "prune", "--url", sqlite_url, "--older-than", "1d", "--status", "running")
    fails(2, "start", "--url", sqlite_url, "shop", "walk", "--payload", "{not json")
    fails(2, "start", "--url", sqlite_url, "", "walk")
    fails(2, "cancel", "--url", sqlite_url, "some-id")  # --reason is required
    fails(2, "watch", "--url", sqlite_url, "x", "--interval", "0")
    fails(2, "no-such-command")


def test_every_command_has_help_with_an_example() -> None:
    commands = [
        ["db", "upgrade"], ["db", "current"], ["db", "check"], ["runs"], ["show"], ["watch"],
        ["start"], ["cancel"], ["resume"], ["release"], ["prune"], ["health"],
    ]  # fmt: skip
    for command in commands:
        text_out = ok(*command, "--help").stdout
        assert "Example:" in text_out, command
        assert "JOBRUN_DATABASE_URL" in text_out, command


def test_durations() -> None:
    assert parse_duration("7d") == timedelta(days=7)
    assert parse_duration("12h") == timedelta(hours=12)
    assert parse_duration("30m") == timedelta(minutes=30)
    assert parse_duration("1d12h") == timedelta(hours=36)
    assert parse_duration("1.5h") == timedelta(minutes=90)
    for bad in ("", "7", "d", "7 days", "-1d", "1d x"):
        with pytest.raises(ValueError, match="not a duration"):
            parse_duration(bad)


# --- as a real program ----------------------------------------------------------------------


def program(*args: str, url: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "JOBRUN_DATABASE_URL"}
    if url is not None:
        env["JOBRUN_DATABASE_URL"] = url
    return subprocess.run(
        [sys.executable, "-m", "jobrun", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=60,
        check=False,
    )


def test_as_a_program(backend: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    """Migrate, start, list and watch through the real entry point, URL from the environment."""
    if backend == "sqlite":
        url = file_url(tmp_path / "program.db")
    else:
        url = request.getfixturevalue("empty_postgres_url")
    upgraded = program("db", "upgrade", url=url)
    assert upgraded.returncode == 0, upgraded.stderr
    started = program("start", "shop", "walk", "--payload", "{}", url=url)
    assert started.returncode == 0, started.stderr
    verb, run_id = started.stdout.split()
    assert verb == "started"
    finish(url, run_id)
    listed = program("runs", "--json", url=url)
    assert listed.returncode == 0, listed.stderr
    assert [record["status"] for record in json.loads(listed.stdout)] == ["done"]
    watched = program("watch", run_id, "--interval", "0.05", url=url)
    assert watched.returncode == 0, watched.stderr
    assert "30 / 30 objects" in watched.stdout


def test_program_exit_codes(tmp_path: Path) -> None:
    bad = program("runs", url="nonsense://")
    assert bad.returncode == 1
    assert bad.stderr.startswith("Error: ")
    assert "Traceback" not in bad.stderr
    missing = program("show", "x", url=None)
    assert missing.returncode == 2
    assert "Missing option '--url'" in missing.stderr
    unknown = program("show", "nope", url=file_url(tmp_path / "none.db"))
    assert unknown.returncode == 1
    assert "jobrun db upgrade" in unknown.stderr


# --- worker: retention options -----------------------------------------------------------


def test_the_worker_prunes_other_apps_jobs_only_when_told(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--prune-after`` is for the app's own jobs; the others need their own option."""
    from jobrun._cli import worker_command

    url = file_url(tmp_path / "retention.db")
    ok("db", "upgrade", "--url", url)
    given: list[dict[str, Any]] = []

    async def fake_worker(*args: Any, **options: Any) -> None:
        given.append(options)

    monkeypatch.setattr(worker_command, "run_worker", fake_worker)
    app = ("worker", "--app", "tests.processes.test_cli:registry", "--url", url)
    ok(*app, "--prune-after", "30d")
    ok(*app, "--prune-after", "30d", "--prune-unregistered-after", "400d")
    assert [(seen["prune_after"], seen["prune_unregistered_after"]) for seen in given] == [
        (timedelta(days=30), None),
        (timedelta(days=30), timedelta(days=400)),
    ]
    refused = fails(2, *app, "--prune-unregistered-after", "soon")
    assert "--prune-unregistered-after" in refused.output
    assert "--prune-unregistered-after" in ok("worker", "--help").output
