"""What a per-job concurrency limit (``max_concurrent``) costs the claim.

Run on demand from the repository root (not part of the test suite)::

    .venv/bin/python benchmarks/bench_claim_limit.py                # SQLite + Postgres
    .venv/bin/python benchmarks/bench_claim_limit.py --quick --sqlite-only

One database per backend holds ``--queued`` due runs of one job, two of them
leased by other drivers. Each sample is one ``store.claim`` (timed), then a
``store.release`` of what it took (not timed), so every sample sees the same
table. Variants, interleaved round by round so noise spreads over all alike:

* ``unlimited``: the job has no limit (the claim is a read, then the core's
  decision as a fenced UPDATE);
* ``limited``: ``max_concurrent=1000``, never reached (SQLite: the count in the
  read and again in the fenced UPDATE; Postgres: a transaction with an advisory
  lock, then the read and the UPDATE);
* ``at limit``: ``max_concurrent=2`` with two leased: the claim finds nothing.

Medians in microseconds, and each variant's ratio to ``unlimited``.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

# Run as a script from anywhere: the checkout comes first on the path, so the imports
# below must follow this (hence their noqa: E402).
ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from sqlalchemy import make_url  # noqa: E402
from sqlalchemy.ext.asyncio import create_async_engine  # noqa: E402

import jobrun  # noqa: E402
from jobrun._core.model.formats import format_instant  # noqa: E402
from jobrun._core.model.records import ClaimRequest  # noqa: E402
from jobrun._core.rules.transitions import release_transition  # noqa: E402

KEY = ("bench", "limited")
VARIANTS = {"unlimited": None, "limited": 1000, "at limit": 2}


def request(token: str, limit: int | None) -> ClaimRequest:
    now = datetime.now(UTC)
    return ClaimRequest(
        now_at=format_instant(now),
        token=token,
        driver="bench",
        expires_at={KEY: format_instant(now + timedelta(minutes=10))},
        max_concurrent={} if limit is None else {KEY: limit},
    )


async def fill(store: jobrun.SqlJobRunStore, queued: int) -> None:
    for number in range(queued):
        await jobrun.start_job_run(store, module_id=KEY[0], job=KEY[1], instance=f"i{number}")
    # Two runs held by other drivers: what a limit counts.
    for token in ("held-1", "held-2"):
        assert await store.claim(request(token, None)) is not None


async def measure(url: str, queued: int, rounds: int) -> dict[str, float]:
    engine = create_async_engine(url)
    try:
        await jobrun.upgrade(engine)
        store = jobrun.SqlJobRunStore(engine)
        await fill(store, queued)
        samples: dict[str, list[float]] = {name: [] for name in VARIANTS}
        for number in range(rounds):
            names = list(VARIANTS) if number % 2 == 0 else list(reversed(VARIANTS))
            for name in names:
                began = time.perf_counter()
                claimed = await store.claim(request(f"t{number}-{name}", VARIANTS[name]))
                samples[name].append(time.perf_counter() - began)
                assert (claimed is None) == (name == "at limit"), name
                if claimed is not None:
                    await store.release(claimed.row.id, release_transition())
        return {name: statistics.median(values) * 1e6 for name, values in samples.items()}
    finally:
        await engine.dispose()


async def postgres_database(admin_url: str, name: str) -> str:
    admin = create_async_engine(admin_url, isolation_level="AUTOCOMMIT")
    try:
        async with admin.connect() as connection:
            await connection.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            await connection.exec_driver_sql(f'CREATE DATABASE "{name}"')
    finally:
        await admin.dispose()
    return make_url(admin_url).set(database=name).render_as_string(hide_password=False)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="smoke sizes")
    parser.add_argument("--sqlite-only", action="store_true")
    parser.add_argument(
        "--postgres-url", default="postgresql+asyncpg://postgres@127.0.0.1:5432/postgres"
    )
    parser.add_argument("--queued", type=int, default=2000, help="due runs of the job")
    parser.add_argument("--rounds", type=int, default=400)
    args = parser.parse_args()
    queued, rounds = (50, 20) if args.quick else (args.queued, args.rounds)
    with tempfile.TemporaryDirectory() as directory:
        backends = {"sqlite": f"sqlite+aiosqlite:///{directory}/claim.db"}
        if not args.sqlite_only:
            backends["postgres"] = await postgres_database(args.postgres_url, "jobrun_bench_limit")
        print(f"claim cost, median µs over {rounds} rounds, {queued} due runs of one job")
        for backend, url in backends.items():
            found = await measure(url, queued, rounds)
            base = found["unlimited"]
            line = ", ".join(
                f"{name} {value:.0f} µs (x{value / base:.2f})" for name, value in found.items()
            )
            print(f"  {backend:8} {line}")


if __name__ == "__main__":
    asyncio.run(main())
