"""The benchmarks still run (quick, SQLite-only; the Postgres-only ones on a fresh
Postgres database), so they cannot rot unnoticed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support import REPO


def run_quick(
    script: str,
    tmp_path: Path,
    *extra: str,
    postgres_url: str | None = None,
    sqlite_only: bool = True,
    timeout_s: float = 100,
) -> dict[str, Any]:
    """``script --quick``: SQLite only, unless given a Postgres database of its own
    (``postgres_url``) or told otherwise (``sqlite_only=False``: the script's default)."""
    where = ["--postgres-url", postgres_url] if postgres_url is not None else []
    if postgres_url is None and sqlite_only:
        where = ["--sqlite-only"]
    command = [sys.executable, str(REPO / "benchmarks" / script), "--quick", *where]
    completed = subprocess.run(
        [*command, "--out-dir", str(tmp_path), *extra],
        cwd=REPO / "benchmarks",
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    assert completed.returncode == 0, completed.stdout + completed.stderr
    [found] = tmp_path.glob("*-quick.json")
    results: dict[str, Any] = json.loads(found.read_text())
    assert script in str(results["meta"])
    return results


def test_bench_step(tmp_path: Path) -> None:
    sqlite = run_quick("bench_step.py", tmp_path)["sqlite"]
    assert isinstance(sqlite, dict)
    variants = {"raw driver", "raw driver + fence", "SQLAlchemy floor", "jobrun step"}
    assert variants <= set(sqlite)
    assert all(sqlite[name] > 0 for name in variants)
    # Each figure with its spread; the step against the raw driver with and without the fence.
    spreads, ratios = sqlite["spread"], sqlite["ratios"]
    assert isinstance(spreads, dict)
    assert isinstance(ratios, dict)
    assert set(spreads) == variants
    assert {"jobrun step / raw driver", "jobrun step / raw driver + fence"} <= set(ratios)
    for found in [*spreads.values(), *ratios.values(), sqlite["python"]]:
        assert 0 < found["min"] <= found["q1"] <= found["median"] <= found["q3"] <= found["max"]
    paired = sqlite["paired"]
    assert isinstance(paired, dict)
    # Each step next to one raw upsert: both sides timed, wall and loop CPU.
    assert {"raw median", "jobrun median", "raw loop cpu", "jobrun loop cpu"} <= set(paired)
    assert all(value > 0 for value in paired.values())


def test_bench_throughput(tmp_path: Path) -> None:
    results = run_quick("bench_throughput.py", tmp_path)
    found = results["sqlite-1"]
    assert isinstance(found, dict)
    variants = {"driver floor", "driver floor + fence", "jobrun steps", "jobrun passes"}
    assert set(found["spread"]) == variants
    assert all(found[name] > 0 for name in variants)
    assert all(found["cpu_us_per_step"][name] > 0 for name in variants)
    assert found["ratios"]["driver floor / jobrun steps"]["median"] > 0
    assert found["ratios"]["driver floor + fence / jobrun steps"]["median"] > 0


@pytest.mark.parametrize("page", ["7"])
def test_bench_walk(tmp_path: Path, page: str) -> None:
    walk = run_quick("bench_walk.py", tmp_path, "--page", page)["sqlite"]
    assert isinstance(walk, dict)
    assert walk["largest_ledger_rows"] <= int(page)
    assert walk["objects_per_s"] > 0


def test_bench_map(tmp_path: Path) -> None:
    sqlite = run_quick("bench_map.py", tmp_path)["sqlite"]
    assert isinstance(sqlite, dict)
    assert {"one at a time", "p.map, concurrency=32", "speed-up"} == set(sqlite)
    assert all(value > 0 for value in sqlite.values())


def test_bench_many_databases(tmp_path: Path) -> None:
    # --quick: 50 SQLite files (and, with Postgres, 3 databases); here SQLite only.
    results = run_quick("bench_many_databases.py", tmp_path)
    assert isinstance(results["first_drive_s"], float)
    assert results["sizes"] == {"sqlite": 50, "postgres": 0, "starts": 10}
    pickups = results["pickup_sqlite"]
    assert isinstance(pickups, dict)
    assert pickups["picked"] == pickups["asked"] == 10
    assert isinstance(results["threads"], int)


@pytest.mark.postgres
def test_bench_many_databases_with_postgres(tmp_path: Path) -> None:
    # The CI's small version: 50 SQLite files and 3 Postgres databases.
    results = run_quick("bench_many_databases.py", tmp_path, sqlite_only=False, timeout_s=150)
    assert results["sizes"] == {"sqlite": 50, "postgres": 3, "starts": 10}
    for dialect in ("sqlite", "postgres"):
        assert results[f"pickup_{dialect}"]["picked"] == 5
    assert isinstance(results["postgres_connections_idle"], int)


def test_bench_external_walk(tmp_path: Path) -> None:
    sqlite = run_quick("bench_external_walk.py", tmp_path)["sqlite"]
    assert isinstance(sqlite, dict)
    assert set(sqlite) == {"polite", "kill", "unlimited", "token"}
    for walked in (sqlite["polite"], sqlite["kill"]):
        # Every object fetched and written, none written twice; the speed and the
        # refusals depend on the machine's load, so they are the benchmark's to report.
        assert (walked["objects_fetched"], walked["objects_written"]) == (150, 150)
        assert walked["objects_counted"] == 150
        assert walked["written_twice"] == 0
    assert sqlite["kill"]["fetched_twice"] <= sqlite["kill"]["killed_in_flight_at_most"]
    assert sqlite["unlimited"]["speed-up"] > 0
    assert sqlite["unlimited"]["requests alone, 32 at once"] > 0
    assert sqlite["token"]["step + token"] > 0


def test_bench_compare(tmp_path: Path) -> None:
    """jobrun always; DBOS and Celery too where the `bench` extra is installed."""
    sqlite = run_quick("bench_compare.py", tmp_path)["sqlite"]
    assert isinstance(sqlite, dict)
    assert sqlite["units"] == 20
    assert sqlite["jobrun"] > 0
    assert all(value > 0 for value in sqlite.values())


def test_bench_compare_resume(tmp_path: Path) -> None:
    results = run_quick("bench_compare_resume.py", tmp_path)
    jobrun = results["sqlite-jobrun"]
    assert isinstance(jobrun, dict)
    assert jobrun["done before the kill"] >= 20
    # At least once: only the body in flight at the kill may run again.
    assert jobrun["bodies run twice"] <= 1
    assert 0 < jobrun["first new body, s"] <= jobrun["done, s"]


@pytest.mark.postgres
def test_bench_postgres_ceiling(tmp_path: Path, empty_postgres_url: str) -> None:
    results = run_quick("bench_postgres_ceiling.py", tmp_path, postgres_url=empty_postgres_url)
    points = results["points"]
    assert isinstance(points, dict)
    assert set(points) == {"steps-1", "steps-2", "passes-1", "passes-2"}
    for point in points.values():
        assert point["passes"] > 0
        assert point["not_committed"] == 0  # every pass claimed, stepped and committed
        assert point["steps_per_s"] >= point["passes_per_s"] > 0
        assert point["wal_bytes_per_pass"] > 0
        assert point["driver_cpu_us_per_pass"] > 0
        # The server's CPU is read from /proc only when it runs on this host.
        backend = point["backend_cpu_us_per_pass"]
        assert backend is None or backend >= 0


@pytest.mark.postgres
def test_bench_passes(tmp_path: Path, empty_postgres_url: str) -> None:
    # The script makes (and drops) a database of its own on the server of the URL given.
    results = run_quick("bench_passes.py", tmp_path, postgres_url=empty_postgres_url)
    points = results["1 steps"]
    assert set(points) == {"1 (1x1)", "2 (1x2)"}
    for point in points.values():
        assert point["floor"]["passes_per_s"]["median"] > 0
        assert point["jobrun"]["passes_per_s"]["median"] > 0
        # One claim statement per pass (and per claim that found nothing due).
        assert 1.0 <= point["jobrun"]["claims_per_pass"]["median"] < 1.5
