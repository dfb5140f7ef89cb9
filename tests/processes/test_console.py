"""The operator console (jobrun.ui) through an ASGI client, on memory, SQLite and Postgres.

Every route and action, hostile text from the database, forged POSTs, read-only
mode, ``authorize``, a mount under a base path and a database that is down.
"""

from __future__ import annotations

import dataclasses
import json
import re
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from sqlalchemy.ext.asyncio import create_async_engine
from starlette.applications import Starlette
from starlette.routing import Mount

import jobrun
from jobrun._core.model.records import StepRow
from jobrun.testing import MemoryJobRunStore
from jobrun.ui import create_app
from tests.support import hand_made_row, put_rows, row_of, set_columns

ORIGIN = "http://console.test"
HOSTS = ["console.test"]
HOSTILE = "<script>alert(1)</script>"
TOKEN = re.compile(r'name="csrf_token" value="([0-9a-f]+)"')


@pytest.fixture
async def client_for() -> AsyncIterator[Any]:
    clients: list[httpx.AsyncClient] = []

    def make(app: Any) -> httpx.AsyncClient:
        client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=ORIGIN)
        clients.append(client)
        return client

    yield make
    for client in clients:
        await client.aclose()


async def _token(client: httpx.AsyncClient, path: str) -> str:
    page = await client.get(path)
    found = TOKEN.search(page.text)
    assert found is not None, f"no action form on {path}"
    return found.group(1)


async def _post(
    client: httpx.AsyncClient, path: str, form: dict[str, Any], *, token_from: str
) -> httpx.Response:
    token = await _token(client, token_from)
    return await client.post(path, data={"csrf_token": token, **form}, headers={"origin": ORIGIN})


def _row(index: int, **values: Any) -> Any:
    return dataclasses.replace(hand_made_row(index, module_id="shop", job="sync"), **values)


async def test_runs_page_lists_filters_counts_and_pages(
    store: Any, engine: Any, client_for: Any
) -> None:
    rows = [_row(index, status="done", instance=f"shop-{index}") for index in range(1, 56)]
    rows.append(_row(60, status="failed", instance="other", last_error="boom"))
    await put_rows(store, engine, rows)
    client = client_for(create_app({"main": store}, allowed_hosts=HOSTS))
    page = await client.get("/db/0/runs")
    assert page.status_code == 200
    ids = re.findall(r'href="/db/0/runs/(\d{26})"', page.text)
    assert ids[0] == f"{60:026d}"
    assert len(ids) == 50
    assert re.search(r"done <b>55</b>", page.text)
    assert re.search(r"failed <b>1</b>", page.text)
    older = re.search(r'rel="next" href="/db/0/runs\?([^"]+)"', page.text)
    assert older is not None
    second = await client.get("/db/0/runs?" + older.group(1).replace("&amp;", "&"))
    rest = re.findall(r'href="/db/0/runs/(\d{26})"', second.text)
    assert rest == [f"{index:026d}" for index in range(6, 0, -1)]  # no overlap, no gap
    assert 'rel="next"' not in second.text
    failed = await client.get("/db/0/runs?status=failed")
    assert re.findall(r'href="/db/0/runs/(\d{26})"', failed.text) == [f"{60:026d}"]
    prefixed = await client.get("/db/0/runs?instance=shop-5")
    assert set(re.findall(r'href="/db/0/runs/(\d{26})"', prefixed.text)) == {
        f"{index:026d}" for index in (5, 50, 51, 52, 53, 54, 55)
    }
    bad = await client.get("/db/0/runs?status=nonsense&since=yesterday")
    assert bad.status_code == 400
    assert "status must be one of" in bad.text


async def test_hostile_text_is_escaped_everywhere(store: Any, engine: Any, client_for: Any) -> None:
    await put_rows(
        store,
        engine,
        [
            _row(
                1,
                instance=HOSTILE,
                payload='{"html":"<script>alert(1)</script>"}',
                status="failed",
                last_error=HOSTILE,
                cursor='"<img src=x onerror=alert(1)>"',
                ended_at="2026-01-01T00:00:00.000Z",
            )
        ],
    )
    client = client_for(create_app({"main": store}, allowed_hosts=HOSTS))
    run_path = f"/db/0/runs/{1:026d}"
    for path in (
        "/db/0/runs",
        f"/db/0/runs?instance={HOSTILE}",
        run_path,
        f"{run_path}/live",
        "/health",
        f"/db/0/bulk?action=resume&scope=selected&run_id={1:026d}",
        f"/db/0/bulk?action=resume&scope=filter&instance={HOSTILE}",
        f"/db/0/runs/{HOSTILE}",
    ):
        page = await client.get(path)
        assert "<script>alert" not in page.text, path
        assert "<img src=x" not in page.text, path
    shown = await client.get(run_path)
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in shown.text
    assert "script-src 'self'" in shown.headers["content-security-policy"]


