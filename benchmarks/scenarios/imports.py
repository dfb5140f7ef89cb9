"""What it costs to start: ``import jobrun`` and the CLI, next to SQLAlchemy's own import.

Run on demand from the repository root (not part of the test suite)::

    .venv/bin/python -m benchmarks imports            # 15 rounds
    .venv/bin/python -m benchmarks imports --rounds 5 --json
    # the same cases for another checkout too (e.g. `git archive main | tar -x -C /tmp/base`)
    .venv/bin/python -m benchmarks imports --baseline-tree /tmp/base

Each case is a fresh interpreter (``subprocess``), timed from spawn to exit.
The cases run interleaved, one sample of each per round and in a rotated order
each round, so a noisy neighbour spreads over all of them alike; medians and
minimums are reported, and ratios are only taken between numbers of this run.
The goal: ``import jobrun`` and ``jobrun --help`` cost well under what
``import sqlalchemy.ext.asyncio`` costs (they load no SQLAlchemy), and a CLI
command that does not migrate does not import Alembic. The children run in a
temporary folder, away from any checkout (the working directory comes first on a
child's ``sys.path``).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks import harness


def _cases(url: str) -> dict[str, list[str]]:
    python = sys.executable
    return {
        "python -c pass": [python, "-c", "pass"],
        "import sqlalchemy.ext.asyncio": [python, "-c", "import sqlalchemy.ext.asyncio"],
        "import jobrun": [python, "-c", "import jobrun"],
        "jobrun --help": [python, "-m", "jobrun", "--help"],
        "jobrun health": [python, "-m", "jobrun", "health", "--url", url, "--json"],
        "jobrun runs": [python, "-m", "jobrun", "runs", "--url", url],
        "jobrun start": [python, "-m", "jobrun", "start", "--url", url, "bench", "start"],
        "jobrun db current (Alembic)": [python, "-m", "jobrun", "db", "current", "--url", url],
    }


Case = tuple[list[str], dict[str, str]]


def _with_baseline(cases: dict[str, list[str]], tree: str | None) -> dict[str, Case]:
    """Every case as is, and every jobrun case again with ``tree`` first on the path."""
    made: dict[str, Case] = {name: (command, {}) for name, command in cases.items()}
    if tree is not None:
        baseline = {"PYTHONPATH": str(Path(tree).resolve())}
        for name, command in cases.items():
            if "jobrun" in name:
                made[f"{name} [baseline]"] = (command, baseline)
    return made


def _run(case: Case, cwd: str, *, capture: bool = False) -> subprocess.CompletedProcess[str]:
    command, extra = case
    # Run away from any checkout: the working directory comes first on sys.path.
    return subprocess.run(
        command,
        check=True,
        capture_output=capture,
        stdout=None if capture else subprocess.DEVNULL,
        stderr=None if capture else subprocess.DEVNULL,
        text=True,
        cwd=cwd,
        env={**os.environ, **extra},
    )


def _time_ms(case: Case, cwd: str) -> tuple[float, float]:
    """Wall time, and the child's CPU time (user + system), which a loaded machine inflates less."""
    began, used = time.perf_counter(), harness.children_cpu_s()
    _run(case, cwd)
    return (time.perf_counter() - began) * 1000, (harness.children_cpu_s() - used) * 1000


def _heavy_imports(case: Case, cwd: str) -> str:
    """Which of SQLAlchemy and Alembic the command imports (``-X importtime`` lists them all)."""
    command, extra = case
    done = _run(([command[0], "-X", "importtime", *command[1:]], extra), cwd, capture=True)
    modules = {line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines()}
    return ",".join(name for name in ("sqlalchemy", "alembic") if name in modules) or "-"


async def _samples(
    cases: dict[str, Case], directory: str, rounds: int
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Wall and CPU milliseconds of each case, one sample of each per round, the order
    rotated every round."""

    def variant(case: Case) -> Any:
        async def sample() -> tuple[float, float]:
            return _time_ms(case, directory)

        return sample

    variants = {name: variant(case) for name, case in cases.items()}
    found = await harness.interleave_samples(
        variants, rounds, order="rotate", warm_ups=0, collect=False
    )
    walls = {name: [wall for wall, _ in values] for name, values in found.items()}
    return walls, {name: [cpu for _, cpu in values] for name, values in found.items()}


async def scenario(args: Any) -> None:
    rounds = 3 if args.quick else args.rounds or 15
    directory = str(args.databases.folder)
    url = await args.databases.url("sqlite")
    python = sys.executable
    _run(([python, "-m", "jobrun", "db", "upgrade", "--url", url], {}), directory)
    cases = _with_baseline(_cases(url), args.baseline_tree or None)
    names = list(cases)
    samples, cpu = await _samples(cases, directory, rounds)
    heavy = {name: _heavy_imports(cases[name], directory) for name in names}
    base = statistics.median(samples["import sqlalchemy.ext.asyncio"])
    bare = statistics.median(samples["python -c pass"])
    base_cpu = statistics.median(cpu["import sqlalchemy.ext.asyncio"])
    rows = [
        {
            "case": name,
            "median_ms": round(statistics.median(samples[name]), 1),
            "min_ms": round(min(samples[name]), 1),
            "vs_sqlalchemy_import": round(statistics.median(samples[name]) / base, 2),
            "vs_bare_python": round(statistics.median(samples[name]) / bare, 1),
            "cpu_median_ms": round(statistics.median(cpu[name]), 1),
            "cpu_vs_sqlalchemy_import": round(statistics.median(cpu[name]) / base_cpu, 2),
            "imports": heavy[name],
        }
        for name in names
    ]
    report = {"rounds": rounds, "load_average": harness.load(), "results": rows}
    harness.save(args, report)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print_table(report)


def print_table(report: dict[str, Any]) -> None:
    print(f"{report['rounds']} rounds, load average {report['load_average'][0]:.1f}")
    print(
        f"{'case':43} {'median ms':>10} {'min ms':>8} {'x sqla':>7} {'x pass':>7} "
        f"{'cpu ms':>7} {'cpu x sqla':>10}  imports"
    )
    for row in report["results"]:
        print(
            f"{row['case']:43} {row['median_ms']:>10} {row['min_ms']:>8} "
            f"{row['vs_sqlalchemy_import']:>7} {row['vs_bare_python']:>7} "
            f"{row['cpu_median_ms']:>7} {row['cpu_vs_sqlalchemy_import']:>10}  {row['imports']}"
        )


if __name__ == "__main__":
    harness.run(scenario, json=False, baseline_tree="")
