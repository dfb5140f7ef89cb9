"""The benchmarks still run (quick, SQLite-only; the Postgres-only ones on the test
server, in databases of their own), so they cannot rot unnoticed; and every database
a scenario makes is dropped."""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from tests.support import REPO

POSTGRES_URL = os.environ.get("JOBRUN_TEST_POSTGRES_URL", "")
# The scenarios that start many processes (each passes sample spawns its drivers;
# the walks spawn a server and drivers): 77-82 s each at load 10 on 2 cores.
SLOW_S = 200


def run_quick(
    scenario: str,
    tmp_path: Path,
    *extra: str,
    postgres_url: str | None = None,
    sqlite_only: bool = True,
    timeout_s: float = 100,
) -> dict[str, Any]:
    """``python -m benchmarks SCENARIO --quick``: SQLite only, unless given a Postgres
    server (``postgres_url``) or told otherwise (``sqlite_only=False``: the test server)."""
    where = ["--postgres-url", postgres_url] if postgres_url is not None else []
    if postgres_url is None:
        where = ["--sqlite-only"] if sqlite_only else ["--postgres-url", POSTGRES_URL]
    command = [sys.executable, "-m", "benchmarks", scenario, "--quick", *where]
    completed = subprocess.run(
        [*command, "--out-dir", str(tmp_path), *extra],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    assert completed.returncode == 0, completed.stdout + completed.stderr
    [found] = tmp_path.glob("*-quick.json")
    assert found.name.startswith(f"{scenario}-")
    results: dict[str, Any] = json.loads(found.read_text())
    assert results["meta"]["scenario"] == scenario
    return results


@pytest.mark.parametrize(
    "backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)
def test_step(tmp_path: Path, backend: str) -> None:
    # Postgres too: its Python-only measurement answers the step write itself, and
    # must say what the store expects (the run's pause) or the pass ends paused.
    found = run_quick("step", tmp_path, sqlite_only=backend == "sqlite")[backend]
    assert isinstance(found, dict)
    variants = {"raw driver", "raw driver + fence", "SQLAlchemy floor", "jobrun step"}
    variants |= {"jobrun whole pass"}
    assert variants <= set(found)
    assert all(found[name] > 0 for name in variants)
    # Each figure with its spread; the step against the raw driver with and without the fence.
    spreads, ratios = found["spread"], found["ratios"]
    assert isinstance(spreads, dict)
    assert isinstance(ratios, dict)
    assert variants <= set(spreads)
    wanted = {"jobrun step / raw driver", "jobrun step / raw driver + fence"}
    assert wanted | {"jobrun whole pass / raw driver"} <= set(ratios)
    for spread in [*spreads.values(), *ratios.values(), found["python"]]:
        assert (
            0 < spread["min"] <= spread["q1"] <= spread["median"] <= spread["q3"] <= spread["max"]
        )
    paired = found["paired"]
    assert isinstance(paired, dict)
    # Each step next to one raw upsert: both sides timed, wall and loop CPU.
    assert {"raw median", "jobrun median", "raw loop cpu", "jobrun loop cpu"} <= set(paired)
    assert all(value > 0 for value in paired.values())


def test_throughput(tmp_path: Path) -> None:
    results = run_quick("throughput", tmp_path)
    found = results["sqlite-1"]
    assert isinstance(found, dict)
    variants = {"driver floor", "driver floor + fence", "jobrun steps", "jobrun passes"}
    assert set(found["spread"]) == variants
    assert all(found[name] > 0 for name in variants)
    assert all(found["cpu_us_per_step"][name] > 0 for name in variants)
    assert found["ratios"]["driver floor / jobrun steps"]["median"] > 0
    assert found["ratios"]["driver floor + fence / jobrun steps"]["median"] > 0


@pytest.mark.parametrize("page", ["7"])
def test_walk(tmp_path: Path, page: str) -> None:
    walk = run_quick("walk", tmp_path, "--page", page)["sqlite"]
    assert isinstance(walk, dict)
    assert walk["largest_ledger_rows"] <= int(page)
    assert walk["objects_per_s"] > 0


def test_map(tmp_path: Path) -> None:
    sqlite = run_quick("map", tmp_path)["sqlite"]
    assert isinstance(sqlite, dict)
    assert {"one at a time", "p.map, concurrency=32", "speed-up"} == set(sqlite)
    assert all(value > 0 for value in sqlite.values())


def test_many_databases(tmp_path: Path) -> None:
    # --quick: 50 SQLite files (and, with Postgres, 3 databases); here SQLite only.
    results = run_quick("many_databases", tmp_path)
    assert isinstance(results["first_drive_s"], float)
    assert results["sizes"] == {"sqlite": 50, "postgres": 0, "starts": 10}
    pickups = results["pickup_sqlite"]
    assert isinstance(pickups, dict)
    assert pickups["picked"] == pickups["asked"] == 10
    assert isinstance(results["threads"], int)


@pytest.mark.postgres
@pytest.mark.timeout(SLOW_S + 20)
def test_many_databases_with_postgres(tmp_path: Path) -> None:
    # The CI's small version: 50 SQLite files and 3 Postgres databases.
    results = run_quick("many_databases", tmp_path, sqlite_only=False, timeout_s=SLOW_S)
    assert results["sizes"] == {"sqlite": 50, "postgres": 3, "starts": 10}
    for dialect in ("sqlite", "postgres"):
        assert results[f"pickup_{dialect}"]["picked"] == 5
    assert isinstance(results["postgres_connections_idle"], int)


@pytest.mark.timeout(SLOW_S + 20)
def test_external_walk(tmp_path: Path) -> None:
    sqlite = run_quick("external_walk", tmp_path, timeout_s=SLOW_S)["sqlite"]
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


def test_compare(tmp_path: Path) -> None:
    """jobrun always; DBOS and Celery too where the `bench` extra is installed."""
    sqlite = run_quick("compare", tmp_path)["sqlite"]
    assert isinstance(sqlite, dict)
    assert sqlite["units"] == 20
    assert sqlite["jobrun"] > 0
    assert all(value > 0 for value in sqlite.values())


def test_compare_resume(tmp_path: Path) -> None:
    results = run_quick("compare_resume", tmp_path)
    jobrun = results["sqlite-jobrun"]
    assert isinstance(jobrun, dict)
    assert jobrun["done before the kill"] >= 20
    # At least once: only the body in flight at the kill may run again.
    assert jobrun["bodies run twice"] <= 1
    assert 0 < jobrun["first new body, s"] <= jobrun["done, s"]


@pytest.mark.postgres
def test_postgres_ceiling(tmp_path: Path) -> None:
    results = run_quick("postgres_ceiling", tmp_path, sqlite_only=False)
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
@pytest.mark.timeout(SLOW_S + 20)
def test_passes(tmp_path: Path) -> None:
    # The scenario makes (and drops) a database of its own on the server of the URL given.
    results = run_quick("passes", tmp_path, sqlite_only=False, timeout_s=SLOW_S)
    points = results["1 steps"]
    assert set(points) == {"1 (1x1)", "2 (1x2)"}
    for point in points.values():
        assert point["floor"]["passes_per_s"]["median"] > 0
        assert point["jobrun"]["passes_per_s"]["median"] > 0
        # One claim statement per pass (and per claim that found nothing due).
        assert 1.0 <= point["jobrun"]["claims_per_pass"]["median"] < 1.5


def test_console_indexes(tmp_path: Path) -> None:
    sqlite = run_quick("console_indexes", tmp_path)["sqlite"]
    kinds = {
        f"{part}_us_{variant}" for part in ("start", "finish") for variant in ("with", "without")
    }
    assert set(sqlite) == kinds
    assert all(value > 0 for value in sqlite.values())


def test_starts(tmp_path: Path) -> None:
    results = run_quick("starts", tmp_path)
    for variant in ("single", "batch"):
        assert results[f"sqlite/{variant}"]["median"] > 0


def test_registration_write(tmp_path: Path) -> None:
    results = run_quick("registration_write", tmp_path)
    assert results["engine"]["median"] > 0
    assert results["stdlib"]["median"] > 0
    assert results["engine/stdlib"]["median"] > 0


@pytest.mark.postgres
def test_drain(tmp_path: Path) -> None:
    """jobrun's worker processes drain a batch (PgQueuer and Procrastinate beside it where
    the `bench` extra is installed), each variant on a database of its own."""
    results = run_quick("drain", tmp_path, sqlite_only=False, timeout_s=SLOW_S)
    assert results["jobs"] == 200
    systems = ["jobrun"] + [
        name for name in ("pgqueuer", "procrastinate") if importlib.util.find_spec(name)
    ]
    for name in systems:
        for workers in (1, 4):
            found = results[f"{name}/{workers}"]
            assert found["runs_per_s"]["median"] > 0
            assert found["enqueue_per_s"]["median"] > 0
        assert results[f"{name}/4 over 1"]["median"] > 0
    # The systems not installed are left out, and nothing else is measured.
    assert {key.split("/")[0] for key in results if "/" in key} == set(systems)
    # A database of its own per sample, each dropped.
    names = results["meta"]["postgres_databases"]
    assert len(names) == 2 * len(systems)
    assert asyncio.run(_exists(names)) == []


@pytest.mark.postgres
def test_run_bytes(tmp_path: Path) -> None:
    """Bytes per finished run: every index of the runs table measured, the claim's two
    (partial on live runs) empty once every run is finished, the database dropped."""
    results = run_quick("run_bytes", tmp_path, sqlite_only=False)
    assert results["runs"] == 500
    indexes = results["indexes"]
    for claim_index in ("_substrat_job_runs_claim_order", "_substrat_job_runs_due_order"):
        # No entry left: a btree's meta page and its empty root, 8 KiB each.
        assert indexes[claim_index] * results["runs"] <= 2 * 8192
    assert results["table"] > 0
    assert results["total"] == results["table"] + sum(indexes.values())
    assert results["total_as_left"] >= results["total"]
    assert 0 <= results["hot_updates"] <= results["updates"]
    assert asyncio.run(_exists(results["meta"]["postgres_databases"])) == []


def test_fair_claims(tmp_path: Path) -> None:
    results = run_quick("fair_claims", tmp_path)
    assert results["claims"] > 0
    assert results["drivers"] == 2


def test_every_scenario_and_process_module_imports() -> None:
    """What no smoke test runs (the PgBouncer and nginx checks, the other systems' child
    processes) at least imports: its names in jobrun and the harness still exist."""
    listed = subprocess.run(
        [sys.executable, "-m", "benchmarks"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    folder = REPO / "benchmarks"
    scenarios = sorted(path.stem for path in (folder / "scenarios").glob("[!_]*.py"))
    assert [line.split()[0] for line in listed.splitlines() if line.startswith("  ")] == scenarios
    for kind in ("scenarios", "processes"):
        for path in sorted((folder / kind).glob("*.py")):
            if path.stem not in ("celery_app",):  # Celery (the bench extra) at import
                importlib.import_module(f"benchmarks.{kind}.{path.stem}")


async def _exists(names: list[str]) -> list[str]:
    connection = await asyncpg.connect(
        POSTGRES_URL.replace("postgresql+asyncpg://", "postgresql://")
    )
    try:
        rows = await connection.fetch(
            "SELECT datname FROM pg_database WHERE datname = ANY($1::text[])", names
        )
        return [row["datname"] for row in rows]
    finally:
        await connection.close()


@pytest.mark.postgres
def test_claim_limit_and_its_databases_dropped(tmp_path: Path) -> None:
    results = run_quick("claim_limit", tmp_path, sqlite_only=False)
    for backend in ("sqlite", "postgres"):
        found = results[backend]
        assert set(found["median_us"]) == {"unlimited", "limited", "at limit"}
        assert all(value > 0 for value in found["median_us"].values())
        assert found["over_unlimited"]["unlimited"] == 1
    names = results["meta"]["postgres_databases"]
    assert len(names) == 1
    assert names[0].startswith("jobrun_bench_claim_limit_")
    assert asyncio.run(_exists(names)) == []


async def _fail_inside(databases: Any) -> None:
    async with databases:
        engine = await databases.engine("postgres")
        await databases.engine("sqlite")
        async with engine.connect():  # a connection still open at the failure
            raise RuntimeError("a failing scenario")


@pytest.mark.postgres
async def test_databases_are_dropped_when_the_run_fails() -> None:
    from benchmarks.harness import Databases

    databases = Databases(POSTGRES_URL, "smoke")
    with pytest.raises(RuntimeError, match="a failing scenario"):
        await _fail_inside(databases)
    assert len(databases.postgres_names) == 1
    assert await _exists(databases.postgres_names) == []
    assert not databases.folder.exists()
