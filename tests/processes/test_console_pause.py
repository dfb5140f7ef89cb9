"""Pause and unpause in the console (jobrun.ui), through an ASGI client, on memory,
SQLite and Postgres: one run's buttons (behind the page's confirm), the paused
runs in the list and its status filter, bulk pause and unpause of a filter behind
the confirmation page, the audit line, and health's paused jobs and limit keys."""

from __future__ import annotations

import logging
import re
from typing import Any

import pytest

import jobrun
from jobrun.ui import ACTIONS, create_app
from tests.processes.test_console import HOSTS, _post, client_for
from tests.support import row_of

_client_for = client_for


async def test_a_run_is_paused_and_unpaused_from_its_page(
    store: Any, client_for: Any, caplog: pytest.LogCaptureFixture
) -> None:
    assert {"pause", "unpause"} <= set(ACTIONS)
    run = await jobrun.start_job_run(store, module_id="shop", job="sync")
    client = client_for(create_app({"main": store}, allowed_hosts=HOSTS))
    path = f"/db/0/runs/{run.id}"
    page = await client.get(path)
    # The confirm flow: the form asks before it posts (console.js reads data-confirm).
    assert re.search(r'/pause" class="confirm" data-confirm="Pause this run\?', page.text)
    assert "/unpause" not in page.text
    with caplog.at_level(logging.INFO, logger="jobrun.ui"):
        answer = await _post(
            client, f"{path}/pause", {"pause_reason": "vendor down"}, token_from=path
        )
    assert answer.status_code == 303
    assert answer.headers["location"] == f"{path}?notice=paused"
    assert any("pause" in record.getMessage() and run.id in record.getMessage()
               for record in caplog.records)  # fmt: skip
    record = await jobrun.get_job_run(store, run.id)
    assert record is not None
    assert (record.outcome, record.pause_reason) == ("paused", "vendor down")
    page = await client.get(f"{path}?notice=paused")
    assert 'status status-paused">paused' in page.text
    assert "Paused: no driver takes the run" in page.text
    assert "paused: vendor down" in page.text  # what it waits for
    assert re.search(r'/unpause" class="confirm" data-confirm="Unpause this run\?', page.text)
    listed = await client.get("/db/0/runs?status=paused")
    assert run.id in listed.text
    assert re.search(r"paused <b>1</b>", listed.text)
    assert re.search(r"running <b>0</b>", listed.text)
    answer = await _post(client, f"{path}/unpause", {}, token_from=path)
    assert answer.headers["location"] == f"{path}?notice=unpaused"
    assert (await row_of(store, run.id)).paused_at is None
    # Pausing a run that has ended is refused, with the reason.
    await jobrun.cancel_job_run(store, run.id, "enough")
    refused = await client.post(
        f"{path}/pause",
        data={"csrf_token": re.findall(r'name="csrf_token" value="([0-9a-f]+)"', page.text)[0]},
        headers={"origin": "http://console.test"},
    )
    assert refused.status_code in (403, 409)


async def test_bulk_pause_and_unpause_of_a_filter(store: Any, client_for: Any) -> None:
    ids = [
        (await jobrun.start_job_run(store, module_id="shop", job="sync", instance=f"i{n}")).id
        for n in range(4)
    ]
    other = await jobrun.start_job_run(store, module_id="crm", job="import")
    client = client_for(create_app({"main": store}, allowed_hosts=HOSTS))
    confirm_path = "/db/0/bulk?action=pause&scope=filter&module=shop"
    confirm = await client.get(confirm_path)
    assert "Pause 4 runs?" in confirm.text
    assert "running, not paused" in confirm.text
    done = await _post(
        client,
        "/db/0/bulk",
        {"action": "pause", "scope": "filter", "module": "shop", "reason": "deploy"},
        token_from=confirm_path,
    )
    assert "pause: 4 done, 0 refused" in done.text.lower()
    assert [(await row_of(store, run_id)).pause_reason for run_id in ids] == ["deploy"] * 4
    assert (await row_of(store, other.id)).paused_at is None
    again = await client.get(confirm_path)
    assert "Pause 0 runs?" in again.text  # paused runs are not counted twice
    confirm_path = "/db/0/bulk?action=unpause&scope=filter&status=paused"
    assert "Unpause 4 runs?" in (await client.get(confirm_path)).text
    done = await _post(
        client,
        "/db/0/bulk",
        {"action": "unpause", "scope": "filter", "status": "paused"},
        token_from=confirm_path,
    )
    assert "unpause: 4 done, 0 refused" in done.text.lower()
    assert [(await row_of(store, run_id)).paused_at for run_id in ids] == [None] * 4


async def test_health_shows_paused_runs_jobs_and_limits(store: Any, client_for: Any) -> None:
    await jobrun.start_job_run(store, module_id="shop", job="sync")
    await jobrun.pause_job(store, module_id="shop", job="sync", reason="deploy")
    await jobrun.pause_limit(store, "shopify-api", reason="429 storm")
    client = client_for(create_app({"main": store}, allowed_hosts=HOSTS))
    health = await client.get("/health")
    assert "1 paused run</a>" in health.text
    assert "job shop / sync" in health.text
    assert "deploy" in health.text
    assert "limit shopify-api" in health.text
    assert "429 storm" in health.text
