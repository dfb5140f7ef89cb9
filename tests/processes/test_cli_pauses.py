"""``jobrun pause`` and ``jobrun unpause`` (a run, a job, a limit key) on SQLite and
Postgres (jobrun/_cli/commands/pauses.py): what they print, their JSON, the runs
list's paused filter, health's paused rows, and bad input refused in one line with
exit status 2, nothing written."""

from __future__ import annotations

import json

import jobrun
from tests.processes.cli_support import fails, ok, start, with_store
from tests.processes.test_cli import backend

_backend = backend


def _record(url: str, run_id: str) -> jobrun.JobRun:
    found = with_store(url, lambda store: jobrun.get_job_run(store, run_id))
    assert found is not None
    return found


def test_pause_and_unpause_a_run(database_url: str) -> None:
    run_id = start(database_url)
    said = ok("pause", "--url", database_url, run_id, "--reason", "vendor down").stdout
    assert said.strip() == f"paused {run_id}"
    again = json.loads(ok("pause", "--url", database_url, run_id, "--json").stdout)
    assert (again["outcome"], again["pause_reason"]) == ("paused", "vendor down")
    listed = json.loads(ok("runs", "--url", database_url, "--status", "paused", "--json").stdout)
    assert [run["id"] for run in listed] == [run_id]
    shown = ok("show", "--url", database_url, run_id).stdout
    assert "paused since" in shown
    assert "vendor down" in shown
    assert ok("unpause", "--url", database_url, run_id).stdout.strip() == f"unpaused {run_id}"
    assert _record(database_url, run_id).outcome == "running"
    ok("cancel", "--url", database_url, run_id, "--reason", "enough")
    refused = fails(1, "pause", "--url", database_url, run_id)
    assert "is cancelled, not running" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1
    assert fails(1, "unpause", "--url", database_url, "nope").stderr.strip() == (
        "Error: no job run has the id 'nope'"
    )


def test_pause_a_job_and_a_limit_key(database_url: str) -> None:
    first = start(database_url, instance="a")
    said = ok("pause", "--url", database_url, "--module", "shop", "--job", "walk").stdout
    assert said.strip() == "paused job shop/walk: 1 run paused"
    later = start(database_url, instance="b")
    assert _record(database_url, later).outcome == "paused"
    limit = ok("pause", "--url", database_url, "--limit-key", "api", "--reason", "429s").stdout
    assert limit.strip() == "paused limit 'api'"
    again = json.loads(ok("pause", "--url", database_url, "--limit-key", "api", "--json").stdout)
    assert again == {"key": "api", "newly_paused": False}
    health = json.loads(ok("health", "--url", database_url, "--json").stdout)
    assert health["paused"] == 2
    assert [entry["job"] for entry in health["paused_jobs"]] == ["walk"]
    assert [(entry["key"], entry["reason"]) for entry in health["paused_limits"]] == [
        ("api", "429s")
    ]
    table = ok("health", "--url", database_url).stdout
    assert "paused job shop/walk" in table
    assert "paused limit api" in table
    unpaused = json.loads(
        ok("unpause", "--url", database_url, "-m", "shop", "-j", "walk", "--json").stdout
    )
    assert unpaused == {"module_id": "shop", "job": "walk", "unpaused_runs": 2}
    assert _record(database_url, first).outcome == "running"
    woken = ok("unpause", "--url", database_url, "--limit-key", "api").stdout
    assert woken.strip() == "unpaused limit 'api': 0 runs due again"


def test_a_bad_target_is_refused_in_one_line_and_writes_nothing(database_url: str) -> None:
    run_id = start(database_url)
    for args in (
        [],
        [run_id, "--limit-key", "api"],
        [run_id, "--module", "shop", "--job", "walk"],
        ["--module", "shop"],
        ["--job", "walk"],
    ):
        for command in ("pause", "unpause"):
            result = fails(2, command, "--url", database_url, *args)
            assert len(result.stderr.strip().splitlines()) == 1, result.stderr
            assert result.stderr.startswith("Error: ")
    assert _record(database_url, run_id).outcome == "running"
    health = json.loads(ok("health", "--url", database_url, "--json").stdout)
    assert (health["paused_jobs"], health["paused_limits"]) == ([], [])
