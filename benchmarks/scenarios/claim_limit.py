"""What a per-job concurrency limit (``max_concurrent``) costs the claim.

Run on demand from the repository root (not part of the test suite)::

    .venv/bin/python -m benchmarks claim_limit                # SQLite + Postgres
    .venv/bin/python -m benchmarks claim_limit --quick --sqlite-only

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

import itertools
import statistics
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import jobrun
from benchmarks import harness
from jobrun._core.model.formats import format_instant
from jobrun._core.model.records import ClaimRequest
from jobrun._core.rules.transitions import release_transition

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


def claim(store: jobrun.SqlJobRunStore, name: str) -> harness.Sample:
    """One claim with the variant's limit, timed; what it took is released, untimed."""
    numbers = itertools.count()

    async def sample() -> float:
        number = next(numbers)
        began = time.perf_counter()
        claimed = await store.claim(request(f"t{number}-{name}", VARIANTS[name]))
        elapsed = time.perf_counter() - began
        assert (claimed is None) == (name == "at limit"), name
        if claimed is not None:
            await store.release(claimed.row.id, release_transition())
        return elapsed

    return sample


async def measure(store: jobrun.SqlJobRunStore, queued: int, rounds: int) -> dict[str, float]:
    await fill(store, queued)
    variants = {name: claim(store, name) for name in VARIANTS}
    samples = await harness.interleave_samples(variants, rounds, warm_ups=0, collect=False)
    return {name: statistics.median(values) * 1e6 for name, values in samples.items()}


async def scenario(args: Any) -> None:
    queued, rounds = (50, 20) if args.quick else (args.queued, args.rounds or 400)
    print(f"claim cost, median µs over {rounds} rounds, {queued} due runs of one job")
    results: dict[str, Any] = {"queued": queued, "rounds": rounds}
    for backend in harness.backends(args):
        engine = await args.databases.engine(backend)
        found = await measure(jobrun.SqlJobRunStore(engine), queued, rounds)
        await engine.dispose()
        base = found["unlimited"]
        line = ", ".join(
            f"{name} {value:.0f} µs (x{value / base:.2f})" for name, value in found.items()
        )
        print(f"  {backend:8} {line}")
        results[backend] = {
            "median_us": found,
            "over_unlimited": {name: round(value / base, 3) for name, value in found.items()},
        }
    harness.save(args, results)


if __name__ == "__main__":
    harness.run(scenario, queued=2000)
