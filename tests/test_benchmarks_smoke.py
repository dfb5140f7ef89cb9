"""The benchmarks still run (quick, SQLite-only passes), so they cannot rot unnoticed."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_bench_core_quick_sqlite_only(tmp_path: Path) -> None:
    out = tmp_path / "core.json"
    completed = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "bench_core.py"),
            "--quick",
            "--sqlite-only",
            "--k",
            "5",
            "--passes",
            "5",
            "--floor-n",
            "3",
            "--out",
            str(out),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert completed.returncode == 0, completed.stdout + completed.stderr
    results = json.loads(out.read_text())
    assert set(results) == {"meta", "backends"}
    assert set(results["backends"]) == {"sqlite"}
    sqlite = results["backends"]["sqlite"]
    assert {"floors", "steps", "replay", "passes", "counts"} <= set(sqlite)
    assert sqlite["floors"]["floor_1row_ms"] > 0
    assert sqlite["steps"]["5"]["ms_per_step"] > 0
    assert sqlite["replay"]["5"]["ms_per_memo_hit"] > 0
    assert sqlite["passes"]["passes_per_s"] > 0
    assert {"statements", "round_trips"} <= set(sqlite["counts"]["summary"])
    # The direct SQLite step write is counted too: one statement per new step.
    assert sqlite["counts"]["summary"]["statements"]["per_new_step"] == 1


def _quick(tmp_path: Path, *commands: str) -> dict[str, dict[str, object]]:
    results: dict[str, dict[str, object]] = {}
    for command in commands:
        completed = subprocess.run(
            [
                sys.executable,
                str(ROOT / "benchmarks" / "bench_jobrun.py"),
                command,
                "--quick",
                "--sqlite-only",
                "--out-dir",
                str(tmp_path),
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=90,
            check=False,
        )
        assert completed.returncode == 0, completed.stdout + completed.stderr
        found = list(tmp_path.glob(f"{command}-*-quick.json"))
        if command == "vs-dbos" and importlib.util.find_spec("dbos") is None:
            assert not found
            continue
        assert len(found) == 1, found
        results[command] = json.loads(found[0].read_text())
        assert "bench_jobrun.py" in results[command]["meta"]["command"]  # type: ignore[index]
    return results


def test_bench_jobrun_quick_sqlite_only(tmp_path: Path) -> None:
    results: dict[str, dict[str, object]] = _quick(
        tmp_path, "passes", "start", "drive", "resume", "idle", "vs-dbos"
    )
    walk = results["passes"]["walks"][0]  # type: ignore[index]
    assert walk["largest_ledger_rows"] <= walk["steps_per_pass"]
    assert results["passes"]["commits"]["sqlite"]["pass_commits_per_s"] > 0  # type: ignore[index]
    start = results["start"]["backends"]["sqlite"]  # type: ignore[index]
    assert start["race_one_run_per_key"] is True
    drive = results["drive"]["backends"]["sqlite"]  # type: ignore[index]
    assert drive["claim_ms_history"] > 0
    assert drive["plan_history"]
    resume = results["resume"]["backends"]["sqlite"]  # type: ignore[index]
    assert resume["fail"]["ratio"] > 0
    assert results["idle"]["backends"]["sqlite"]["statements"] == 0  # type: ignore[index]
    if "vs-dbos" in results:
        steps = results["vs-dbos"]["steps"]["sqlite"]  # type: ignore[index]
        assert next(iter(steps.values()))["dbos_over_jobrun"] > 0
