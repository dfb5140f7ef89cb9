"""What every benchmark shares: options, databases, interleaved timing, profiles, results.

A scenario file builds its variants (async callables that return one sample,
in milliseconds or per-second rates) and hands them to :func:`interleave`, which
takes one sample of each in turn, flipping the order every round, so that a
noisy neighbour spreads over all variants alike; medians are reported and ratios
are only taken within one run. Results go to ``benchmarks/results/`` (ignored by
git) as JSON with the command line, the machine and the load average.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import io
import json
import os
import platform
import pstats
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

# Run as a script from anywhere: the checkout comes first on the path, so the imports
# below must follow this (hence their noqa: E402).
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from sqlalchemy import make_url  # noqa: E402
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine  # noqa: E402

import jobrun  # noqa: E402

DEFAULT_POSTGRES = "postgresql+asyncpg://postgres@127.0.0.1:5432/jobrun_bench"
Sample = Callable[[], Awaitable[float]]


def options(description: str, **extra: Any) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--quick", action="store_true", help="smoke sizes (seconds)")
    parser.add_argument("--sqlite-only", action="store_true")
    parser.add_argument("--postgres-url", default=DEFAULT_POSTGRES)
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--profile", action="store_true", help="print a cProfile summary")
    parser.add_argument("--out-dir", type=Path, default=HERE / "results")
    parser.add_argument(
        "--loop",
        choices=["asyncio", "uvloop"],
        default="asyncio",
        help="the event loop everything runs on (uvloop: the speed extra)",
    )
    for name, default in extra.items():
        flag = f"--{name.replace('_', '-')}"
        if isinstance(default, bool):
            parser.add_argument(flag, action="store_true")
        else:
            parser.add_argument(flag, type=type(default), default=default)
    return parser.parse_args()


def backends(args: argparse.Namespace) -> list[str]:
    return ["sqlite"] if args.sqlite_only else ["sqlite", "postgres"]


async def fresh_engine(
    backend: str, args: argparse.Namespace, **engine_options: Any
) -> AsyncEngine:
    """A migrated, empty jobrun database (a temp SQLite file; the bench Postgres database)."""
    if backend == "sqlite":
        path = Path(tempfile.mkdtemp(prefix="jobrun-bench-")) / "bench.db"
        engine = create_async_engine(f"sqlite+aiosqlite:///{path}", **engine_options)
    else:
        await _create_database(args.postgres_url)
        engine = create_async_engine(args.postgres_url, **engine_options)
    await jobrun.upgrade(engine)
    async with engine.begin() as connection:
        await connection.exec_driver_sql("DELETE FROM _substrat_job_steps")
        await connection.exec_driver_sql("DELETE FROM _substrat_job_runs")
    return engine


def driver_dsn(engine: AsyncEngine) -> str:
    """The plain DSN (asyncpg) or file path (aiosqlite) behind ``engine``."""
    url = engine.url
    if url.get_backend_name() == "sqlite":
        return str(url.database)
    return url.set(drivername="postgresql").render_as_string(hide_password=False)


async def _create_database(url: str) -> None:
    import asyncpg

    target = make_url(url)
    admin = await asyncpg.connect(driver_dsn(create_async_engine(target.set(database="postgres"))))
    try:
        exists = await admin.fetchval(
            "SELECT 1 FROM pg_database WHERE datname = $1", target.database
        )
        if not exists:
            await admin.execute(f'CREATE DATABASE "{target.database}"')
    finally:
        await admin.close()


async def interleave_samples(variants: dict[str, Sample], rounds: int) -> dict[str, list[float]]:
    """``rounds`` samples per variant, one of each per round, order flipped every round."""
    samples: dict[str, list[float]] = {name: [] for name in variants}
    names = list(variants)
    for name in names:
        await variants[name]()  # warm-up: connections, prepared statements, caches
    for round_number in range(rounds):
        for name in names if round_number % 2 == 0 else reversed(names):
            # Each sample starts with an empty nursery: a full collection that the
            # previous variant's garbage made due (tens of ms) is not charged to this one.
            gc.collect()
            samples[name].append(await variants[name]())
    return samples


async def interleave(variants: dict[str, Sample], rounds: int) -> dict[str, float]:
    """Median of ``rounds`` samples per variant, one of each per round, order flipped."""
    samples = await interleave_samples(variants, rounds)
    return {name: round(statistics.median(values), 4) for name, values in samples.items()}


def spread(values: list[float]) -> dict[str, float]:
    """Median, interquartile range and extremes of some samples (or per-round ratios)."""
    ordered = sorted(values)
    if len(ordered) >= 2:
        low, _, high = statistics.quantiles(ordered, n=4, method="inclusive")
    else:
        low = high = ordered[0]
    return {
        "median": round(statistics.median(ordered), 4),
        "q1": round(low, 4),
        "q3": round(high, 4),
        "min": round(ordered[0], 4),
        "max": round(ordered[-1], 4),
    }


def round_ratios(numerators: list[float], denominators: list[float]) -> dict[str, float]:
    """The spread of per-round ratios: each round's two samples were taken side by side."""
    return spread([top / bottom for top, bottom in zip(numerators, denominators, strict=True)])


