"""The CLI tests' ``--app`` registry (``tests.processes.cli_support:registry``) and
helpers: the click group invoked in-process, and test data made through jobrun's
public functions on a private event loop in a thread (every command runs its own
``asyncio.run``)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

from click.testing import CliRunner, Result
from sqlalchemy import update
from sqlalchemy.ext.asyncio import create_async_engine

import jobrun
from jobrun._cli.app import cli
from jobrun.sql.schema import job_runs as runs_table
from tests.support import run_in_thread

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


CLI_APP = "tests.processes.cli_support:registry"
"""``registry`` above, as ``--app`` names it."""
APP = "tests.processes.worker_app:registry"
"""The worker tests' registry (demo/pages among its jobs), for ``--app`` checks."""


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


def set_run(url: str, run_id: str, **values: Any) -> None:
    """Overwrite columns of one run behind jobrun's back."""
    execute(url, update(runs_table).where(runs_table.c.id == run_id).values(**values))


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
