"""The many-drivers benchmark still runs (a tiny SQLite pass, two driver processes)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_bench_scale_quick_sqlite(tmp_path: Path) -> None:
    out = tmp_path / "scale.json"
    completed = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "bench_scale.py"),
            "--quick",
            "--modes",
            "io",
            "--drivers",
            "1,2",
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
    assert {"meta", "summary", "drains", "takeover", "all_correct"} <= set(results)
    assert results["all_correct"] is True
    assert {"command", "nproc", "loadavg_start", "loadavg_end"} <= set(results["meta"])
    drains = results["drains"]
    assert [(item["backend"], item["drivers"]) for item in drains] == [("sqlite", 1), ("sqlite", 2)]
    for item in drains:
        assert item["passes_per_s"] > 0
        assert item["correctness"]["exactly_once"] is True
        assert item["correctness"]["superseded"] == 0
        assert sum(item["claims_per_driver"]) == item["runs"] * item["passes"]
    assert drains[0]["speedup"] == 1.0