def shown(found: dict[str, float], digits: int = 3, unit: str = "") -> str:
    """``median [q1–q3]``: a figure and its interquartile range, for a table cell."""
    return f"{found['median']:.{digits}f}{unit} [{found['q1']:.{digits}f}–{found['q3']:.{digits}f}]"


def timed_ms(started: float, count: int = 1) -> float:
    return (time.perf_counter() - started) * 1000 / count


async def profiled(label: str, run: Callable[[], Awaitable[Any]], top: int = 18) -> str:
    """Run once under cProfile; return (and print) the top functions by own time."""
    profile = cProfile.Profile()
    profile.enable()
    try:
        await run()
    finally:
        profile.disable()
    text = io.StringIO()
    pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(top)
    lines = [line for line in text.getvalue().splitlines() if line.strip()]
    # print_stats(top) already keeps the top rows: the header once, then the rows.
    summary = "\n".join(lines)
    print(f"\n--- profile: {label} (own time) ---\n{summary}")
    return summary


def machine() -> dict[str, Any]:
    import aiosqlite
    import asyncpg
    import sqlalchemy

    return {
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "sqlalchemy": sqlalchemy.__version__,
        "aiosqlite": aiosqlite.__version__,
        "asyncpg": asyncpg.__version__,
        "load_1min": round(os.getloadavg()[0], 2),
        "loop": running_loop(),
        "json": jobrun_json(),
    }


def running_loop() -> str:
    try:
        return type(asyncio.get_running_loop()).__module__
    except RuntimeError:
        return "none"


def jobrun_json() -> str:
    """What writes jobrun's plain JSON here (orjson when installed; older trees: json)."""
    try:
        from jobrun._core.model.fast_json import accelerator
    except ImportError:
        return "json (piecewise)"
    return accelerator()


def table(title: str, header: list[str], rows: list[list[Any]]) -> str:
    lines = [f"\n{title}", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    text = "\n".join(lines)
    print(text)
    return text


def save(args: argparse.Namespace, name: str, results: dict[str, Any]) -> Path:
    args.out_dir.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
    path = args.out_dir / f"{name}-{stamp}{'-quick' if args.quick else ''}.json"
    meta = {"command": " ".join(sys.argv), "machine": machine()}
    path.write_text(json.dumps({"meta": meta, **results}, indent=2, default=str))
    print(f"\nresults: {path}")
    return path


def main(
    scenario: Callable[[argparse.Namespace], Awaitable[None]], args: argparse.Namespace
) -> None:
    """Run ``scenario`` on the loop ``--loop`` names (floors and jobrun alike)."""
    factory = None
    if args.loop == "uvloop":
        import uvloop

        factory = uvloop.new_event_loop
    with asyncio.Runner(loop_factory=factory) as runner:
        runner.run(scenario(args))
