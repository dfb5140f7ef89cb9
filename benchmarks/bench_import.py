"""What it costs to start: ``import jobrun`` and the CLI, next to SQLAlchemy's own import.

Run on demand from the repository root (not part of the test suite)::

    .venv/bin/python benchmarks/bench_import.py            # 15 rounds
    .venv/bin/python benchmarks/bench_import.py --rounds 5 --json
    # the same cases for another checkout too (e.g. `git archive main | tar -x -C /tmp/base`)
    .venv/bin/python benchmarks/bench_import.py --baseline-tree /tmp/base

Each case is a fresh interpreter (``subprocess``), timed from spawn to exit.
The cases run interleaved, one sample of each per round and in a rotated order
each round, so a noisy neighbour spreads over all of them alike; medians and
minimums are reported, and ratios are only taken between numbers of this run.
The goal: ``import jobrun`` and ``jobrun --help`` cost well under what
``import sqlalchemy.ext.asyncio`` costs (they load no SQLAlchemy), and a CLI
command that does not migrate does not import Alembic.
Self-contained on purpose (no shared benchmark helpers).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


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
    began, used = time.perf_counter(), _children_cpu_s()
    _run(case, cwd)
    return (time.perf_counter() - began) * 1000, (_children_cpu_s() - used) * 1000


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _heavy_imports(case: Case, cwd: str) -> str:
    """Which of SQLAlchemy and Alembic the command imports (``-X importtime`` lists them all)."""
    command, extra = case
    done = _run(([command[0], "-X", "importtime", *command[1:]], extra), cwd, capture=True)
    modules = {line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines()}
    return ",".join(name for name in ("sqlalchemy", "alembic") if name in modules) or "-"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument(
        "--baseline-tree", metavar="DIR", help="another checkout to time the same cases on"
    )
    options = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        url = f"sqlite+aiosqlite:///{Path(directory) / 'bench.db'}"
        python = sys.executable
        _run(([python, "-m", "jobrun", "db", "upgrade", "--url", url], {}), directory)
        cases = _with_baseline(_cases(url), options.baseline_tree)
        names = list(cases)
        samples: dict[str, list[float]] = {name: [] for name in names}
        cpu: dict[str, list[float]] = {name: [] for name in names}
        for round_number in range(options.rounds):
            shift = round_number % len(names)
            for name in names[shift:] + names[:shift]:
                wall_ms, cpu_ms = _time_ms(cases[name], directory)
                samples[name].append(wall_ms)
                cpu[name].append(cpu_ms)
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
    report = {
        "command": " ".join(sys.argv),
        "rounds": options.rounds,
        "load_average": os.getloadavg(),
        "results": rows,
    }
    if options.json:
        print(json.dumps(report, indent=2))
        return
    print(f"{options.rounds} rounds, load average {report['load_average'][0]:.1f}")
    print(
        f"{'case':43} {'median ms':>10} {'min ms':>8} {'x sqla':>7} {'x pass':>7} "
        f"{'cpu ms':>7} {'cpu x sqla':>10}  imports"
    )
    for row in rows:
        print(
            f"{row['case']:43} {row['median_ms']:>10} {row['min_ms']:>8} "
            f"{row['vs_sqlalchemy_import']:>7} {row['vs_bare_python']:>7} "
            f"{row['cpu_median_ms']:>7} {row['cpu_vs_sqlalchemy_import']:>10}  {row['imports']}"
        )


if __name__ == "__main__":
    main()
