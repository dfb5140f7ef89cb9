"""Backends for the contract suite.

Every test that takes the ``store`` fixture runs three times: on the in-memory
store, on SQLite and on Postgres. Each database test gets a fresh database
cloned from a template that was migrated once per session (a file copy on
SQLite, ``CREATE DATABASE ... TEMPLATE`` on Postgres).

Postgres comes from ``JOBRUN_TEST_POSTGRES_URL`` (an asyncpg URL to a database
the tests may use to create and drop others, e.g.
``postgresql+asyncpg://postgres@127.0.0.1:5432/postgres``). Without it the
Postgres tests skip locally; under CI (``CI`` set) they fail instead.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings as hypothesis_settings
from sqlalchemy import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

import jobrun
from jobrun.testing import FakeClock, MemoryJobRunStore
from tests.support import CRASH_SEED, IN_CI, SQL_BACKENDS, run_in_thread

POSTGRES_URL = os.environ.get("JOBRUN_TEST_POSTGRES_URL")
TEMPLATE = f"jobrun_template_{os.getpid()}"

# Under CI hypothesis draws the same examples every run (derandomize); locally
# it explores new ones each time. Either way the report header names the profile.
hypothesis_settings.register_profile("ci", derandomize=True, print_blob=True)
hypothesis_settings.register_profile("local", print_blob=True)
hypothesis_settings.load_profile(
    os.environ.get("JOBRUN_HYPOTHESIS_PROFILE", "ci" if IN_CI else "local")
)


def pytest_report_header(config: pytest.Config) -> str:
    return _randomness()


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    # Under CI the seeds close the report too: ``-q`` drops the header.
    if IN_CI:
        terminalreporter.write_line(_randomness())


def _randomness() -> str:
    profile = hypothesis_settings.get_current_profile_name()
    crash_seed = f"{CRASH_SEED} ({'fixed under CI' if IN_CI else 'drawn this session'})"
    if os.environ.get("JOBRUN_CRASH_SEED"):
        crash_seed = f"{CRASH_SEED} (JOBRUN_CRASH_SEED)"
    return (
        f"jobrun: hypothesis profile {profile!r}; kill -9 suite seed {crash_seed}; "
        "race and fault suites: seeds fixed in code"
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # Locally, no server means skip with a reason. Under CI the tests are not
    # skipped: the postgres_template fixture fails them instead.
    if POSTGRES_URL or IN_CI:
        return
    skip = pytest.mark.skip(reason="no Postgres: set JOBRUN_TEST_POSTGRES_URL to run these tests")
    for item in items:
        if "postgres" in item.keywords:
            item.add_marker(skip)


_postgres_passed = 0


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    global _postgres_passed
    if report.when == "call" and report.passed and "postgres" in report.keywords:
        _postgres_passed += 1


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    # Under CI a run in which no Postgres test passed is a failed run, whatever
    # else happened: the suite exists to prove both dialects.
    if (
        IN_CI
        and _postgres_passed == 0
        and session.testscollected
        and not session.config.option.collectonly
    ):
        print("\nCI: no Postgres test passed; failing the run")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def _with_database(url: str, database: str) -> str:
    return make_url(url).set(database=database).render_as_string(hide_password=False)


async def _admin(statement: str) -> None:
    assert POSTGRES_URL is not None
    engine = create_async_engine(POSTGRES_URL, isolation_level="AUTOCOMMIT")
    try:
        async with engine.connect() as connection:
            await connection.exec_driver_sql(statement)
    finally:
        await engine.dispose()


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("template") / "template.db"

    async def build() -> None:
        engine = create_async_engine(f"sqlite+aiosqlite:///{path}")
        await jobrun.upgrade(engine)
        await engine.dispose()

    run_in_thread(build)
    return path


@pytest.fixture(scope="session")
def postgres_template() -> Iterator[str]:
    if not POSTGRES_URL:
        pytest.fail("the postgres_template fixture needs JOBRUN_TEST_POSTGRES_URL")

    async def build() -> None:
        await _admin(f'DROP DATABASE IF EXISTS "{TEMPLATE}"')
        await _admin(f'CREATE DATABASE "{TEMPLATE}"')
        engine = create_async_engine(_with_database(POSTGRES_URL, TEMPLATE))
        await jobrun.upgrade(engine)
        await engine.dispose()

    run_in_thread(build)
    yield TEMPLATE
    run_in_thread(lambda: _admin(f'DROP DATABASE IF EXISTS "{TEMPLATE}" WITH (FORCE)'))


@pytest.fixture
async def sqlite_url(sqlite_template: Path, tmp_path: Path) -> str:
    """A fresh, migrated SQLite file (for tests that are about SQLite only)."""
    path = tmp_path / "sqlite-only.db"
    shutil.copyfile(sqlite_template, path)
    return f"sqlite+aiosqlite:///{path}"


@pytest.fixture
async def empty_postgres_url() -> AsyncIterator[str]:
    """A fresh Postgres database with no schema at all."""
    if not POSTGRES_URL:
        pytest.fail("needs JOBRUN_TEST_POSTGRES_URL")
    name = f"jobrun_empty_{uuid.uuid4().hex[:12]}"
    await _admin(f'CREATE DATABASE "{name}"')
    try:
        yield _with_database(POSTGRES_URL, name)
    finally:
        await _admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def blank_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """An empty database (no schema at all) on the backend of an indirect parameter."""
    if request.param == "sqlite":
        return f"sqlite+aiosqlite:///{tmp_path / 'blank.db'}"
    return str(request.getfixturevalue("empty_postgres_url"))


BACKENDS = [pytest.param("memory", id="memory"), *SQL_BACKENDS]


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
async def database_url(
    backend: str, request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[str | None]:
    """The URL of a fresh migrated database for SQL backends; None for memory."""
    if backend == "sqlite":
        path = tmp_path / "jobrun.db"
        shutil.copyfile(request.getfixturevalue("sqlite_template"), path)
        yield f"sqlite+aiosqlite:///{path}"
    elif backend == "postgres":
        template = request.getfixturevalue("postgres_template")
        name = f"jobrun_test_{uuid.uuid4().hex[:12]}"
        await _admin(f'CREATE DATABASE "{name}" TEMPLATE "{template}"')
        try:
            yield _with_database(str(POSTGRES_URL), name)
        finally:
            await _admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    else:
        yield None


@pytest.fixture
async def engine(database_url: str | None) -> AsyncIterator[AsyncEngine | None]:
    if database_url is None:
        yield None
        return
    created = create_async_engine(database_url)
    try:
        yield created
    finally:
        await created.dispose()


@pytest.fixture
def store(backend: str, engine: AsyncEngine | None) -> jobrun.SqlJobRunStore | MemoryJobRunStore:
    """The contract suite's store: memory, SQLite or Postgres."""
    if engine is None:
        return MemoryJobRunStore()
    return jobrun.SqlJobRunStore(engine)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()
