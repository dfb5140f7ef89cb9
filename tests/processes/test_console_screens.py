"""The console's operator screens through an ASGI client, on memory, SQLite and Postgres:
the runs list's new columns and the cancelled status, the run page's next attempt and
lease holder, activity, workers and errors (grouped, with a bulk resume per group)."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest

import jobrun
from jobrun._core.leases.holders import HolderIdentity
from jobrun._core.model.formats import format_instant
from jobrun.ui import create_app
from tests.support import hand_made_row, put_rows

ORIGIN = "http://console.test"
HOSTS = ["console.test"]


@pytest.fixture
async def client_for() -> AsyncIterator[Any]:
    clients: list[httpx.AsyncClient] = []

    def make(store: Any) -> httpx.AsyncClient:
        app = create_app({"main": store}, allowed_hosts=HOSTS)
        client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=ORIGIN)
        clients.append(client)
        return client

    yield make
    for client in clients:
        await client.aclose()


def _at(delta: timedelta) -> str:
    return format_instant(datetime.now(UTC) + delta)


def _row(index: int, **values: Any) -> Any:
    row = hand_made_row(index, module_id="shop", job="sync", at=_at(timedelta(minutes=-30)))
    return dataclasses.replace(row, **values)


HOLDER = HolderIdentity(host="web-7", boot="b", pid_namespace="1", pid=4121, start_ticks=9)


async def test_the_runs_list_shows_progress_duration_priority_and_what_each_waits_for(
    store: Any, engine: Any, client_for: Any
) -> None:
    await put_rows(
        store,
        engine,
        [
            _row(1, counters='{"total": 200, "done": 50}', priority=7),
            _row(
                2,
                attempts=2,
                last_error="OSError: down",
                next_attempt_at=_at(timedelta(seconds=40)),
            ),
            _row(
                3,
                lease_owner="tok",
                lease_driver=HOLDER.describe("worker-1/2"),
                lease_began_at=_at(timedelta(minutes=-1)),
                next_attempt_at=_at(timedelta(seconds=25)),
            ),
        ],
    )
    page = (await client_for(store).get("/db/0/runs")).text
    assert re.search(r'<progress max="200" value="50"[^>]*></progress> 25%', page)
    assert '<td class="num opt">7</td>' in page
    assert re.search(r"next attempt in (39|40)s", page)
    # A lease's expiry is shown as the lease, never as a next attempt.
    assert re.search(r"leased, 2\ds left", page)
    assert page.count("next attempt in") == 1
    assert re.search(r'<td class="num opt">30m0\ds</td>', page)


async def test_a_cancelled_run_shows_cancelled_and_the_filter_picks_it(
    store: Any, client_for: Any
) -> None:
    kept = await jobrun.start_job_run(store, module_id="shop", job="sync", instance="a")
    cancelled = await jobrun.start_job_run(store, module_id="shop", job="sync", instance="b")
    await jobrun.cancel_job_run(store, cancelled.id, "wrong tenant")
    record = await jobrun.get_job_run(store, cancelled.id)
    assert record is not None
    assert (record.status, record.cancelled) == ("failed", True)
    client = client_for(store)
    page = (await client.get("/db/0/runs?status=cancelled")).text
    assert cancelled.id in page
    assert kept.id not in page
    assert '<span class="status status-cancelled">cancelled</span>' in page
    assert re.search(r"cancelled <b>1</b>", page)
    assert re.search(r"failed <b>0</b>", page)
    assert cancelled.id not in (await client.get("/db/0/runs?status=failed")).text
    # A resume clears the mark: the run runs again, and is no longer cancelled.
    resumed = await jobrun.resume_job_run(store, cancelled.id)
    assert not resumed.cancelled


async def test_the_run_page_names_the_holder_and_why_it_waits(
    store: Any, engine: Any, client_for: Any
) -> None:
    leased = _row(
        1,
        lease_owner="tok",
        lease_driver=HOLDER.describe("worker-1/2"),
        lease_began_at="2026-01-01T10:00:00.000Z",
        next_attempt_at=_at(timedelta(minutes=5)),
        counters='{"total": 10, "done": 4}',
    )
    backing_off = _row(
        2, attempts=1, last_error="OSError: down", next_attempt_at=_at(timedelta(seconds=90))
    )
    await put_rows(store, engine, [leased, backing_off])
    client = client_for(store)
    page = (await client.get(f"/db/0/runs/{leased.id}")).text
    assert re.search(
        r"<b>worker-1/2</b> on host <span class=\"mono\">web-7</span>, "
        r"pid <span class=\"mono\">4121</span>",
        page,
    )
    assert "since 2026-01-01 10:00:00" in page
    assert "[jobrun" not in page  # the internal identity text is parsed, not shown
    assert "in flight: lease until" in page
    # The first read has nothing to compare with: no rate is shown, least of all for total.
    counters = page.split("<h2>Counters</h2>")[1].split("</table>")[0]
    assert counters.count('<span class="muted">–</span>') == 2
    page = (await client.get(f"/db/0/runs/{backing_off.id}")).text
    assert re.search(r"next attempt in 1m(29|30)s \([^)]*\): backoff after failed attempt 1", page)


async def test_activity_charts_runs_started_finished_and_failed(
    store: Any, engine: Any, client_for: Any
) -> None:
    recent = _at(timedelta(minutes=-3))
    rows = [
        dataclasses.replace(_row(1), status="done", started_at=recent, ended_at=recent),
        dataclasses.replace(_row(2), status="failed", started_at=recent, ended_at=recent),
        dataclasses.replace(_row(3, job="other"), started_at=recent),
    ]
    # Ids minted now, so "started since" (an id range) counts them.
    rows = [dataclasses.replace(row, id=f"{jobrun_ulid(index)}") for index, row in enumerate(rows)]
    await put_rows(store, engine, rows)
    client = client_for(store)
    page = (await client.get("/db/0/activity")).text
    assert "<svg" in page
    assert re.search(r"started <b>3</b>", page)
    assert re.search(r"finished <b>2</b>", page)
    assert re.search(r"of them failed <b>1</b>", page)
    assert page.count('class="bar bar-failed"') == 1
    page = (await client.get("/db/0/activity?per=hour&module=shop&job=other")).text
    assert re.search(r"started <b>1</b>", page)
    assert re.search(r"finished <b>0</b>", page)


def jobrun_ulid(index: int) -> str:
    """A ULID of this millisecond (its random part ``index``)."""
    from jobrun._core.model.ids import first_id_at

    return first_id_at(_at(timedelta(0)))[:10] + f"{index:016d}"


async def test_workers_lists_the_lease_holders(store: Any, engine: Any, client_for: Any) -> None:
    other = HolderIdentity(host="web-9", pid=77, start_ticks=1, boot="b", pid_namespace="1")
    rows = [
        _row(
            index,
            lease_owner=f"t{index}",
            lease_driver=identity.describe(name),
            lease_began_at=_at(timedelta(minutes=-index)),
            next_attempt_at=_at(timedelta(minutes=2)),
        )
        for index, (name, identity) in enumerate(
            [("w1", HOLDER), ("w1", HOLDER), ("w2", other)], start=1
        )
    ]
    # An expired lease is not held by anyone any more.
    rows.append(
        _row(
            9,
            lease_owner="t9",
            lease_driver=other.describe("gone"),
            next_attempt_at=_at(timedelta(minutes=-1)),
        )
    )
    await put_rows(store, engine, rows)
    page = (await client_for(store).get("/db/0/workers")).text
    found = re.findall(
        r'<td class="mono">(\w+)</td>\s*<td>([\w-]+)</td>\s*'
        r'<td class="num">(\d+)</td>\s*<td class="num"><a[^>]*>(\d+)</a>',
        page,
    )
    assert found == [("w1", "web-7", "4121", "2"), ("w2", "web-9", "77", "1")]
    assert "gone" not in page


async def test_errors_are_grouped_with_a_bulk_resume_each(
    store: Any, engine: Any, client_for: Any
) -> None:
    ended = _at(timedelta(hours=-1))
    rows = [
        _row(
            index,
            status="failed",
            ended_at=ended,
            last_error=f"KeyError: order {index * 37} not found",
        )
        for index in range(1, 4)
    ]
    rows.append(_row(7, status="failed", ended_at=ended, last_error="TimeoutError: upstream"))
    rows.append(
        _row(
            8,
            status="failed",
            ended_at=_at(timedelta(hours=-30)),
            last_error="TimeoutError: upstream",
        )
    )
    await put_rows(store, engine, rows)
    client = client_for(store)
    page = (await client.get("/db/0/errors")).text
    assert "4 runs failed in the last 24 hours" in page
    assert "order &lt;n&gt; not found" in page
    groups = re.findall(
        r'<td class="num">(\d+)</td>\s*<td><span class="mono error-type">(\w+)</span>', page
    )
    assert groups == [("3", "KeyError"), ("1", "TimeoutError")]
    assert page.count("<button>Resume 3…</button>") == 1
    wider = (await client.get("/db/0/errors?hours=48")).text
    assert re.findall(r'<td class="num">(\d+)</td>\s*<td><span', wider) == ["3", "2"]
    assert (await client.get("/db/0/errors?hours=0")).status_code == 400
