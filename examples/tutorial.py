"""The tutorial's program: walk the pages of a slow API as one run that survives crashes.

    python examples/tutorial.py            # Ctrl-C or kill -9 it, then run it again

The first time it starts a run; every later time it joins the run that is still
live and drives it on from its last committed page.
"""

from __future__ import annotations

import asyncio
import os

from sqlalchemy.ext.asyncio import create_async_engine

import jobrun

PAGES = 20
DATABASE_URL = os.environ.get("TUTORIAL_DATABASE_URL", "sqlite+aiosqlite:///tutorial.db")

# --8<-- [start:job]
registry = jobrun.JobRegistry()


async def fetch_page(page: int) -> list[str]:
    """A slow, external API: half a second per page of five names."""
    await asyncio.sleep(0.5)
    return [f"user-{page * 5 + n}" for n in range(5)]


@registry.job("tutorial", "walk-users", lease_ms=5_000)
async def walk_users(p: jobrun.JobPass) -> jobrun.PassResult:
    page = p.cursor or 0  # None on the first pass
    if "total" not in p.counters:
        p.count("total", PAGES)
    users = await p.step(f"fetch-{page}", lambda: fetch_page(page))
    print(f"page {page}: {', '.join(users)}")
    p.count("pages")
    return jobrun.PassResult(cursor=page + 1, done=page + 1 == PAGES)


# --8<-- [end:job]


# --8<-- [start:main]
async def main() -> None:
    engine = create_async_engine(DATABASE_URL)
    await jobrun.upgrade(engine)
    store = jobrun.SqlJobRunStore(engine)
    run = await jobrun.start_job_run(store, module_id="tutorial", job="walk-users")
    print(f"run {run.id}: {run.status} at page {run.cursor or 0}")
    while True:
        report = await jobrun.run_due_jobs(store, registry)
        run = await jobrun.get_job_run(store, run.id)
        assert run is not None
        if run.status != "running":
            break
        if report.attempted == 0:
            await asyncio.sleep(0.5)  # leased by a dead driver, or backing off
    print(f"run {run.id}: {run.status}, counters {run.counters}")
    await engine.dispose()


if __name__ == "__main__":
    asyncio.run(main())
# --8<-- [end:main]
