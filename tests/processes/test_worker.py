"""The worker: draining several databases, bounding concurrency, idling quietly, waking on
Postgres NOTIFY, and stopping on signals as a real ``jobrun worker`` process.

The in-process tests call :func:`jobrun.run_worker` with a ``stop`` event; the process
tests run ``.venv/bin/jobrun worker --app tests.processes.worker_app:registry`` from the repository
root with the root on ``PYTHONPATH``.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

import jobrun
import jobrun.worker.driving
import jobrun.worker.serving
import jobrun.worker.wakeups
from jobrun._core.operator.worker_registry import DEFAULT_HEARTBEAT_S
from jobrun.sql.schema import job_runs
from jobrun.testing import FakeClock
from tests.processes import worker_app
from tests.support import log_worker_statements, spawn_worker

APP = "tests.processes.worker_app:registry"


# --- helpers --------------------------------------------------------------------------------


def sqlite_copy(template: Path, directory: Path, name: str) -> str:
    path = directory / f"{name}.db"
    shutil.copyfile(template, path)
    return f"sqlite+aiosqlite:///{path}"


@pytest.fixture
async def engines() -> AsyncIterator[Callable[[str], AsyncEngine]]:
    made: list[AsyncEngine] = []

    def make(url: str) -> AsyncEngine:
        engine = create_async_engine(url)
        made.append(engine)
        return engine

    yield make
    for engine in made:
        await engine.dispose()


async def start_pages(engine: AsyncEngine, count: int, pages: int = 3) -> list[str]:
    store = jobrun.SqlJobRunStore(engine)
    return [
        (
            await jobrun.start_job_run(
                store, module_id="demo", job="pages", instance=f"i{n}", payload={"pages": pages}
            )
        ).id
        for n in range(count)
    ]


async def statuses(engine: AsyncEngine) -> dict[str, str]:
    async with engine.connect() as connection:
        rows = (await connection.execute(select(job_runs.c.id, job_runs.c.status))).all()
    return {row.id: row.status for row in rows}


async def eventually(check: Callable[[], Awaitable[bool]], timeout_s: float = 10) -> None:
    deadline = time.monotonic() + timeout_s
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not true within {timeout_s} s")
        # sleep: a poll interval; the deadline only bounds a hang
        await asyncio.sleep(0.05)


async def all_done(*engines: AsyncEngine) -> bool:
    for engine in engines:
        found = await statuses(engine)
        if not found or set(found.values()) != {"done"}:
            return False
    return True


class Worker:
    """``run_worker`` in a task, with its stop event."""

    def __init__(self, databases: list[Any], **options: Any) -> None:
        self.stop = asyncio.Event()
        options.setdefault("interval_s", 0.2)
        self.task = asyncio.create_task(
            jobrun.run_worker(databases, worker_app.registry, stop=self.stop, **options)
        )

    async def finish(self) -> None:
        self.stop.set()
        # A ceiling for a hang, not a speed goal: a loaded machine once took over 10 s.
        await asyncio.wait_for(self.task, 60)


# --- draining -------------------------------------------------------------------------------


@pytest.fixture
def two_databases(
    database_url: str,
    sqlite_template: Path,
    tmp_path: Path,
    engines: Callable[[str], AsyncEngine],
) -> tuple[str, str, AsyncEngine, AsyncEngine]:
    """A fresh SQLite file and the ``database_url`` database: both URLs, then an engine on each."""
    first_url = sqlite_copy(sqlite_template, tmp_path, "first")
    return first_url, database_url, engines(first_url), engines(database_url)


# The second database is the ``database_url`` fixture: another SQLite file, or Postgres.
SECOND = pytest.mark.parametrize(
    "backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True
)


@SECOND
async def test_the_worker_drains_two_databases(
    two_databases: tuple[str, str, AsyncEngine, AsyncEngine],
):
    first_url, _, first, other = two_databases
    await start_pages(first, 4)
    await start_pages(other, 4)
    worker = Worker([first_url, other], concurrency=2)
    await eventually(lambda: all_done(first, other))
    await worker.finish()
    for engine in (first, other):
        for record in await jobrun.job_runs(jobrun.SqlJobRunStore(engine)):
            assert record.counters == {"pages": 3}


async def test_the_worker_drives_a_store_it_is_given(
    sqlite_template: Path, tmp_path: Path, engines: Callable[[str], AsyncEngine]
):
    engine = engines(sqlite_copy(sqlite_template, tmp_path, "store"))
    await start_pages(engine, 2)
    worker = Worker([jobrun.SqlJobRunStore(engine)], options=jobrun.DriveOptions(max_passes=3))
    await eventually(lambda: all_done(engine))
    await worker.finish()
    for record in await jobrun.job_runs(jobrun.SqlJobRunStore(engine)):
        assert record.counters == {"pages": 3}


async def test_a_store_keeps_its_own_schema(
    sqlite_template: Path, tmp_path: Path, engines: Callable[[str], AsyncEngine]
):
    store = jobrun.SqlJobRunStore(engines(sqlite_copy(sqlite_template, tmp_path, "schema")))
    with pytest.raises(jobrun.JobValidationError, match="its own schema") as caught:
        await jobrun.run_worker([store], worker_app.registry, schema="tenant_a")
    assert caught.value.errors[0]["path"] == "schema"


async def test_concurrency_bounds_the_passes_in_flight_across_databases(
    sqlite_template: Path, tmp_path: Path, engines: Callable[[str], AsyncEngine]
):
    worker_app.most_in_flight = 0
    made = [engines(sqlite_copy(sqlite_template, tmp_path, f"db{n}")) for n in range(2)]
    for engine in made:
        store = jobrun.SqlJobRunStore(engine)
        for n in range(5):
            await jobrun.start_job_run(
                store, module_id="demo", job="concurrent", instance=f"c{n}", payload={}
            )
    worker = Worker(list(made), concurrency=3)
    await eventually(lambda: all_done(*made))
    await worker.finish()
    assert worker_app.most_in_flight == 3


async def test_a_store_failure_is_logged_and_retried(
    sqlite_template: Path,
    tmp_path: Path,
    engines: Callable[[str], AsyncEngine],
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
):
    engine = engines(sqlite_copy(sqlite_template, tmp_path, "flaky"))
    await start_pages(engine, 1, pages=1)
    failures = 0

    async def fail_twice(_operation: str, statement: str) -> None:
        nonlocal failures
        # The claims fail (after the worker's start-up check went through).
        if statement.startswith("UPDATE") and failures < 2:
            failures += 1
            raise OSError("the disk went away")

    log_worker_statements(monkeypatch).before = fail_twice

    caplog.set_level(logging.WARNING, logger="jobrun.worker")
    worker = Worker([engine], interval_s=0.1)
    await eventually(lambda: all_done(engine))
    await worker.finish()
    assert any("failed" in record.getMessage() for record in caplog.records)


async def test_an_outdated_database_fails_at_start(tmp_path: Path):
    with pytest.raises(jobrun.SchemaOutdatedError):
        await jobrun.run_worker(
            [f"sqlite+aiosqlite:///{tmp_path / 'empty.db'}"], worker_app.registry
        )


@pytest.mark.parametrize(
    ("options", "error"),
    [
        ({"interval_s": 0}, "interval_s"),
        ({"interval_s": float("inf")}, "interval_s"),
        ({"concurrency": 0}, "concurrency"),
        ({"limit": "5"}, "limit"),
        ({"max_passes": 2.0}, "max_passes"),
        ({"pass_timeout_s": -1}, "pass_timeout_s"),
        ({"options": {"limit": 5}}, "options"),
    ],
)
async def test_bad_options_are_refused_before_anything_runs(options: dict[str, Any], error: str):
    with pytest.raises(jobrun.JobValidationError) as caught:
        await jobrun.run_worker(["sqlite+aiosqlite://"], worker_app.registry, **options)
    assert caught.value.errors[0]["path"] == error
    with pytest.raises(ValueError, match="at least one database"):
        await jobrun.run_worker([], worker_app.registry)


# --- idling ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True
)
async def test_an_idle_database_costs_one_claim_per_interval(
    engine: AsyncEngine, monkeypatch: pytest.MonkeyPatch
):
    # Where nothing can wake it (no inotify, no LISTEN), an idle database is polled.
    monkeypatch.setattr(jobrun.worker.wakeups, "open_watch", lambda: None)
    monkeypatch.setattr(jobrun.worker.serving, "listens", lambda engine: False)
    interval = 0.25
    log = log_worker_statements(monkeypatch)
    # Four drivers: only one of them polls while the database is idle.
    worker = Worker([engine], interval_s=interval, concurrency=4)
    # The back-off climbs from 50 ms to the interval within five claims.
    await eventually(lambda: _claims_seen(log.seen, 5))
    before = len(log.seen)
    began = time.monotonic()
    # At least a few polls, however slowly a loaded machine runs them.
    await eventually(lambda: _claims_seen(log.seen[before:], 4), timeout_s=60)
    # sleep: an idle window to count polls in; the bounds use the time that passed
    await asyncio.sleep(0.5)
    elapsed_s = time.monotonic() - began
    idle = log.seen[before:]
    await worker.finish()
    claims = _claims(idle)
    # Besides the claims: the read of held leases that finds runs stranded by a
    # dead driver (see jobrun._core.leases.proof_of_death), at most once a second.
    scans = [sql for operation, sql, _ in idle if operation == "held_leases"]
    # And the worker's own row, written again every heartbeat (jobrun.worker.registration).
    beats = [sql for operation, sql, _ in idle if operation == "beat_worker"]
    assert len(claims) + len(scans) + len(beats) == len(idle), idle
    assert len(beats) <= 2 * (elapsed_s / DEFAULT_HEARTBEAT_S + 1), (len(beats), elapsed_s)
    # One poller at one claim per interval at most (a late poll only makes fewer), never
    # four: upper bounds from the time that actually passed, so load cannot fail them.
    assert len(claims) <= elapsed_s / interval + 2, (len(claims), elapsed_s)
    assert len(scans) <= elapsed_s + 2, (len(scans), elapsed_s)


@pytest.mark.parametrize(
    "backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True
)
async def test_an_idle_database_that_can_be_woken_is_not_polled(
    engine: AsyncEngine, monkeypatch: pytest.MonkeyPatch
):
    # SQLite: inotify sees writes to the file; Postgres: LISTEN. Either way the idle
    # database is read for its next due instant (no live run: the sweep's 60 s) and
    # not claimed from again until something wakes it.
    log = log_worker_statements(monkeypatch)
    worker = Worker([engine], interval_s=0.1, concurrency=2)
    # sleep: the first looks settle (Postgres: polls until its LISTEN is set up)
    await asyncio.sleep(1.0)
    before = len(_claims(log.seen))
    # sleep: an idle window ten intervals long, in which a poller would claim ten times
    await asyncio.sleep(1.0)
    after = len(_claims(log.seen))
    await worker.finish()
    assert after == before


# --- waking on Postgres NOTIFY and on SQLite writes --------------------------------------------


@pytest.mark.parametrize(
    "backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True
)
async def test_a_new_run_wakes_an_idle_worker(engine: AsyncEngine, monkeypatch: pytest.MonkeyPatch):
    # The worker's idle waits are on a test clock that moves only when told (set a
    # minute ahead, so runs started now are due to it): while it stands still, only
    # a wake-up (Postgres: NOTIFY; SQLite: inotify sees the write) makes it look again.
    clock = FakeClock(datetime.now(UTC) + timedelta(minutes=1))
    log = log_worker_statements(monkeypatch)
    looked = asyncio.Event()

    async def after(operation: str, sql: str) -> None:
        if operation == "claim" and _takes_runs(sql):
            looked.set()

    log.after = after
    # The first look at an idle database is a read of its next due instant (SQLite:
    # of the file; Postgres: once the LISTEN stands, on the presence session).
    sqlite_probe = jobrun.worker.driving.sqlite_next_due
    postgres_probe = jobrun.worker.driving.postgres_next_due_at

    def probed(path: Path, boot: Any) -> tuple[str | None, int | None]:
        looked.set()
        return sqlite_probe(path, boot)

    async def probed_postgres(store: jobrun.SqlJobRunStore) -> str | None:
        found = await postgres_probe(store)
        looked.set()
        return found

    monkeypatch.setattr(jobrun.worker.driving, "sqlite_next_due", probed)
    monkeypatch.setattr(jobrun.worker.driving, "postgres_next_due_at", probed_postgres)
    worker = Worker([engine], interval_s=30, clock=clock)
    # Its first look has found nothing: the run started next is news to it.
    await asyncio.wait_for(looked.wait(), 60)
    await start_pages(engine, 1, pages=1)
    # The deadline only bounds a hang: the clock never moved, so this was the wake-up.
    await eventually(lambda: all_done(engine), timeout_s=60)
    await worker.finish()


def _claims(seen: Sequence[tuple[str, str, Any]]) -> list[str]:
    """One statement per claim: on SQLite its read of the run it would get (a claim
    that finds nothing sends nothing else); on Postgres the claim's one statement."""
    return [sql for operation, sql, _ in seen if operation == "claim" and _takes_runs(sql)]


