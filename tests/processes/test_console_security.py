"""The console's defences: the Host allow-list (DNS rebinding), a mounted console
without one, static files behind ``authorize``, base paths that could not serve,
the upgrade command for an unmigrated database, and a log line per action."""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy.ext.asyncio import create_async_engine
from starlette.authentication import SimpleUser

import jobrun
from jobrun.testing import MemoryJobRunStore
from jobrun.ui import ACTIONS, create_app
from jobrun.ui.hosts import LOOPBACK_HOSTS, AllowedHosts
from tests.support import row_of

TOKEN = re.compile(r'name="csrf_token" value="([0-9a-f]+)"')


def _client(app: Any, origin: str, **options: Any) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app, **options), base_url=origin)


async def _token(client: httpx.AsyncClient, path: str) -> str:
    found = TOKEN.search((await client.get(path)).text)
    assert found is not None, f"no action form on {path}"
    return found.group(1)


@pytest.fixture
async def running() -> tuple[MemoryJobRunStore, str]:
    store = MemoryJobRunStore()
    run = await jobrun.start_job_run(store, module_id="shop", job="sync")
    return store, run.id


async def test_a_rebound_host_gets_a_one_line_400_and_no_token(
    running: tuple[MemoryJobRunStore, str],
) -> None:
    store, run_id = running
    app = create_app({"main": store}, allowed_hosts=["console.test"])
    evil = "http://evil.example:8080"
    async with _client(app, evil) as client:
        for path in ("/", "/db/0/runs", f"/db/0/runs/{run_id}", "/health", "/static/console.js"):
            page = await client.get(path, headers={"origin": evil})
            assert page.status_code == 400, path
            assert page.text == (
                "refused: this console does not answer to the host 'evil.example:8080'\n"
            )
            assert "csrf" not in page.text
            assert "set-cookie" not in page.headers
        # Even holding a real token and cookie (taken through the right name), the
        # rebinding site's POST stops at its Host.
        async with _client(app, "http://console.test") as honest:
            token = await _token(honest, f"/db/0/runs/{run_id}")
            client.cookies = honest.cookies
        cancelled = await client.post(
            f"/db/0/runs/{run_id}/cancel", data={"csrf_token": token}, headers={"origin": evil}
        )
        assert cancelled.status_code == 400
    assert (await row_of(store, run_id)).status == "running"


async def test_the_origin_must_be_an_allowed_host_too(
    running: tuple[MemoryJobRunStore, str],
) -> None:
    store, run_id = running
    app = create_app({"main": store}, allowed_hosts=["console.test", "localhost"])
    async with _client(app, "http://console.test") as client:
        token = await _token(client, f"/db/0/runs/{run_id}")
        for origin in ("http://evil.example", "http://localhost", "http://console.test.evil"):
            answer = await client.post(
                f"/db/0/runs/{run_id}/cancel",
                data={"csrf_token": token},
                headers={"origin": origin},
            )
            assert answer.status_code == 403, origin
        answer = await client.post(
            f"/db/0/runs/{run_id}/cancel",
            data={"csrf_token": token},
            headers={"origin": "http://console.test"},
        )
        assert answer.status_code == 303


def test_host_names_match_on_any_port_unless_one_is_given() -> None:
    loopback = AllowedHosts.of(LOOPBACK_HOSTS)
    for host in ("localhost", "localhost:8080", "127.0.0.1:1", "[::1]:8080", "[::1]", "LOCALHOST."):
        assert loopback.allows(host), host
    for host in (
        "evil.example",
        "localhost.evil.example",
        "127.0.0.1.nip.io:8080",
        "127.0.0.2",
        "::1",  # a bare IPv6 literal is no valid Host header
        "localhost:0",
        "localhost:99999",
        "localhost:80:80",
        "[::1",
        "",
        None,
    ):
        assert not loopback.allows(host), host
    pinned = AllowedHosts.of(["jobs.example.com:8443", "[::2]:9000"])
    assert pinned.allows("jobs.example.com:8443")
    assert pinned.allows("[0:0:0:0:0:0:0:2]:9000")
    assert not pinned.allows("jobs.example.com")
    assert not pinned.allows("jobs.example.com:8080")


@pytest.mark.parametrize(
    "given",
    [[], ["*"], ["*.example.com"], ["jobs example"], ["http://jobs.example.com"], ["host:port"]],
)
def test_create_app_refuses_unusable_allowed_hosts(given: list[str]) -> None:
    with pytest.raises(ValueError, match="allowed_hosts"):
        create_app([MemoryJobRunStore()], allowed_hosts=given)