async def test_run_page_shows_record_progress_rates_lease_and_ledger(
    store: Any, engine: Any, client_for: Any
) -> None:
    run = await jobrun.start_job_run(store, module_id="shop", job="sync", payload={"shop": 7})
    await set_columns(
        store,
        engine,
        run.id,
        counters='{"done":250,"total":1000}',
        cursor='{"page":3}',
        lease_owner="token",
        lease_driver="host-1:pid-9",
        lease_began_at="2026-01-01T00:00:00.000Z",
        next_attempt_at="2026-01-01T00:00:30.000Z",
        lease_takeovers=2,
    )
    assert await store.record_step(run.id, StepRow("fetch", '"ok"', 1, None), "x", "token")
    assert await store.record_step(run.id, StepRow("save", None, 2, "disk full"), "x", "token")
    client = client_for(create_app({"main": store}, allowed_hosts=HOSTS))
    page = await client.get(f"/db/0/runs/{run.id}")
    text = page.text
    assert 'progress max="1000" value="250"' in text
    assert "(25.0%)" in text
    assert "host-1:pid-9" in text
    assert "stranded" in text
    assert "taken over 2 time(s)" in text
    assert "fetch" in text
    assert "disk full" in text
    assert "(not completed)" in text
    assert "&#34;page&#34;: 3" in text
    assert "&#34;shop&#34;: 7" in text
    # The live fragment computes rates against the poll the browser saw before.
    previous = json.dumps({"at": time.time() - 10, "counters": {"done": 0}})
    live = await client.get(f"/db/0/runs/{run.id}/live", params={"prev": previous})
    assert live.status_code == 200
    assert "<html" not in live.text
    rate = re.search(r'data-counter="done">250</td><td class="num">([0-9.,]+)<', live.text)
    assert rate is not None
    assert 20 < float(rate.group(1)) <= 25
    missing = await client.get("/db/0/runs/nope")
    assert missing.status_code == 404
    assert "No run has this id" in missing.text


async def test_run_page_says_how_long_a_deferred_run_waits_and_why(
    store: Any, engine: Any, client_for: Any
) -> None:
    run = await jobrun.start_job_run(store, module_id="shop", job="sync")
    await set_columns(
        store,
        engine,
        run.id,
        next_attempt_at="2026-01-01T00:05:00.000Z",
        deferrals=1,
        deferred_reason=f"quota {HOSTILE}",
    )
    client = client_for(create_app({"main": store}))
    for path in (f"/db/0/runs/{run.id}", f"/db/0/runs/{run.id}/live"):
        text = (await client.get(path)).text
        assert (
            "waiting until 2026-01-01 00:05:00 "
            "(Retry-After: quota &lt;script&gt;alert(1)&lt;/script&gt;)"
        ) in text, path
        assert "times in a row" not in text
    # Once a driver holds the run again, the lease says what is going on.
    await set_columns(store, engine, run.id, lease_owner="token", lease_driver="host-1:pid-9")
    assert "waiting until" not in (await client.get(f"/db/0/runs/{run.id}")).text


async def test_each_action_through_its_button(store: Any, engine: Any, client_for: Any) -> None:
    run = await jobrun.start_job_run(store, module_id="shop", job="sync", payload={"n": 1})
    client = client_for(create_app({"main": store}, allowed_hosts=HOSTS))
    path = f"/db/0/runs/{run.id}"
    cancelled = await _post(client, f"{path}/cancel", {"reason": "wrong shop"}, token_from=path)
    assert cancelled.status_code == 303
    assert cancelled.headers["location"].endswith("?notice=cancelled")
    assert (await row_of(store, run.id)).last_error == "cancelled: wrong shop"
    again = await _post(client, f"{path}/cancel", {}, token_from=path)
    assert again.status_code == 409
    assert "not running" in again.text
    resumed = await _post(client, f"{path}/resume", {}, token_from=path)
    assert resumed.status_code == 303
    assert (await row_of(store, run.id)).status == "running"
    await set_columns(store, engine, run.id, lease_owner="t", lease_driver="d")
    released = await _post(client, f"{path}/release", {}, token_from=path)
    assert released.headers["location"].endswith("?notice=released")
    assert (await row_of(store, run.id)).lease_owner is None
    await _post(client, f"{path}/cancel", {"reason": "done with it"}, token_from=path)
    started = await _post(client, f"{path}/start", {}, token_from=path)
    assert started.status_code == 303
    assert started.headers["location"].endswith("?notice=started")
    new_id = started.headers["location"].split("/")[-1].split("?")[0]
    assert new_id != run.id
    new = await row_of(store, new_id)
    assert (new.status, new.instance, new.payload) == ("running", run.instance, '{"n":1}')