def _takes_runs(sql: str) -> bool:
    return sql.lstrip().upper().startswith("SELECT") or "SKIP LOCKED" in sql


async def _claims_seen(seen: Sequence[tuple[str, str, Any]], count: int) -> bool:
    return len(_claims(seen)) >= count


@pytest.mark.postgres
@pytest.mark.parametrize("backend", ["postgres"], indirect=True)
async def test_starting_a_run_notifies_only_when_a_run_was_inserted(engine: AsyncEngine):
    payloads: list[str] = []
    async with engine.connect() as connection:
        raw = (await connection.get_raw_connection()).driver_connection
        assert raw is not None
        await raw.add_listener("jobrun_started", lambda *args: payloads.append(args[3]))
        store = jobrun.SqlJobRunStore(engine)
        await jobrun.start_job_run(store, module_id="a/b", job="c", instance="x")
        await jobrun.start_job_run(store, module_id="a/b", job="c", instance="x")  # joined
        # A last start that does notify: notifications arrive in commit order, so once
        # its own has come, any from the joined start would have come before it.
        await jobrun.start_job_run(store, module_id="a/b", job="last", instance="x")
        await eventually(lambda: _has(payloads, '["a/b", "last"]'))
        await raw.remove_listener("jobrun_started", lambda *args: None)
    assert payloads == ['["a/b", "c"]', '["a/b", "last"]']


