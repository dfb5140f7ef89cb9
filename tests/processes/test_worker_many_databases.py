"""One ``jobrun worker`` over many databases (``--urls-file``): woken by writes
(SQLite, inotify) and NOTIFY (Postgres) rather than polls, the set read again on
SIGHUP, and at most ``--max-open-sqlite`` SQLite files open at once.

Each worker runs with ``--interval 60``: an idle database is not polled, and the
sweep comes after 60 s, so a run driven within the test's time was found by a
wake-up, which the worker's debug log names.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import pytest
from sqlalchemy import make_url, text
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.pool import NullPool

import jobrun
from tests.support import REPO

APP = "tests.processes.worker_app:registry"


class Spawned:
    """A ``jobrun worker --urls-file`` process whose log goes to a file."""

    def __init__(self, tmp_path: Path, urls: list[str], *args: str) -> None:
        self.urls_file = tmp_path / "urls.txt"
        self.write_urls(urls)
        self.log = tmp_path / "worker.log"
        with self.log.open("w") as log:
            self.process = self._spawn(log, args)

    def _spawn(self, log: object, args: tuple[str, ...]) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [
                *(sys.executable, "-m", "jobrun", "worker", "--app", APP),
                *("--urls-file", str(self.urls_file), "--interval", "60"),
                *("--log-level", "debug", *args),
            ],
            cwd=REPO,
            env=dict(os.environ, PYTHONPATH=str(REPO)),
            stdout=subprocess.DEVNULL,
            stderr=log,  # type: ignore[arg-type]
            text=True,
        )

    def write_urls(self, urls: list[str]) -> None:
        self.urls_file.write_text("# served by the test's worker\n\n" + "\n".join(urls) + "\n")

    def logged(self) -> str:
        return self.log.read_text()

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


@pytest.fixture
def spawned(tmp_path: Path) -> Iterator[Callable[..., Spawned]]:
    made: list[Spawned] = []

    def spawn(urls: list[str], *args: str) -> Spawned:
        made.append(Spawned(tmp_path, urls, *args))
        return made[-1]

    yield spawn
    for worker in made:
        worker.stop()


async def eventually(check: Callable[[], Awaitable[bool]], timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not true within {timeout_s} s")
        # sleep: a poll interval; the deadline only bounds a hang
        await asyncio.sleep(0.05)


def sqlite_files(template: Path, directory: Path, count: int) -> list[str]:
    urls = []
    for number in range(count):
        path = directory / f"scope-{number}.db"
        shutil.copyfile(template, path)
        urls.append(f"sqlite+aiosqlite:///{path}")
    return urls


async def start(url: str, instance: str, **payload: object) -> str:
    engine = create_async_engine(url, poolclass=NullPool)
    try:
        job = "slow" if "sleep_s" in payload else "pages"
        run = await jobrun.start_job_run(
            jobrun.SqlJobRunStore(engine),
            module_id="demo",
            job=job,
            instance=instance,
            payload=payload or {"pages": 1},
        )
        return run.id
    finally:
        await engine.dispose()


async def is_done(url: str, run_id: str) -> bool:
    engine = create_async_engine(url, poolclass=NullPool)
    try:
        found = await jobrun.get_job_run(jobrun.SqlJobRunStore(engine), run_id)
        return found is not None and found.status == "done"
    finally:
        await engine.dispose()


async def started(worker: Spawned) -> bool:
    assert worker.process.poll() is None, " ".join(worker.process.args) + worker.logged()
    return "worker started" in worker.logged()


async def test_a_write_by_another_process_wakes_an_idle_sqlite_database(
    sqlite_template: Path, tmp_path: Path, spawned: Callable[..., Spawned]
) -> None:
    urls = sqlite_files(sqlite_template, tmp_path, 3)
    worker = spawned(urls)
    await eventually(lambda: started(worker))
    # sleep: the worker's first look at each database comes and goes
    await asyncio.sleep(1.0)
    run_id = await start(urls[1], "woken")
    await eventually(lambda: is_done(urls[1], run_id))
    label = make_url(urls[1]).render_as_string(hide_password=True)
    assert f"woken by a write to {label}" in worker.logged()


@pytest.mark.postgres
@pytest.mark.parametrize("backend", ["postgres"], indirect=True)
async def test_notify_wakes_an_idle_postgres_database_which_holds_one_connection(
    database_url: str, spawned: Callable[..., Spawned]
) -> None:
    worker = spawned([database_url])

    async def listening() -> bool:
        return "listening for new runs on" in worker.logged()

    await eventually(listening)
    run_id = await start(database_url, "woken")
    await eventually(lambda: is_done(database_url, run_id))
    assert "woken by NOTIFY on" in worker.logged()
    name = make_url(database_url).database

    async def one_session() -> bool:
        # The presence session (which also LISTENs); pass connections close when idle.
        admin = create_async_engine(make_url(database_url).set(database="postgres"))
        try:
            async with admin.connect() as connection:
                count = await connection.scalar(
                    text("SELECT count(*) FROM pg_stat_activity WHERE datname = :name"),
                    {"name": name},
                )
        finally:
            await admin.dispose()
        return count == 1

    await eventually(one_session)


async def test_sighup_reads_the_urls_file_again(
    sqlite_template: Path, tmp_path: Path, spawned: Callable[..., Spawned]
) -> None:
    first, second = sqlite_files(sqlite_template, tmp_path, 2)
    worker = spawned([first])
    await eventually(lambda: started(worker))
    worker.write_urls([first, second])
    worker.process.send_signal(signal.SIGHUP)
    second_label = make_url(second).render_as_string(hide_password=True)

    async def serving() -> bool:
        return f"now serving {second_label}" in worker.logged()

    await eventually(serving)
    run_id = await start(second, "added")
    await eventually(lambda: is_done(second, run_id))
    worker.write_urls([second])
    worker.process.send_signal(signal.SIGHUP)
    first_label = make_url(first).render_as_string(hide_password=True)

    async def dropped() -> bool:
        return f"no longer serving {first_label}" in worker.logged()

    await eventually(dropped)
    assert worker.process.poll() is None


def open_database_files(pid: int, directory: Path) -> set[str]:
    found = set()
    for entry in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(entry)
        except OSError:
            continue  # closed meanwhile
        if target.startswith(str(directory)) and target.endswith(".db"):
            found.add(target)
    return found


async def test_at_most_max_open_sqlite_files_are_open(
    sqlite_template: Path, tmp_path: Path, spawned: Callable[..., Spawned]
) -> None:
    urls = sqlite_files(sqlite_template, tmp_path, 6)
    runs = [await start(url, "slow", sleep_s=0.3) for url in urls]
    worker = spawned(urls, "--max-open-sqlite", "2", "--concurrency", "6")
    most = 0

    async def all_done() -> bool:
        nonlocal most
        most = max(most, len(open_database_files(worker.process.pid, tmp_path)))
        for url, run_id in zip(urls, runs, strict=True):
            if not await is_done(url, run_id):
                return False
        return True

    await eventually(all_done, timeout_s=60)
    # Two open stores, and at most one more file for an instant: the probe's
    # short read (stdlib sqlite3, closed before it returns) of a third database.
    assert 1 <= most <= 3


def served_by(worker: Spawned, labels: list[str]) -> set[str]:
    """The databases ``worker`` says it took the serving lease of (and still holds)."""
    logged = worker.logged()
    return {
        label
        for label in labels
        if logged.count(f"serving {label} (took its serving lease)")
        > logged.count(f"stopped serving {label}")
    }


async def split_and_taken_over(
    urls: list[str], spawned: Callable[..., Spawned], tmp_path: Path
) -> None:
    """Two workers with --max-databases split ``urls``; the second takes the first's
    databases once the first is killed, and drives a run started in one of them."""
    labels = [make_url(url).render_as_string(hide_password=True) for url in urls]
    half = len(urls) // 2
    first = spawned(urls, "--max-databases", str(half))

    async def first_is_full() -> bool:
        return len(served_by(first, labels)) == half

    await eventually(first_is_full)
    (tmp_path / "second").mkdir()
    second = Spawned(tmp_path / "second", urls, "--max-databases", str(len(urls)))
    try:

        async def split() -> bool:
            return len(served_by(second, labels)) == len(urls) - half

        await eventually(split)
        # Each database is served by exactly one of them.
        assert served_by(first, labels) | served_by(second, labels) == set(labels)
        assert not served_by(first, labels) & served_by(second, labels)
        orphaned = sorted(served_by(first, labels))
        first.process.kill()
        first.process.wait()

        async def taken_over() -> bool:
            return served_by(second, labels) == set(labels)

        await eventually(taken_over)
        url = urls[labels.index(orphaned[0])]
        run_id = await start(url, "after-takeover")
        await eventually(lambda: is_done(url, run_id))
    finally:
        second.stop()


async def test_two_workers_split_sqlite_files_and_one_takes_over_from_a_dead_one(
    sqlite_template: Path, tmp_path: Path, spawned: Callable[..., Spawned]
) -> None:
    urls = sqlite_files(sqlite_template, tmp_path, 4)
    await split_and_taken_over(urls, spawned, tmp_path)


@pytest.mark.postgres
async def test_two_workers_split_postgres_databases_and_one_takes_over_from_a_dead_one(
    request: pytest.FixtureRequest, tmp_path: Path, spawned: Callable[..., Spawned]
) -> None:
    from tests.conftest import POSTGRES_URL, _admin, _with_database

    template = request.getfixturevalue("postgres_template")
    names = [f"jobrun_split_{os.getpid()}_{number}" for number in range(2)]
    for name in names:
        await _admin(f'CREATE DATABASE "{name}" TEMPLATE "{template}"')
    try:
        urls = [_with_database(str(POSTGRES_URL), name) for name in names]
        await split_and_taken_over(urls, spawned, tmp_path)
    finally:
        for name in names:
            await _admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
