"""Resuming after kill -9: jobrun next to DBOS Transact, one run of N steps.

Per system and dialect: a child process drives one run (jobrun: one pass of N
steps; DBOS: one workflow of N ``@DBOS.step`` calls with a fixed workflow id),
each step's body waiting ``--body-ms`` and then appending its index and the time
to a log file. When half the bodies have run, the parent kills the child with
SIGKILL and starts a new one at once, which drives the same run again (jobrun
joins the live run and takes it over from the dead holder; DBOS recovers its
pending workflows in ``DBOS.launch()``); the children are
``benchmarks/processes/resume_child.py``. Reported, from the log:

* ``first new body, s``: from the new process being ready (imports done, no
  database touched yet) to the first body of a step the killed process had not
  finished;
* ``done, s``: from ready to the run's end (the remaining half included);
* ``bodies run twice``: steps whose body finished in the killed process and ran
  again in the new one: the kill fell between a body's end and the record of
  its result (a body cut short by the kill logged nothing and is not counted).

Procrastinate and Celery are not in it: a task is not resumed part way, and a
task a killed worker held is left to other mechanisms (see
docs/explanation/comparison.md). Needs the ``bench`` extra for DBOS.
"""

from __future__ import annotations

import importlib.util
import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks import harness


async def fresh_url(databases: harness.Databases, system: str, backend: str) -> str:
    """A new, empty database for one measurement, as the child's URL."""
    if backend == "sqlite":
        path = databases.sqlite_path(f"resume-{system}")
        return f"sqlite+aiosqlite:///{path}" if system == "jobrun" else f"sqlite:///{path}"
    return await databases.postgres_url(
        "postgresql+asyncpg" if system == "jobrun" else "postgresql"
    )


def spawn(system: str, url: str, log: Path, n: int, body_ms: float, first: bool) -> Any:
    command = [sys.executable, "-m", "benchmarks.processes.resume_child", "--child", system]
    command += ["--url", url, "--log", str(log), "--n", str(n), "--body-ms", str(body_ms)]
    command += ["--first"] * first
    return subprocess.Popen(
        command, stdout=subprocess.PIPE, text=True, env=harness.child_environment()
    )


def logged(log: Path) -> list[tuple[int, int, float]]:
    if not log.exists():
        return []
    rows = [line.split() for line in log.read_text().splitlines() if line.strip()]
    return [(int(pid), int(index), float(at)) for pid, index, at in rows]


def measure(system: str, url: str, log: Path, args: Any) -> dict[str, Any]:
    n = 40 if args.quick else args.n
    first = spawn(system, url, log, n, args.body_ms, first=True)
    deadline = time.monotonic() + 600
    while len(logged(log)) < n // 2:
        assert first.poll() is None, "the first child ended early"
        assert time.monotonic() < deadline, "the first child took too long"
        time.sleep(0.002)  # poll for the child's readiness line; bounds nothing
    first.send_signal(signal.SIGKILL)
    first.wait()
    killed_pid, before = first.pid, {index for _pid, index, _at in logged(log)}
    second = spawn(system, url, log, n, args.body_ms, first=False)
    lines = [json.loads(line) for line in second.communicate(timeout=600)[0].splitlines()]
    assert second.returncode == 0, lines
    ready_at = next(line["ready_at"] for line in lines if "ready_at" in line)
    done_at = next(line["done_at"] for line in lines if "done_at" in line)
    rows = logged(log)
    new = [at for pid, index, at in rows if pid == second.pid and index not in before]
    twice = {index for pid, index, _at in rows if pid == second.pid} & before
    assert {index for _pid, index, _at in rows} == set(range(n)), "a step never ran"
    assert killed_pid != second.pid
    return {
        "steps": n,
        "done before the kill": len(before),
        "first new body, s": round(min(new) - ready_at, 3),
        "done, s": round(done_at - ready_at, 3),
        "bodies run twice": len(twice),
    }


async def scenario(args: Any) -> None:
    systems = ["jobrun"] + ["dbos"] * (importlib.util.find_spec("dbos") is not None)
    results: dict[str, Any] = {}
    rows = []
    for backend in harness.backends(args):
        for system in systems:
            url = await fresh_url(args.databases, system, backend)
            log = args.databases.folder / f"bodies-{backend}-{system}.log"
            found = measure(system, url, log, args)
            results[f"{backend}-{system}"] = found
            rows.append([backend, system, *found.values()])
    harness.table(
        f"kill -9 at half way, then restart (body {args.body_ms} ms)",
        ["", "", "steps", "done before kill", "first new body, s", "done, s", "run twice"],
        rows,
    )
    harness.save(args, results)


if __name__ == "__main__":
    harness.run(scenario, n=1000, body_ms=2.0)