async def _has(items: list[str], item: str) -> bool:
    return item in items


# --- the command ----------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def spawn(*args: str) -> subprocess.Popen[str]:
    return spawn_worker(APP, *args)


async def lease_held(engine: AsyncEngine, run_id: str) -> bool:
    async with engine.connect() as connection:
        owner = (
            await connection.execute(select(job_runs.c.lease_owner).where(job_runs.c.id == run_id))
        ).scalar_one()
    return owner is not None


@SECOND
async def test_the_command_drains_two_databases_and_stops_on_sigterm(
    two_databases: tuple[str, str, AsyncEngine, AsyncEngine],
):
    first_url, second_url, first, other = two_databases
    await start_pages(first, 3)
    await start_pages(other, 3)
    port = free_port()
    process = spawn(
        "--url", first_url, "--url", second_url, "--interval", "0.5", "--concurrency", "2",
        "--metrics-port", str(port),
    )  # fmt: skip
    try:
        await eventually(lambda: all_done(first, other), timeout_s=10)
        # A slow pass in flight when SIGTERM comes: it finishes, then the worker exits 0.
        slow = await jobrun.start_job_run(
            jobrun.SqlJobRunStore(first), module_id="demo", job="slow", payload={"sleep_s": 1.5}
        )
        await eventually(lambda: lease_held(first, slow.id), timeout_s=5)
        scraped = await asyncio.to_thread(
            lambda: urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read()
        )
        process.send_signal(signal.SIGTERM)
        _, stderr = await asyncio.to_thread(process.communicate, timeout=15)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == 0, stderr
    assert (await statuses(first))[slow.id] == "done", "the pass in flight was let finish"
    assert stderr.count("INFO jobrun.pass: pass demo/pages[") == 18
    assert "INFO jobrun.pass: pass demo/slow[default] completed" in stderr
    assert "SIGTERM: stopping" in stderr
    text = scraped.decode()
    assert 'jobrun_passes_total{job="pages",module_id="demo",outcome="completed"} 6.0' in text
    assert "jobrun_due_runs{database=" in text


