"""Tables on the terminal, and the results file with what the machine was doing."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any


def load() -> list[float]:
    """The load average (1, 5 and 15 minutes)."""
    return [round(value, 2) for value in os.getloadavg()]


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
        "load_1min": load()[0],
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


def shown(found: dict[str, float], digits: int = 3, unit: str = "") -> str:
    """``median [q1–q3]``: a figure and its interquartile range, for a table cell."""
    return f"{found['median']:.{digits}f}{unit} [{found['q1']:.{digits}f}–{found['q3']:.{digits}f}]"


def table(title: str, header: list[str], rows: list[list[Any]]) -> str:
    """Print (and return) a Markdown table."""
    lines = [f"\n{title}", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    text = "\n".join(lines)
    print(text)
    return text


def save(args: argparse.Namespace, results: dict[str, Any]) -> Path:
    """``<out-dir>/<scenario>-<UTC time>[-quick].json``: the results with the command
    line, the machine, the load when the run began and now, and the databases it made."""
    args.out_dir.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
    path = args.out_dir / f"{args.scenario}-{stamp}{'-quick' if args.quick else ''}.json"
    meta = {
        "scenario": args.scenario,
        "command": " ".join(["python -m benchmarks", args.scenario, *sys.argv[1:]]),
        "machine": machine(),
        "load_at_start": getattr(args, "load_at_start", None),
        "load_at_end": load(),
    }
    databases = getattr(args, "databases", None)
    if databases is not None:
        meta["postgres_databases"] = list(databases.postgres_names)
    path.write_text(json.dumps({"meta": meta, **results}, indent=2, default=str))
    # On stderr: a scenario's stdout may be JSON for another program (``imports --json``).
    print(f"\nresults: {path}", file=sys.stderr)
    return path
