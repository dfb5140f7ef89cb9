"""The chaos runner (issue 21): inject faults into real drivers and let a referee count the damage.

Each scenario runs three driver processes (``tests/processes/chaos_child.py``)
over three runs whose steps sleep 100 or 200 ms, with a 3 s lease so that a
scenario takes seconds, and strikes once (see ``tests/chaos/``). The step
bodies log their own start and end; afterwards the referee counts overlapping
bodies of one run, finished bodies run again, runs not done, and the seconds
from the fault to the affected run's next body.

    make chaos                                 # every scenario (needs root for tmpfs)
    .venv/bin/python -m tests.chaos --quick    # the bounded set CI runs
    .venv/bin/python -m tests.chaos --only 'kill -9'

The table is printed and written to ``chaos-results.md`` and
``chaos-results.json`` in the repository root (ignored by git).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import tempfile
import time
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path

from tests.chaos.faults import all_scenarios
from tests.chaos.stage import BODY_MS, LEASE_MS, REPO, Outcome, run_scenario

DEFAULT_POSTGRES = "postgresql+asyncpg://postgres@127.0.0.1:5432/postgres"
COLUMNS = (
    "scenario",
    "backend",
    "overlaps",
    "repeated",
    "acknowledged steps run again",
    "lost",
    "s to resume",
    "note",
)


def row_of(outcome: Outcome) -> list[str]:
    verdict = outcome.verdict
    overlaps = str(verdict.overlaps)
    if verdict.overlaps:
        overlaps += f" (longest {verdict.longest_overlap_ms:.0f} ms)"
    notes = list(outcome.notes)
    if verdict.resumed_tails:
        notes.insert(
            0,
            f"{verdict.resumed_tails} resumed tail(s) of a paused body, "
            f"longest {verdict.longest_tail_ms:.1f} ms",
        )
    if outcome.failed:
        notes.insert(0, f"{outcome.failed} run(s) FAILED")
    if outcome.error:
        notes.insert(0, f"scenario error: {outcome.error}")
    resume = "-" if verdict.resume_s is None else f"{verdict.resume_s:.2f}"
    lost = f"{outcome.lost} of {outcome.runs}" if outcome.runs else "?"
    repeats = [str(verdict.repeated), str(verdict.acknowledged_repeats)]
    cells = [outcome.scenario, outcome.backend, overlaps, *repeats, lost, resume]
    return [*cells, " ".join("; ".join(notes).replace("|", "/").split())]


def table(outcomes: list[Outcome]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + " --- |" * len(COLUMNS)]
    lines += ["| " + " | ".join(row_of(outcome)) + " |" for outcome in outcomes]
    return "\n".join(lines)


def header(started_at: datetime) -> str:
    commit = subprocess.run(
        ["git", "-C", str(REPO), "describe", "--always", "--dirty"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    return (
        f"Chaos run of {started_at:%Y-%m-%d %H:%M} UTC on commit {commit or '?'}: "
        f"lease_ms={LEASE_MS} (short, so that a scenario takes seconds); 3 drivers, "
        f"2 runs of 6 passes (12 under idle_session_timeout, Postgres disk full and the "
        f"split brain, 8 under failover; the split brain's lease 15 s) "
        f"of 3 steps each, one claim a run; bodies of {BODY_MS} or {2 * BODY_MS} ms."
    )


async def run_all(arguments: argparse.Namespace) -> list[Outcome]:
    chosen = [
        (fault, backend)
        for fault, backend in all_scenarios()
        if (fault.quick or not arguments.quick)
        and (not arguments.only or arguments.only.lower() in f"{fault.name} {backend}".lower())
    ]
    outcomes = []
    with tempfile.TemporaryDirectory(prefix="jobrun-chaos-") as scratch:
        for index, (fault, backend) in enumerate(chosen):
            began = time.monotonic()
            workdir = Path(scratch) / f"s{index}"
            outcome = await run_scenario(fault, backend, arguments.postgres_url, workdir)
            outcomes.append(outcome)
            print(f"[{time.monotonic() - began:5.1f} s] " + " | ".join(row_of(outcome)), flush=True)
    return outcomes


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m tests.chaos", description=__doc__.splitlines()[0] if __doc__ else None
    )
    parser.add_argument("--quick", action="store_true", help="the bounded set (no tmpfs, cluster)")
    parser.add_argument("--only", default="", help="scenarios whose 'name backend' contains this")
    parser.add_argument("--postgres-url", default=DEFAULT_POSTGRES)
    parser.add_argument("--out", type=Path, default=REPO / "chaos-results")
    arguments = parser.parse_args()
    started_at = datetime.now(UTC)
    outcomes = asyncio.run(run_all(arguments))
    text = f"{header(started_at)}\n\n{table(outcomes)}\n"
    print("\n" + text)
    arguments.out.with_suffix(".md").write_text(text)
    records = [asdict(outcome) for outcome in outcomes]
    arguments.out.with_suffix(".json").write_text(json.dumps(records, indent=1) + "\n")


if __name__ == "__main__":
    main()
