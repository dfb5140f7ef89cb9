"""What every scenario shares: options, throwaway databases, interleaved timing, reports.

A scenario module builds its variants (async callables that return one sample) and
hands them to :func:`interleave_samples`; it gets its databases from
``args.databases`` (:class:`Databases`: unique names, dropped at the end however the
run ends) and writes its results with :func:`save` (``benchmarks/results/``, ignored by
git, or ``$JOBRUN_BENCH_RESULTS``), with the command line, the machine and the load.
A scenario module ends with ``harness.run(scenario, **its_options)``; run one as
``python -m benchmarks NAME`` from the repository root.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from collections.abc import Awaitable, Callable
from typing import Any

from .databases import (
    SQLITE_PRAGMAS,
    Databases,
    driver_dsn,
    migrated_sqlite_files,
    plain_url,
    server_execute,
)
from .options import DEFAULT_POSTGRES, REPO, backends, child_environment, options
from .passes import drive_one, step_runner, timed_pass, trivial_steps, whole_pass_runner
from .report import load, machine, save, shown, table
from .timing import (
    Sample,
    children_cpu_s,
    interleave,
    interleave_samples,
    profiled,
    round_ratios,
    rss_mb,
    spread,
    timed_ms,
)

__all__ = [
    "DEFAULT_POSTGRES",
    "REPO",
    "SQLITE_PRAGMAS",
    "Databases",
    "Sample",
    "backends",
    "child_environment",
    "children_cpu_s",
    "drive_one",
    "driver_dsn",
    "interleave",
    "interleave_samples",
    "load",
    "machine",
    "main",
    "migrated_sqlite_files",
    "options",
    "plain_url",
    "profiled",
    "round_ratios",
    "rss_mb",
    "run",
    "save",
    "server_execute",
    "shown",
    "spread",
    "step_runner",
    "table",
    "timed_ms",
    "timed_pass",
    "trivial_steps",
    "whole_pass_runner",
]


def run(scenario: Callable[[argparse.Namespace], Awaitable[None]], **extra: Any) -> None:
    """Parse the command line (the common options and ``extra``, see :func:`options`;
    the help is the ``__main__`` module's docstring) and :func:`main` ``scenario``."""
    main(scenario, options(sys.modules["__main__"].__doc__ or "", **extra))


def main(
    scenario: Callable[[argparse.Namespace], Awaitable[None]], args: argparse.Namespace
) -> None:
    """Run ``scenario(args)`` on the loop ``--loop`` names (floors and jobrun alike), with
    ``args.databases`` open for it and closed after, whatever happened."""
    factory = None
    if args.loop == "uvloop":
        import uvloop

        factory = uvloop.new_event_loop
    args.load_at_start = load()
    with asyncio.Runner(loop_factory=factory) as runner:
        runner.run(_with_databases(scenario, args))


async def _with_databases(
    scenario: Callable[[argparse.Namespace], Awaitable[None]], args: argparse.Namespace
) -> None:
    running = asyncio.current_task()
    if running is not None:
        # SIGTERM ends the run as Ctrl-C does: through the clean-up below.
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, running.cancel)
    async with Databases(args.postgres_url, args.scenario) as databases:
        args.databases = databases
        await scenario(args)
