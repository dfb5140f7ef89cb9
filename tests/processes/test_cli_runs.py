"""``jobrun runs``, ``show`` and ``watch``: reading runs (jobrun/_cli/commands/runs.py)."""

from __future__ import annotations

import asyncio
import json
import threading

import pytest

import jobrun
from tests.processes.cli_support import (
    drive_to_end,
    fails,
    finish,
    invoke,
    ok,
    set_run,
    start,
    with_store,
)
from tests.support import SQL_BACKENDS


@pytest.fixture(params=SQL_BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    """Only the SQL backends: the command line always speaks to a database."""
    return str(request.param)


def test_runs_table_and_json(database_url: str) -> None:
    done_id = start(database_url, instance="one")
    finish(database_url, done_id)
    live_id = start(database_url, instance="two")

    table = ok("runs", "--url", database_url).stdout
    for expected in (done_id, live_id, "shop/walk/one", "objects=30", "total=30", "done"):
        assert expected in table
    assert table.index(live_id) < table.index(done_id)  # newest first

    records = json.loads(ok("runs", "--url", database_url, "--json").stdout)
    assert [record["id"] for record in records] == [live_id, done_id]
    assert records[1]["counters"] == {"objects": 30, "total": 30}
    assert records[1]["cursor"] == 3
    assert records[1]["ended_at"].endswith("+00:00")  # ISO text

    only_done = json.loads(ok("runs", "--url", database_url, "-s", "done", "--json").stdout)
    assert [record["id"] for record in only_done] == [done_id]
    limited = json.loads(ok("runs", "--url", database_url, "--limit", "1", "--json").stdout)
    assert [record["id"] for record in limited] == [live_id]
    filtered = ok("runs", "--url", database_url, "-m", "shop", "-j", "walk", "-i", "two").stdout
    assert live_id in filtered
    assert done_id not in filtered
    assert "no runs match" in ok("runs", "--url", database_url, "--module", "nope").stdout


def test_runs_lists_the_stranded_runs_as_the_console_does(database_url: str) -> None:
    stranded_id = start(database_url, instance="stranded")
    held_id = start(database_url, instance="held")
    idle_id = start(database_url, instance="idle")
    for run_id, expires_at in (
        (stranded_id, "2000-01-01T00:00:00.000Z"),  # a lease long expired, untaken
        (held_id, "2999-01-01T00:00:00.000Z"),  # a lease still good
    ):
        set_run(
            database_url,
            run_id,
            lease_owner="token",
            lease_driver="gone:1",
            next_attempt_at=expires_at,
        )
    listed = json.loads(ok("runs", "--url", database_url, "-s", "stranded", "--json").stdout)
    assert [record["id"] for record in listed] == [stranded_id]
    assert idle_id not in ok("runs", "--url", database_url, "--status", "stranded").stdout
    only = ["runs", "--url", database_url, "-s", "stranded", "-i", "stranded", "--json"]
    assert [record["id"] for record in json.loads(ok(*only).stdout)] == [stranded_id]
    other = ["runs", "--url", database_url, "-s", "stranded", "-i", "strand", "--json"]
    assert json.loads(ok(*other).stdout) == []  # --instance is exact, as for other statuses


def test_show_has_the_record_the_lease_and_the_ledger(database_url: str) -> None:
    run_id = start(database_url, job="flaky")
    finish(database_url, run_id)
    shown = ok("show", "--url", database_url, run_id).stdout
    for expected in (run_id, "shop/flaky/default", "failed", "the API said no", "fetch"):
        assert expected in shown
    assert "not leased" in shown

    data = json.loads(ok("show", "--url", database_url, run_id, "--json").stdout)
    assert data["run"]["status"] == "failed"
    assert data["steps"] == [
        {"step": "fetch", "result": {"rows": 3}, "attempts": 1, "last_error": None,
         "completed": True}
    ]  # fmt: skip


def test_show_says_how_long_a_deferred_run_waits_and_why(database_url: str) -> None:
    run_id = start(database_url)
    set_run(
        database_url,
        run_id,
        next_attempt_at="2999-01-01T00:05:00.000Z",
        deferrals=3,
        deferred_reason="rate limited by the API",
    )
    shown = " ".join(ok("show", "--url", database_url, run_id).stdout.split())
    assert (
        "waiting until 2999-01-01 00:05:00 (Retry-After: rate limited by the API); "
        "deferred 3 times in a row"
    ) in shown
    data = json.loads(ok("show", "--url", database_url, run_id, "--json").stdout)
    assert (data["run"]["deferrals"], data["run"]["deferred_reason"]) == (
        3,
        "rate limited by the API",
    )


def test_bracketed_text_is_printed_as_stored(database_url: str) -> None:
    # A real driver's lease_driver ends in "[jobrun host=...]" and error texts quote
    # code ("[red]"): both are data, never rich markup to be swallowed.
    run_id = start(database_url)
    driver = "vm:15368 [jobrun host=vm pid=15368]"
    set_run(
        database_url,
        run_id,
        lease_owner="token",
        lease_driver=driver,
        next_attempt_at="2999-01-01T00:00:00.000Z",
        last_error="KeyError: [red]items[/red]",
    )
    shown = " ".join(ok("show", "--url", database_url, run_id).stdout.split())
    assert f"held by {driver}, expires" in shown
    assert "KeyError: [red]items[/red]" in shown
    listed = ok("runs", "--url", database_url).stdout
    assert "[red]items" in listed


def test_watch_follows_a_run_to_done(database_url: str) -> None:
    run_id = start(database_url)

    async def drive(store: jobrun.SqlJobRunStore) -> None:
        await asyncio.sleep(0.2)  # let the watch see the run before it moves
        await drive_to_end(store, run_id, pause_s=0.1)

    driver = threading.Thread(target=with_store, args=(database_url, drive))
    driver.start()
    try:
        result = invoke("watch", "--url", database_url, run_id, "--interval", "0.05")
    finally:
        driver.join()
    assert result.exit_code == 0, result.output
    output = result.stdout
    # Off a terminal: a line per change (how many depends on timing), the last one done.
    changes = [line for line in output.splitlines() if " attempts=" in line]
    assert changes
    assert " done objects=30 total=30" in changes[-1]
    # A total is the size of the work, not work done: it gets no rate.
    assert "total/s" not in output
    # Then the final view, with its progress bar and counters table.
    assert "30 / 30 objects (100.0%)" in output
    assert "per second" in output
    assert "per second" in output
    assert output.rstrip().endswith(f"run {run_id} is done")


def test_watch_exits_1_for_a_failed_run(database_url: str) -> None:
    run_id = start(database_url, job="flaky")
    finish(database_url, run_id)
    result = fails(1, "watch", "--url", database_url, run_id, "--interval", "0.05")
    assert "the API said no" in result.stdout
    assert f"run {run_id} failed" in result.stdout


def test_watch_ends_cancelled_for_a_cancelled_run(database_url: str) -> None:
    run_id = start(database_url)
    ok("cancel", "--url", database_url, run_id, "--reason", "wrong shop")
    result = fails(1, "watch", "--url", database_url, run_id, "--interval", "0.05")
    assert f"run {run_id} cancelled: wrong shop" in result.stdout
    assert " cancelled " in result.stdout.splitlines()[0]  # the line per change


def test_runs_status_cancelled_and_health_count_the_cancelled_apart(database_url: str) -> None:
    cancelled_id = start(database_url, instance="a")
    ok("cancel", "--url", database_url, cancelled_id, "--reason", "x")
    failed_id = start(database_url, job="flaky")
    finish(database_url, failed_id)
    live_id = start(database_url, instance="b")

    def listed(status: str) -> list[str]:
        found = ok("runs", "--url", database_url, "--status", status, "--json").stdout
        return [record["id"] for record in json.loads(found)]

    assert listed("cancelled") == [cancelled_id]
    assert listed("failed") == [failed_id, cancelled_id]  # the stored status
    assert listed("running") == [live_id]
    records = json.loads(ok("runs", "--url", database_url, "--json").stdout)
    assert {record["id"]: record["outcome"] for record in records} == {
        cancelled_id: "cancelled",
        failed_id: "failed",
        live_id: "running",
    }
    table = ok("runs", "--url", database_url, "--status", "cancelled").stdout
    assert "cancelled" in table
    assert failed_id not in table
    assert "cancelled" in ok("show", "--url", database_url, cancelled_id).stdout
    counts = json.loads(ok("health", "--url", database_url, "--json").stdout)
    assert (counts["failed"], counts["cancelled"]) == (2, 1)
    assert "cancelled" in ok("health", "--url", database_url).stdout


def test_watch_of_an_unknown_run(database_url: str) -> None:
    result = fails(1, "watch", "--url", database_url, "no-such-run")
    assert "no job run has the id 'no-such-run'" in result.stderr