async def test_without_allowed_hosts_it_only_shows_and_says_why(
    running: tuple[MemoryJobRunStore, str],
) -> None:
    store, run_id = running
    app = create_app({"main": store})
    async with _client(app, "http://anything.example") as client:
        page = await client.get(f"/db/0/runs/{run_id}")
        assert page.status_code == 200
        assert 'class="banner"' in page.text
        assert "no allowed hosts" in page.text
        assert 'method="post"' not in page.text
        writable = create_app({"main": store}, allowed_hosts=["anything.example"])
        async with _client(writable, "http://anything.example") as other:
            token = await _token(other, f"/db/0/runs/{run_id}")
            client.cookies = other.cookies
        answer = await client.post(
            f"/db/0/runs/{run_id}/cancel",
            data={"csrf_token": token},
            headers={"origin": "http://anything.example"},
        )
        assert answer.status_code == 403
        assert "no allowed hosts" in answer.text
    explicit = create_app({"main": store}, read_only=True)
    async with _client(explicit, "http://anything.example") as client:
        assert 'class="banner"' not in (await client.get("/health")).text
    assert (await row_of(store, run_id)).status == "running"


async def test_static_files_ask_authorize_for_view() -> None:
    asked: list[str] = []

    def nobody(request: Any, action: str) -> bool:
        asked.append(action)
        return False

    def everybody(request: Any, action: str) -> bool:
        return True

    stores = [MemoryJobRunStore()]
    denied = create_app(stores, allowed_hosts=["console.test"], authorize=nobody)
    allowed = create_app(stores, allowed_hosts=["console.test"], authorize=everybody)
    async with _client(denied, "http://console.test") as client:
        for path in ("/static/console.css", "/static/console.js", "/static/nope.txt"):
            assert (await client.get(path)).status_code == 403, path
    assert set(asked) == {"view"} | set(ACTIONS)
    async with _client(allowed, "http://console.test") as client:
        assert (await client.get("/static/console.css")).status_code == 200


@pytest.mark.parametrize("base_path", ["/jobs?x=1", "/jo#bs", "/%2e%2e", "/jobs/../x", "/jöbs"])
def test_create_app_refuses_a_base_path_it_could_not_serve(base_path: str) -> None:
    with pytest.raises(ValueError, match=r"base_path .* is not a plain path like /jobs"):
        create_app([MemoryJobRunStore()], base_path=base_path)


async def test_a_base_path_serves_the_console_under_it(
    running: tuple[MemoryJobRunStore, str],
) -> None:
    store, run_id = running
    app = create_app({"main": store}, allowed_hosts=["console.test"], base_path="jobs/")
    async with _client(app, "http://console.test") as client:
        home = await client.get("/")
        assert (home.status_code, home.headers["location"]) == (307, "/jobs/")
        page = await client.get("/jobs/db/0/runs")
        assert f'href="/jobs/db/0/runs/{run_id}"' in page.text
        assert (await client.get("/jobs/static/console.css")).status_code == 200
        assert (await client.get("/db/0/runs", headers={"host": "evil.example"})).status_code == 400


async def test_an_unmigrated_database_names_the_command_that_migrates_it(tmp_path: Path) -> None:
    engine = create_async_engine(f"sqlite+aiosqlite:///{tmp_path}/blank.db")
    command = f"jobrun db upgrade --url sqlite+aiosqlite:///{tmp_path}/blank.db"
    try:
        app = create_app({"blank": engine}, allowed_hosts=["console.test"])
        async with _client(app, "http://console.test") as client:
            for path in ("/db/0/runs", "/health"):
                page = await client.get(path)
                assert page.status_code == 200, path
                assert command in page.text, path
                assert "alembic" not in page.text, path
    finally:
        await engine.dispose()


def _as(user: str, app: Any) -> Any:
    """``app`` behind a stand-in for the host's authentication middleware."""

    async def authenticated(scope: Any, receive: Any, send: Any) -> None:
        scope["user"] = SimpleUser(user)
        await app(scope, receive, send)

    return authenticated


async def test_each_action_logs_who_did_what(
    running: tuple[MemoryJobRunStore, str], caplog: pytest.LogCaptureFixture
) -> None:
    store, run_id = running
    other = await jobrun.start_job_run(store, module_id="shop", job="sync", instance="b")
    app = _as("alice", create_app({"main": store}, allowed_hosts=["console.test"]))
    origin = {"origin": "http://console.test"}
    caplog.set_level(logging.INFO, logger="jobrun.ui")
    async with _client(app, "http://console.test", client=("203.0.113.7", 5000)) as client:
        token = await _token(client, f"/db/0/runs/{run_id}")
        cancelled = await client.post(
            f"/db/0/runs/{run_id}/cancel", data={"csrf_token": token}, headers=origin
        )
        assert cancelled.status_code == 303
        bulk = {"csrf_token": token, "action": "cancel", "scope": "selected"}
        done = await client.post(
            "/db/0/bulk", data={**bulk, "run_id": [run_id, other.id]}, headers=origin
        )
        assert done.status_code == 200
    records = [record for record in caplog.records if record.name == "jobrun.ui"]
    assert [
        # The audit fields ride on the LogRecord as extra attributes, unknown to its type.
        (record.identity, record.client, record.action, record.run_ids, record.refused_ids)  # type: ignore[attr-defined]
        for record in records
    ] == [
        ("alice", "203.0.113.7", "cancel", (run_id,), ()),
        ("alice", "203.0.113.7", "bulk cancel", (other.id,), (run_id,)),
    ]
    assert records[0].getMessage() == (
        f"console cancel by alice from 203.0.113.7 on main: 1 run(s) [{run_id}], 0 refused"
    )
