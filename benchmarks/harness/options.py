"""The command line every scenario shares, and where its results go."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
DEFAULT_POSTGRES = "postgresql+asyncpg://postgres@127.0.0.1:5432/postgres"
RESULTS_VARIABLE = "JOBRUN_BENCH_RESULTS"
# Ignored by git (.gitignore), so results never land in a commit by accident.
DEFAULT_RESULTS = REPO / "benchmarks" / "results"


def scenario_name() -> str:
    """The running scenario's short name (``step`` for ``benchmarks.scenarios.step``)."""
    main = sys.modules["__main__"]
    spec = getattr(main, "__spec__", None)
    full = spec.name if spec is not None else Path(sys.argv[0]).stem
    return str(full).rsplit(".", 1)[-1]


def options(description: str, **extra: Any) -> argparse.Namespace:
    """The common options, and ``extra`` ones (``name=default``: the type is the
    default's, a bool is a flag). ``args.scenario`` is the scenario's name;
    :func:`benchmarks.harness.main` adds ``args.databases``."""
    name = scenario_name()
    parser = argparse.ArgumentParser(
        prog=f"python -m benchmarks {name}",
        description=description,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--quick", action="store_true", help="smoke sizes (seconds)")
    parser.add_argument("--sqlite-only", action="store_true")
    parser.add_argument(
        "--postgres-url",
        default=DEFAULT_POSTGRES,
        help="the Postgres server: every database a scenario uses is made on it with a "
        "name of its own and dropped at the end (this URL's database is only connected to)",
    )
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--profile", action="store_true", help="print a cProfile summary")
    parser.add_argument(
        "--out-dir",
        type=Path,
        default=Path(os.environ.get(RESULTS_VARIABLE) or DEFAULT_RESULTS),
        help=f"where the results go (${RESULTS_VARIABLE}, else benchmarks/results/, "
        "ignored by git)",
    )
    parser.add_argument(
        "--loop",
        choices=["asyncio", "uvloop"],
        default="asyncio",
        help="the event loop everything runs on (uvloop: the speed extra)",
    )
    for option, default in extra.items():
        flag = f"--{option.replace('_', '-')}"
        if isinstance(default, bool):
            parser.add_argument(flag, action="store_true")
        else:
            parser.add_argument(flag, type=type(default), default=default)
    args = parser.parse_args()
    args.scenario = name
    return args


def backends(args: argparse.Namespace) -> list[str]:
    return ["sqlite"] if args.sqlite_only else ["sqlite", "postgres"]


def child_environment(**extra: str) -> dict[str, str]:
    """This environment for a child process, with the checkout first on its path (so
    ``benchmarks``, ``tests`` and ``jobrun`` import from anywhere), after
    ``JOBRUN_BENCH_CODE`` when set (that checkout's ``jobrun``, as in this process)."""
    environment = {**os.environ, "PYTHONUNBUFFERED": "1", **extra}
    code = environment.get("JOBRUN_BENCH_CODE")
    environment["PYTHONPATH"] = os.pathsep.join([*([code] if code else []), str(REPO)])
    return environment