async def test_forged_posts_change_nothing(store: Any, client_for: Any) -> None:
    run = await jobrun.start_job_run(store, module_id="shop", job="sync")
    client = client_for(create_app({"main": store}, allowed_hosts=HOSTS))
    path = f"/db/0/runs/{run.id}"
    token = await _token(client, path)
    attempts = [
        ({"reason": "x"}, {"origin": ORIGIN}),  # no token
        ({"reason": "x", "csrf_token": "0" * 64}, {"origin": ORIGIN}),  # wrong token
        ({"reason": "x", "csrf_token": token}, {"origin": "http://evil.test"}),  # other site
        ({"reason": "x", "csrf_token": token}, {}),  # no Origin, no Referer
        ({"reason": "x", "csrf_token": token}, {"origin": "null"}),
    ]
    for form, headers in attempts:
        answer = await client.post(f"{path}/cancel", data=form, headers=headers)
        assert answer.status_code == 403, (form, headers)
    # A token is bound to its browser's cookie: another browser's token fails.
    stranger = client_for(create_app({"main": store}, allowed_hosts=HOSTS))
    answer = await stranger.post(
        f"{path}/cancel", data={"csrf_token": token}, headers={"origin": ORIGIN}
    )
    assert answer.status_code == 403
    bulk = await client.post(
        "/db/0/bulk", data={"action": "cancel", "scope": "filter"}, headers={"origin": ORIGIN}
    )
    assert bulk.status_code == 403
    assert (await row_of(store, run.id)).status == "running"
    with_referer = await client.post(
        f"{path}/cancel", data={"csrf_token": token}, headers={"referer": f"{ORIGIN}{path}"}
    )
    assert with_referer.status_code == 303


async def test_read_only_shows_no_action_and_refuses_every_post(
    store: Any, engine: Any, client_for: Any
) -> None:
    run = await jobrun.start_job_run(store, module_id="shop", job="sync")
    await set_columns(store, engine, run.id, lease_owner="t", lease_driver="d")
    client = client_for(create_app({"main": store}, allowed_hosts=HOSTS, read_only=True))
    for path in ("/db/0/runs", f"/db/0/runs/{run.id}", "/health"):
        page = await client.get(path)
        assert page.status_code == 200
        assert 'method="post"' not in page.text
        assert "/bulk" not in page.text
    confirm = await client.get(f"/db/0/bulk?action=cancel&scope=selected&run_id={run.id}")
    assert confirm.status_code == 403
    writable = client_for(create_app({"main": store}, allowed_hosts=HOSTS))
    token = await _token(writable, f"/db/0/runs/{run.id}")
    client.cookies = writable.cookies
    for action in ("cancel", "resume", "release", "start"):
        answer = await client.post(
            f"/db/0/runs/{run.id}/{action}",
            data={"csrf_token": token},
            headers={"origin": ORIGIN},
        )
        assert answer.status_code == 403
        assert "read-only" in answer.text
    assert (await row_of(store, run.id)).lease_owner == "t"


async def test_authorize_decides_who_sees_and_who_acts(store: Any, client_for: Any) -> None:
    run = await jobrun.start_job_run(store, module_id="shop", job="sync")
    asked: list[str] = []

    async def authorize(request: Any, action: str) -> bool:
        asked.append(action)
        role = request.headers.get("x-role")
        return role == "operator" or (role == "viewer" and action == "view")

    client = client_for(create_app({"main": store}, allowed_hosts=HOSTS, authorize=authorize))
    assert (await client.get("/db/0/runs")).status_code == 403
    viewer = {"x-role": "viewer"}
    page = await client.get(f"/db/0/runs/{run.id}", headers=viewer)
    assert page.status_code == 200
    assert 'method="post"' not in page.text
    operator_page = await client.get(f"/db/0/runs/{run.id}", headers={"x-role": "operator"})
    token = TOKEN.search(operator_page.text)
    assert token is not None
    refused = await client.post(
        f"/db/0/runs/{run.id}/cancel",
        data={"csrf_token": token.group(1)},
        headers={"origin": ORIGIN, **viewer},
    )
    assert refused.status_code == 403
    assert (await row_of(store, run.id)).status == "running"
    assert {"view", "cancel"} <= set(asked)


