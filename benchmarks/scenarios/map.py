"""Steps side by side: ``p.map`` against one step at a time, over an I/O-bound body.

Per dialect, interleaved in one process, each sample one pass of N new steps
whose body waits ``--io-ms`` (``asyncio.sleep``, standing for a call to another
service), timed inside the handler, ms per item:

* one at a time: ``for item in items: await p.step(name, body)``;
* ``p.map(body, items, name=..., concurrency=C)``.

Every step is still its own durable ledger write; the speed-up is the body
waits overlapping (and, on Postgres, the writes sharing the engine's pool). The
issue asked for at least 20x at 500 items, 20 ms, concurrency 32.
"""

from __future__ import annotations

import asyncio
from typing import Any

import jobrun
from benchmarks import harness


def runner(
    store: jobrun.SqlJobRunStore, n: int, io_s: float, concurrency: int | None
) -> harness.Sample:
    """A pass of ``n`` new steps (``concurrency`` None: one at a time); returns ms per item."""

    async def body(item: int) -> int:
        await asyncio.sleep(io_s)  # the simulated I/O the body waits on
        return item

    async def steps(p: jobrun.JobPass) -> None:
        if concurrency is None:
            for item in range(n):
                await p.step(f"s{item}", lambda item=item: body(item))
        else:
            await p.map(body, range(n), name=lambda item: f"s{item}", concurrency=concurrency)

    job = "sequential" if concurrency is None else f"map-{concurrency}"
    return harness.timed_pass(store, job, steps, n)


async def measure(backend: str, args: Any) -> dict[str, float]:
    engine = await args.databases.engine(backend)
    store = jobrun.SqlJobRunStore(engine)
    n = 20 if args.quick else args.n
    io_s = args.io_ms / 1000
    variants = {
        "one at a time": runner(store, n, io_s, None),
        f"p.map, concurrency={args.concurrency}": runner(store, n, io_s, args.concurrency),
    }
    medians = await harness.interleave(variants, args.rounds or (1 if args.quick else 3))
    await engine.dispose()
    return medians


async def scenario(args: Any) -> None:
    results: dict[str, Any] = {}
    rows = []
    for backend in harness.backends(args):
        found = await measure(backend, args)
        sequential, mapped = found.values()
        found["speed-up"] = round(sequential / mapped, 2)
        results[backend] = found
        rows.append([backend, f"{sequential:.3f}", f"{mapped:.3f}", f"{found['speed-up']:.1f}x"])
    n = 20 if args.quick else args.n
    harness.table(
        f"ms per item, {n} items, body {args.io_ms} ms of I/O",
        ["", "one at a time", f"p.map, concurrency={args.concurrency}", "speed-up"],
        rows,
    )
    harness.save(args, results)


if __name__ == "__main__":
    harness.run(scenario, n=500, io_ms=20.0, concurrency=32)
