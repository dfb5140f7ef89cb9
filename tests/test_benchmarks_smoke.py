"""The core benchmark still runs (a quick SQLite-only pass), so it cannot rot unnoticed."""

from __future__ import annotations

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
