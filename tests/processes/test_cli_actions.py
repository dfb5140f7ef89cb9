"""``jobrun cancel``, ``resume``, ``release`` and ``prune``: acting on runs
(jobrun/_cli/commands/actions.py)."""

from __future__ import annotations

import json

import pytest
from sqlalchemy import update

from jobrun.sql.schema import job_runs as runs_table
from tests.processes.cli_support import execute, fails, finish, ok, set_run, start
from tests.support import SQL_BACKENDS


@pytest.fixture(params=SQL_BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    """Only the SQL backends: the command line always speaks to a database."""
    return str(request.param)


def test_start_and_the_actions_print_json_for_scripts(database_url: str) -> None:
    first = json.loads(ok("start", "--url", database_url, "shop", "walk", "--json").stdout)
    assert first["started"] is True
    run_id = first["run"]["id"]
    assert first["run"]["status"] == "running"
    joined = json.loads(ok("start", "--url", database_url, "shop", "walk", "--json").stdout)
    assert (joined["started"], joined["run"]["id"]) == (False, run_id)

    released = json.loads(ok("release", "--url", database_url, run_id, "--json").stdout)
    assert released == {"run_id": run_id, "released": False, "held_by": None}
    cancelled = json.loads(
        ok("cancel", "--url", database_url, run_id, "--reason", "x", "--json").stdout
    )
    assert (cancelled["id"], cancelled["status"]) == (run_id, "failed")
    assert cancelled["last_error"] == "cancelled: x"
    resumed = json.loads(ok("resume", "--url", database_url, run_id, "--json").stdout)
    assert (resumed["id"], resumed["status"], resumed["attempts"]) == (run_id, "running", 0)
    pruned = json.loads(ok("prune", "--url", database_url, "--older-than", "1d", "--json").stdout)
    assert pruned == {"deleted": 0}


def _lease(url: str, run_id: str) -> None:
    set_run(
        url,
        run_id,
        lease_owner="token",
        lease_driver="host-a:123",
        lease_began_at="2030-01-01T00:00:00.000Z",
        next_attempt_at="2999-01-01T00:00:00.000Z",
        lease_epoch=7,
    )


def test_show_and_release_a_lease(database_url: str) -> None:
    run_id = start(database_url)
    _lease(database_url, run_id)
    shown = ok("show", "--url", database_url, run_id).stdout
    assert "held by host-a:123" in shown
    assert "fencing epoch 7" in shown
    assert "0 committed" in shown
    data = json.loads(ok("show", "--url", database_url, run_id, "--json").stdout)
    assert data["run"]["lease_driver"] == "host-a:123"
    assert (data["run"]["lease_epoch"], data["run"]["passes_committed"]) == (7, 0)
    assert data["run"]["lease_expires_at"].startswith("2999-01-01")

    released = ok("release", "--url", database_url, run_id).stdout
    assert "released the lease" in released
    assert "host-a:123" in released
    assert "held no lease" in ok("release", "--url", database_url, run_id).stdout
    assert "not leased" in ok("show", "--url", database_url, run_id).stdout


def test_cancel_resume_and_prune(database_url: str) -> None:
    run_id = start(database_url)
    cancelled = ok("cancel", "--url", database_url, run_id, "--reason", "wrong shop").stdout
    assert cancelled.strip() == f"cancelled {run_id}: cancelled: wrong shop"
    again = fails(1, "cancel", "--url", database_url, run_id, "--reason", "twice")
    assert "not running" in again.stderr
    fails(2, "cancel", "--url", database_url, run_id, "--reason", "   ")  # refused input

    assert ok("resume", "--url", database_url, run_id).stdout.strip() == f"resumed {run_id}"
    assert "not failed" in fails(1, "resume", "--url", database_url, run_id).stderr
    finish(database_url, run_id)

    assert ok("prune", "--url", database_url, "--older-than", "1d").stdout.strip() == (
        "pruned 0 runs"
    )
    execute(
        database_url,
        update(runs_table).values(ended_at="2000-01-01T00:00:00.000Z"),
    )
    failed_id = start(database_url, job="flaky", instance="f")
    finish(database_url, failed_id)
    set_run(database_url, failed_id, ended_at="2000-01-01T00:00:00.000Z")
    assert ok("prune", "--url", database_url, "--older-than", "7d").stdout.strip() == (
        "pruned 1 run"
    )
    pruned = ok(
        "prune", "--url", database_url, "--older-than", "12h", "--status", "done",
        "--status", "failed",
    )  # fmt: skip
    assert pruned.stdout.strip() == "pruned 1 run"
    fails(1, "show", "--url", database_url, run_id)