async def test_bulk_actions_confirm_how_many_then_act(
    store: Any, engine: Any, client_for: Any
) -> None:
    failed = [
        _row(index, status="failed", instance=f"i{index}", ended_at="2026-01-01T00:00:00.000Z")
        for index in range(1, 8)
    ]
    running = [_row(index, instance=f"r{index}") for index in range(20, 23)]
    await put_rows(store, engine, failed + running)
    client = client_for(create_app({"main": store}, allowed_hosts=HOSTS))
    confirm = await client.get("/db/0/bulk?action=resume&scope=filter&module=shop")
    assert "Resume 7 runs?" in confirm.text  # the running ones are not counted
    done = await _post(
        client,
        "/db/0/bulk",
        {"action": "resume", "scope": "filter", "module": "shop"},
        token_from="/db/0/bulk?action=resume&scope=filter&module=shop",
    )
    assert "resume: 7 done, 0 refused" in done.text.lower()
    assert [(await row_of(store, row.id)).status for row in failed] == ["running"] * 7
    chosen = [f"{20:026d}", f"{21:026d}"]
    query = "&".join(f"run_id={run_id}" for run_id in chosen)
    confirm = await client.get(f"/db/0/bulk?action=cancel&scope=selected&{query}")
    assert "Cancel 2 runs?" in confirm.text
    done = await _post(
        client,
        "/db/0/bulk",
        {"action": "cancel", "scope": "selected", "run_id": chosen},
        token_from=f"/db/0/bulk?action=cancel&scope=selected&{query}",
    )
    assert "2 done" in done.text
    assert [(await row_of(store, run_id)).status for run_id in chosen] == ["failed", "failed"]
    assert (await row_of(store, f"{22:026d}")).status == "running"
    nothing = await client.get("/db/0/bulk?action=resume&scope=filter&status=done")
    assert "Resume 0 runs?" in nothing.text
    assert 'method="post"' not in nothing.text


async def test_mounted_under_a_base_path(store: Any, client_for: Any) -> None:
    run = await jobrun.start_job_run(store, module_id="shop", job="sync")
    host = Starlette(routes=[Mount("/jobs", app=create_app({"main": store}, allowed_hosts=HOSTS))])
    client = client_for(host)
    home = await client.get("/jobs/")
    assert home.status_code == 303
    assert home.headers["location"] == "/jobs/db/0/runs"
    page = await client.get("/jobs/db/0/runs")
    assert f'href="/jobs/db/0/runs/{run.id}"' in page.text
    assert 'href="/jobs/static/console.css"' in page.text
    assert (await client.get("/jobs/static/console.js")).status_code == 200
    assert "Path=/jobs;" in page.headers["set-cookie"]
    path = f"/jobs/db/0/runs/{run.id}"
    answer = await _post(client, f"{path}/cancel", {"reason": "x"}, token_from=path)
    assert answer.headers["location"] == f"{path}?notice=cancelled"


async def test_a_database_that_is_down_shows_an_error_on_its_part(
    store: Any, client_for: Any, tmp_path: Any
) -> None:
    run = await jobrun.start_job_run(store, module_id="shop", job="sync")
    down = create_async_engine(
        "postgresql+asyncpg://postgres@127.0.0.1:1/none", connect_args={"timeout": 5}
    )
    missing = create_async_engine(f"sqlite+aiosqlite:///{tmp_path}/no/such/dir.db")
    try:
        client = client_for(
            create_app({"main": store, "down": down, "gone": missing}, allowed_hosts=HOSTS)
        )
        health = await client.get("/health")
        assert health.status_code == 200
        assert health.text.count("this database cannot be read") == 2
        assert "sync" in health.text  # the database that is up still shows
        for db in (1, 2):
            runs = await client.get(f"/db/{db}/runs")
            assert runs.status_code == 200
            assert "this database cannot be read" in runs.text
            one = await client.get(f"/db/{db}/runs/{run.id}")
            assert one.status_code == 200
            assert "this database cannot be read" in one.text
        assert (await client.get("/db/0/runs")).status_code == 200
        assert (await client.get("/db/9/runs")).status_code == 404
    finally:
        await down.dispose()
        await missing.dispose()


async def test_health_counts_per_job(store: Any, engine: Any, client_for: Any) -> None:
    await put_rows(store, engine, [_row(1), _row(2, module_id="crm", job="mail")])
    client = client_for(create_app({"main": store}, allowed_hosts=HOSTS))
    page = await client.get("/health")
    assert re.search(r"<td>shop</td><td>sync</td>\s*<td class=\"num\">1</td>", page.text)
    if isinstance(store, MemoryJobRunStore):
        assert "in-memory store" in page.text
    else:
        assert "at head" in page.text


def test_create_app_refuses_what_it_cannot_serve() -> None:
    with pytest.raises(ValueError, match="at least one"):
        create_app({})
    with pytest.raises(TypeError, match="AsyncEngine"):
        create_app({"x": object()})  # type: ignore[dict-item]
    with pytest.raises(ValueError, match="poll_interval_s"):
        create_app([MemoryJobRunStore()], poll_interval_s=0)