async def test_a_second_sigterm_cancels_the_pass_and_hands_its_lease_back(
    sqlite_template: Path, tmp_path: Path, engines: Callable[[str], AsyncEngine]
):
    url = sqlite_copy(sqlite_template, tmp_path, "slow")
    engine = engines(url)
    slow = await jobrun.start_job_run(
        jobrun.SqlJobRunStore(engine), module_id="demo", job="slow", payload={"sleep_s": 60}
    )
    process = spawn("--url", url, "--interval", "0.5")
    try:
        await eventually(lambda: lease_held(engine, slow.id), timeout_s=10)
        process.send_signal(signal.SIGTERM)
        # sleep: a look for an exit that must not come yet (load cannot fake one)
        await asyncio.sleep(0.3)
        assert process.poll() is None, "the first signal lets the pass finish"
        process.send_signal(signal.SIGTERM)
        _, stderr = await asyncio.to_thread(process.communicate, timeout=10)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == 1, stderr
    assert "cancelling passes in flight" in stderr
    assert "pass demo/slow[default] interrupted" in stderr
    record = await jobrun.get_job_run(jobrun.SqlJobRunStore(engine), slow.id)
    assert record is not None
    assert record.status == "running"
    assert record.lease_driver is None, "the lease was handed back, not left to expire"


