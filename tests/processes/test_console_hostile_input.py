"""Every parameter every console route reads, given hostile values: never a 5xx.

A table names, per route, the parameters it reads and the others it needs for
that one to be read (a bulk filter is only read with ``scope=filter``); each
hostile value goes into each parameter in turn, on memory, SQLite and Postgres.
Values that are wrong (an instant past the calendar's edge, NUL) must get 400.
"""

from __future__ import annotations

import json
import re
from typing import Any
from urllib.parse import quote

import httpx
import pytest

import jobrun
from jobrun.ui import create_app

ORIGIN = "http://console.test"
TOKEN = re.compile(r'name="csrf_token" value="([0-9a-f]+)"')

DEEP_JSON = "[" * 5_000 + "]" * 5_000
HOSTILE = [
    "9999-12-31T23:59:59-14:00",  # past the calendar's end once in UTC
    "0001-01-01T00:00:00+14:00",  # before its start
    "9999-12-31T23:59:59.999999+00:00",
    "0001-01-01",
    DEEP_JSON,
    '{"a":' * 3_000,
    "\x00",
    "a\x00b",
    "x" * 60_000,  # httpx sends no longer URL
    "NaN",
    "-1",
    "1e999",
    "%",
    "../../etc/passwd",
    "<script>",
    "",
    json.dumps({"at": "nan", "counters": {"done": 1}}),
    json.dumps({"at": 1e308, "counters": {"done": 1e308, "total": -1e308}}),
    json.dumps({"at": 0, "counters": []}),
    json.dumps({"at": 0, "counters": {"done": [1], "total": {"x": 1}}}),
    '{"at": 1, "counters": {"done": 1' + "0" * 5_000 + "}}",
    "null",
]
PAST_THE_CALENDAR = ("9999-12-31T23:59:59-14:00", "0001-01-01T00:00:00+14:00")

FILTER = ("status", "module", "job", "instance", "since")
# (method, path, the parameters it reads, what it needs besides)
ROUTES: list[tuple[str, str, tuple[str, ...], dict[str, str]]] = [
    ("GET", "/", ("x",), {}),
    ("GET", "/health", ("x",), {}),
    ("GET", "/db/0/runs", (*FILTER, "before"), {}),
    ("GET", "/db/0/runs/{run}", ("notice", "prev"), {}),
    ("GET", "/db/0/runs/{run}/live", ("notice", "prev"), {}),
    ("GET", "/db/0/bulk", ("action", "scope"), {}),
    ("GET", "/db/0/bulk", FILTER, {"action": "cancel", "scope": "filter"}),
    ("GET", "/db/0/bulk", ("run_id",), {"action": "resume", "scope": "selected"}),
    ("POST", "/db/0/runs/{run}/cancel", ("reason", "csrf_token"), {}),
    ("POST", "/db/0/runs/{other}/start", ("reason",), {}),
    ("POST", "/db/0/bulk", ("action", "scope", "reason"), {}),
    ("POST", "/db/0/bulk", FILTER, {"action": "resume", "scope": "filter"}),
    ("POST", "/db/0/bulk", ("run_id", "reason"), {"action": "resume", "scope": "selected"}),
]
PATHS = ["/db/{db}/runs", "/db/0/runs/{value}", "/db/0/runs/{value}/live", "/db/{db}/bulk"]


def _must_refuse(name: str, value: str) -> bool:
    if name not in (*FILTER, "before", "run_id"):
        return False
    return "\x00" in value or (name == "since" and value in PAST_THE_CALENDAR)


async def _send(
    client: httpx.AsyncClient, method: str, path: str, params: dict[str, str], token: str
) -> httpx.Response:
    if method == "GET":
        return await client.get(path, params=params)
    form = {"csrf_token": token, **params}
    return await client.post(path, data=form, headers={"origin": ORIGIN})


async def test_no_parameter_of_any_route_gets_a_5xx(store: Any) -> None:
    run = await jobrun.start_job_run(store, module_id="shop", job="sync")
    other = await jobrun.start_job_run(store, module_id="shop", job="other")
    await jobrun.cancel_job_run(store, other.id, "so that it can be started again")
    app = create_app({"main": store}, allowed_hosts=["console.test"])
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url=ORIGIN) as client:
        found = TOKEN.search((await client.get(f"/db/0/runs/{run.id}")).text)
        assert found is not None
        token = found.group(1)
        failures = []
        for method, template, names, needs in ROUTES:
            path = template.format(run=run.id, other=other.id)
            for name in names:
                for value in HOSTILE:
                    answer = await _send(client, method, path, {**needs, name: value}, token)
                    wrong = answer.status_code >= 500 or (
                        _must_refuse(name, value) and answer.status_code != 400
                    )
                    if wrong:
                        failures.append((method, path, name, value[:40], answer.status_code))
        for template in PATHS:
            for value in [*HOSTILE[:16], "99999999999999999999999"]:
                quoted = quote(value, safe="")
                answer = await client.get(template.format(db=quoted, value=quoted))
                if answer.status_code >= 500:
                    failures.append(("GET", template, "path", value[:40], answer.status_code))
    assert failures == []


@pytest.mark.parametrize("since", PAST_THE_CALENDAR)
async def test_an_instant_past_the_calendar_gets_a_one_line_400(store: Any, since: str) -> None:
    app = create_app({"main": store}, allowed_hosts=["console.test"])
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url=ORIGIN) as client:
        for path, extra in (
            ("/db/0/runs", {}),
            ("/db/0/bulk", {"action": "cancel", "scope": "filter"}),
        ):
            answer = await client.get(path, params={"since": since, **extra})
            assert answer.status_code == 400, path
            assert (
                "started since must be a date and time like 2026-01-31T08:00 (UTC)" in answer.text
            )
