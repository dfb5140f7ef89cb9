"""``jobrun health`` (jobrun/_cli/commands/health.py)."""

from __future__ import annotations

import json

import pytest

from tests.processes.cli_support import APP, finish, ok, set_run, start
from tests.support import SQL_BACKENDS


@pytest.fixture(params=SQL_BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    """Only the SQL backends: the command line always speaks to a database."""
    return str(request.param)


def test_health(database_url: str) -> None:
    start(database_url, instance="a")
    start(database_url, instance="b")
    failed_id = start(database_url, job="flaky")
    finish(database_url, failed_id)
    counts = json.loads(ok("health", "--url", database_url, "--json").stdout)
    assert counts["running"] == 2
    assert counts["due"] == 2
    assert counts["failed"] == 1
    assert counts["leased"] == 0
    table = ok("health", "--url", database_url).stdout
    assert "due now" in table
    assert "oldest due waited" in table


def test_health_with_an_app_names_runs_of_a_newer_job_version(database_url: str) -> None:
    """After a rollback: runs committed by version-2 code of demo/pages, which the app's
    version-1 code never claims."""
    newer = start(database_url, instance="a")
    start(database_url, instance="b")
    set_run(database_url, newer, module_id="demo", job="pages", job_version=2)
    counts = json.loads(ok("health", "--url", database_url, "--app", APP, "--json").stdout)
    assert {
        "module_id": "demo",
        "job": "pages",
        "runs_by_version": {"2": 1},
        "runs_beyond_code": 1,
        "needs_version": 2,
    } in counts["versions_by_job"]
    table = ok("health", "--url", database_url, "--app", APP).stdout
    assert "beyond code demo/pages" in table
    assert "versions demo/pages" in table
