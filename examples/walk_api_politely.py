"""Walk an external API politely: one shared rate limit, ``Retry-After``, idempotency keys.

The job ``("objects", "walk")`` walks the objects of an HTTP API. A run owns a
shard of object ids (its payload); each pass takes the next page of them (the
cursor is the next id), fetches them side by side with ``p.map``
(``GET /objects/{n}``), then marks each one (``POST /objects/{n}/mark``) with an
``Idempotency-Key`` from ``p.idempotency_key``, so a mark replayed after a crash
takes effect once. Every request is one step and costs one token of the rate
limit ``objects-api``, declared once and shared by every driver on every host
that uses the same database. A ``429`` ends the pass as deferred
(``jobrun.RetryAfter``): nothing is charged, the finished steps stay stored, and
the run is due again when the API said; naming the limit, it also holds the
limit for every other run and driver until then.

Start the runs once, then drive them from as many processes as you like (a run
is driven by one driver at a time; a killed driver's runs are taken over)::

    python -m tests.fake_api --per-second 300 --burst 5     # a stand-in API; prints its URL
    python examples/walk_api_politely.py --url sqlite+aiosqlite:///walk.db \\
        --api http://127.0.0.1:PORT --objects 3000 --runs 4
    python examples/walk_api_politely.py --url sqlite+aiosqlite:///walk.db \\
        --api http://127.0.0.1:PORT --drive                  # in each of several terminals

``--drive`` returns once every run of the job has ended, and prints them.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any

import httpx
from sqlalchemy.ext.asyncio import create_async_engine

import jobrun

MODULE, JOB = "objects", "walk"
LIMIT = "objects-api"


async def call(
    client: httpx.AsyncClient,
    method: str,
    path: str,
    headers: dict[str, str] | None = None,
    no_header_s: float = 1.0,
) -> Any:
    """One request; a 429 becomes ``RetryAfter``, which defers the pass (not a
    failure) and cools the limit down for every driver: none calls the API again
    before then. Without a ``Retry-After`` header (nginx sends none), ``no_header_s``."""
    answer = await client.request(method, path, headers=headers)
    if answer.status_code == 429:
        wait_s = float(answer.headers.get("Retry-After", no_header_s))
        raise jobrun.RetryAfter(wait_s, reason=f"429 from {LIMIT}", rate_limit=LIMIT)
    answer.raise_for_status()
    return answer.json()


def build_registry(
    client: httpx.AsyncClient,
    *,
    per_second: float,
    burst: int,
    concurrency: int,
    no_header_s: float = 1.0,
) -> jobrun.JobRegistry:
    registry = jobrun.JobRegistry()
    # Declared once; its bucket is a row in the database, so all drivers share it.
    registry.rate_limit(LIMIT, per_second=per_second, burst=burst)

    @registry.job(MODULE, JOB)
    async def walk(p: jobrun.JobPass) -> jobrun.PassResult:
        first = p.payload["first"] if p.cursor is None else p.cursor
        end = min(first + p.payload["page"], p.payload["end"])
        ids = list(range(first, end))

        def fetch(n: int) -> Any:
            return call(client, "GET", f"/objects/{n}", no_header_s=no_header_s)

        def mark(n: int) -> Any:
            # The same key on every replay of this pass: the API writes once.
            key = p.idempotency_key(f"mark-{n}")
            marked = {"Idempotency-Key": key}
            return call(client, "POST", f"/objects/{n}/mark", marked, no_header_s)

        # One step per request, each waiting for its token; at most `concurrency` at once.
        objects = await p.map(
            fetch, ids, name=lambda n: f"get-{n}", concurrency=concurrency, rate_limit=LIMIT
        )
        await p.map(
            mark, ids, name=lambda n: f"mark-{n}", concurrency=concurrency, rate_limit=LIMIT
        )
        # Counters commit with the pass: a replayed pass does not count twice.
        p.count("objects", len(ids))
        p.count("bytes", sum(found["size"] for found in objects))
        return jobrun.PassResult(cursor=end, done=end >= p.payload["end"])

    return registry


async def start_runs(store: jobrun.SqlJobRunStore, objects: int, runs: int, page: int) -> None:
    """One run per shard of ids: ``shard-0`` .. ``shard-{runs - 1}`` (joined if live)."""
    share = -(-objects // runs)
    for shard in range(runs):
        first, end = shard * share, min(objects, (shard + 1) * share)
        payload = {"first": first, "end": end, "page": page}
        await jobrun.start_job_run(
            store, module_id=MODULE, job=JOB, instance=f"shard-{shard}", payload=payload
        )


async def drive(store: jobrun.SqlJobRunStore, registry: jobrun.JobRegistry, loops: int) -> None:
    """Drive due runs (``loops`` at once in this process) until none of the job is running."""
    stop = asyncio.Event()

    async def stop_when_walked() -> None:
        while True:
            if not await jobrun.job_runs(store, module_id=MODULE, job=JOB, status="running"):
                stop.set()
                return
            await asyncio.sleep(0.5)  # how often to look whether the walk is over

    async with asyncio.TaskGroup() as group:
        group.create_task(stop_when_walked())
        group.create_task(
            jobrun.run_worker([store], registry, concurrency=loops, stop=stop, interval_s=1.0)
        )


async def run(args: argparse.Namespace) -> list[jobrun.JobRun]:
    engine = create_async_engine(args.url)
    try:
        await jobrun.upgrade(engine)
        store = jobrun.SqlJobRunStore(engine)
        if args.objects:
            await start_runs(store, args.objects, args.runs, args.page)
        if args.drive:
            limits = httpx.Limits(max_connections=args.concurrency * args.loops)
            async with httpx.AsyncClient(base_url=args.api, limits=limits) as client:
                registry = build_registry(
                    client,
                    per_second=args.per_second,
                    burst=args.burst,
                    concurrency=args.concurrency,
                    no_header_s=args.no_header_s,
                )
                await drive(store, registry, args.loops)
        return await jobrun.job_runs(store, module_id=MODULE, job=JOB)
    finally:
        await engine.dispose()


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--url", required=True, help="the jobrun database (an asyncio URL)")
    parser.add_argument("--api", default="http://127.0.0.1:8000", help="the API's base URL")
    parser.add_argument("--objects", type=int, default=0, help="start runs over this many ids")
    parser.add_argument("--runs", type=int, default=1, help="shards: runs to split them into")
    parser.add_argument("--page", type=int, default=100, help="objects per pass (new runs)")
    parser.add_argument("--per-second", type=float, default=50.0, help="the API's rate limit")
    parser.add_argument("--burst", type=int, default=5, help="requests at once after a lull")
    parser.add_argument("--concurrency", type=int, default=16, help="requests at once, per run")
    parser.add_argument("--loops", type=int, default=1, help="runs this process drives at once")
    parser.add_argument(
        "--no-header-s", type=float, default=1.0,
        help="after a 429 without Retry-After, wait this long (every driver)",
    )  # fmt: skip
    parser.add_argument("--drive", action="store_true", help="drive until every run has ended")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    runs = asyncio.run(run(parse(argv)))
    for found in sorted(runs, key=lambda found: found.instance):
        print(f"{found.instance}: {found.status} {found.counters}")
    return 0 if all(found.status != "failed" for found in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