async def test_past_the_drain_timeout_the_pass_is_cancelled_and_its_lease_handed_back(
    sqlite_template: Path, tmp_path: Path, engines: Callable[[str], AsyncEngine]
):
    url = sqlite_copy(sqlite_template, tmp_path, "slow")
    engine = engines(url)
    slow = await jobrun.start_job_run(
        jobrun.SqlJobRunStore(engine), module_id="demo", job="slow", payload={"sleep_s": 60}
    )
    beat = tmp_path / "heartbeat"
    process = spawn(
        "--url", url, "--interval", "0.5", "--drain-timeout", "0.5", "--heartbeat-file", str(beat)
    )  # fmt: skip
    try:
        await eventually(lambda: lease_held(engine, slow.id), timeout_s=10)
        assert beat.exists(), "touched before the first claim"
        process.send_signal(signal.SIGTERM)
        # One signal only: the drain timeout does what a second one would.
        _, stderr = await asyncio.to_thread(process.communicate, timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == 1, stderr
    assert "still draining after 0.5 s: cancelling passes in flight" in stderr
    assert "pass demo/slow[default] interrupted" in stderr
    record = await jobrun.get_job_run(jobrun.SqlJobRunStore(engine), slow.id)
    assert record is not None
    assert record.lease_driver is None, "the lease was handed back, not left to expire"
    assert not beat.exists(), "the heartbeat file goes with the worker"


def test_an_unwritable_heartbeat_file_stops_the_worker_before_it_starts(sqlite_url: str):
    process = spawn("--url", sqlite_url, "--heartbeat-file", "/nonexistent/jobrun-heartbeat")
    _, stderr = process.communicate(timeout=30)
    assert process.returncode == 1
    assert "cannot write the heartbeat file /nonexistent/jobrun-heartbeat" in stderr
    assert "worker started" not in stderr


@SECOND
async def test_the_command_survives_steps_that_raise_cancellation_and_exits(
    database_url: str, engine: AsyncEngine
):
    store = jobrun.SqlJobRunStore(engine)
    poisoned = {
        kind: (
            await jobrun.start_job_run(
                store, module_id="demo", job="poison", instance=kind, payload={"raise": kind}
            )
        ).id
        for kind in ("cancelled", "keyboard", "exit")
    }
    # Started after the poison, so driven after it too: the worker must still be driving.
    healthy = await start_pages(engine, 2, pages=2)
    process = spawn("--url", database_url, "--interval", "0.2", "--concurrency", "2")
    try:

        async def settled() -> bool:
            found = await statuses(engine)
            return all(found[run] == "failed" for run in poisoned.values()) and all(
                found[run] == "done" for run in healthy
            )

        await eventually(settled, timeout_s=60)
        assert process.poll() is None, "the worker died"
        process.send_signal(signal.SIGTERM)
        _, stderr = await asyncio.to_thread(process.communicate, timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == 0, stderr
    records = {record.id: record for record in await jobrun.job_runs(store)}
    expected = {
        "cancelled": "CancelledError raised by the step's code (not a cancellation of the pass)",
        "keyboard": "KeyboardInterrupt raised by the step's code",
        "exit": "SystemExit: 3 raised by the step's code",
    }
    for kind, run_id in poisoned.items():
        record = records[run_id]
        assert record.last_error == f"step 'poison' failed: {expected[kind]}"
        assert record.lease_driver is None
    assert stderr.count("raised KeyboardInterrupt in its own code") == 2, stderr
    assert stderr.count("raised SystemExit: 3 in its own code") == 2, stderr


async def test_after_a_full_disk_the_worker_resumes_well_within_the_lease(
    sqlite_template: Path,
    tmp_path: Path,
    engines: Callable[[str], AsyncEngine],
    monkeypatch: pytest.MonkeyPatch,
):
    """The failure record the full disk refused is sent again as soon as the disk takes
    writes: the run does not wait for its (one minute) lease to expire."""
    engine = engines(sqlite_copy(sqlite_template, tmp_path, "full"))
    full = {"on": False}
    refused: list[str] = []

    async def disk(_operation: str, statement: str) -> None:
        if full["on"] and statement.lstrip().upper().startswith(("INSERT", "UPDATE", "DELETE")):
            refused.append(statement)
            raise OSError(28, "database or disk is full")

    async def refused_record_and_release() -> bool:
        # The step's record, then the failure record that would release the lease.
        return len(refused) >= 2

    log_worker_statements(monkeypatch).before = disk
    slow = await jobrun.start_job_run(
        jobrun.SqlJobRunStore(engine), module_id="demo", job="slow", payload={"sleep_s": 1}
    )
    worker = Worker([engine], interval_s=5.0)
    try:
        await eventually(lambda: lease_held(engine, slow.id), timeout_s=30)
        full["on"] = True
        await eventually(refused_record_and_release, timeout_s=30)
        assert await lease_held(engine, slow.id), "nothing could be written while full"
        full["on"] = False
        freed = time.monotonic()
        await eventually(lambda: all_done(engine), timeout_s=50)
        resumed_s = time.monotonic() - freed
    finally:
        await worker.finish()
    print(f"done {resumed_s:.2f} s after the disk took writes again")
    # Against the lease, not a speed goal: waiting it out would take about 60 s.
    assert resumed_s < 30


def test_the_command_refuses_a_bad_app_and_an_unknown_database(tmp_path: Path):
    from jobrun._cli.app import cli
    from jobrun._cli.commands import worker as _registers  # noqa: F401

    runner = CliRunner()
    url = f"sqlite+aiosqlite:///{tmp_path / 'nothing.db'}"
    result = runner.invoke(cli, ["worker", "--app", "no-colon", "--url", url])
    assert result.exit_code == 2
    assert "package.module:registry" in result.output
    result = runner.invoke(cli, ["worker", "--app", "tests.no_such_module:x", "--url", url])
    assert result.exit_code == 2
    assert "cannot import" in result.output
    result = runner.invoke(
        cli, ["worker", "--app", "tests.processes.worker_app:nothing", "--url", url]
    )
    assert result.exit_code == 2
    assert "has no attribute" in result.output
    result = runner.invoke(
        cli, ["worker", "--app", "tests.processes.worker_app:asyncio", "--url", url]
    )
    assert result.exit_code == 2
    assert "not a jobrun.JobRegistry" in result.output
    result = runner.invoke(cli, ["worker", "--app", APP, "--url", url])
    assert result.exit_code == 1
    assert "jobrun db upgrade" in result.output
    assert not (tmp_path / "nothing.db").exists()
