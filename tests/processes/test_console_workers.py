"""The console's view of the workers' rows (revision 0007), on memory, SQLite and Postgres:
the Workers page lists live workers, idle ones included, with the runs each holds, and
names the jobs whose due runs no live worker registers; the runs list flags those runs
and only those."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest

from jobrun._core.leases.holders import HolderIdentity
from jobrun._core.model.formats import format_instant
from jobrun._core.model.worker_rows import WorkerRow, jobs_text
from jobrun._core.operator.worker_registry import beat_row
from jobrun.ui import create_app
from tests.support import hand_made_row, put_rows

HOLDER = HolderIdentity(host="web-7", boot="b", pid_namespace="1", pid=4121, start_ticks=9)


@pytest.fixture
async def client(store: Any) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app({"main": store}, allowed_hosts=["console.test"])
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://console.test") as made:
        yield made


def _at(delta: timedelta) -> str:
    return format_instant(datetime.now(UTC) + delta)


def _worker(
    worker_id: str, host: str, pid: int, jobs: list[tuple[str, str]], ago_s: float
) -> WorkerRow:
    blank = WorkerRow(
        worker_id, f"{host}:{pid}", host, pid, jobs_text(jobs), _at(timedelta(hours=-1)), "", ""
    )
    return beat_row(blank, datetime.now(UTC) - timedelta(seconds=ago_s), 10.0)


def _row(index: int, job: str, **values: Any) -> Any:
    row = hand_made_row(index, module_id="shop", job=job, at=_at(timedelta(minutes=-30)))
    return dataclasses.replace(row, **values)


async def test_workers_idle_or_busy_are_listed_and_unserved_due_runs_flagged(
    store: Any, engine: Any, client: httpx.AsyncClient
) -> None:
    # web-7 (pid 4121) holds a lease on a run of shop/sync; web-9 is idle; a third
    # worker's last heartbeat is 45 s old (gone after 30 s).
    await store.beat_worker(_worker("busy", "web-7", 4121, [("shop", "sync")], ago_s=1))
    await store.beat_worker(
        _worker("idle", "web-9", 77, [("shop", "sync"), ("shop", "mail")], ago_s=2)
    )
    await store.beat_worker(_worker("dead", "web-3", 5, [("shop", "typo")], ago_s=45))
    await put_rows(
        store,
        engine,
        [
            _row(
                1,
                "sync",
                lease_owner="tok",
                lease_driver=HOLDER.describe("web-7:4121"),
                lease_began_at=_at(timedelta(minutes=-1)),
                next_attempt_at=_at(timedelta(minutes=2)),
            ),
            _row(2, "sync"),  # due, and registered by both live workers
            _row(3, "typo"),  # due, registered only by the dead worker
            _row(4, "typo", next_attempt_at=_at(timedelta(minutes=5))),  # backing off: not due
        ],
    )
    page = (await client.get("/db/0/workers")).text
    workers = re.findall(
        r'<tr data-worker="(\w+)">\s*<td class="mono">[^<]*</td>\s*<td>([\w-]+)</td>\s*'
        r'<td class="num">(\d+)</td>\s*<td class="num">(?:<span class="muted">)?(\w+)',
        page,
    )
    assert workers == [("busy", "web-7", "4121", "1"), ("idle", "web-9", "77", "idle")]
    assert "shop / mail, shop / sync" in page
    assert re.search(r"shop / typo</a>: 1 due", page)
    assert "shop / sync</a>: " not in page

    runs = (await client.get("/db/0/runs")).text
    flagged = re.findall(
        r'title="([0-9A-Z]+)">…[0-9A-Z]+</a>(?:(?!</tr>).)*no live worker runs this job', runs, re.S
    )
    assert flagged == [hand_made_row(3).id]

    health = (await client.get("/health")).text
    assert "Live workers: <a" in health
    assert re.search(r">2</a></p>", health)
    assert health.count("no live worker runs this job</span>") == 1
