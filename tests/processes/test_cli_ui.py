"""``jobrun ui`` up to the point of listening: which hosts it answers to, what it
refuses to start with, and the headers of a proxy in front of it.

uvicorn's ``Server.serve`` is replaced by a stand-in that keeps the server's
config, so the app the command built is driven through an ASGI client.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest
import uvicorn
from click.testing import CliRunner
from sqlalchemy.ext.asyncio import create_async_engine

import jobrun
import jobrun._cli.commands.ui  # registers the command on the group
from jobrun._cli.app import cli
from tests.support import run_in_thread


@pytest.fixture
def configs(monkeypatch: pytest.MonkeyPatch) -> list[uvicorn.Config]:
    """The configs ``jobrun ui`` served; a test may append a probe to run against each
    app inside the command's own event loop (where its engines live)."""
    kept: list[Any] = []

    async def serve(server: uvicorn.Server, *args: Any) -> None:
        probes = [each for each in kept if callable(each)]
        kept.append(server.config)
        for probe in probes:
            await probe(server.config)

    monkeypatch.setattr(uvicorn.Server, "serve", serve)
    return kept


def _ui(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, ["ui", *args], catch_exceptions=False)
    return result.exit_code, result.output


@pytest.fixture
def run_id(sqlite_url: str) -> str:
    async def start() -> str:
        engine = create_async_engine(sqlite_url)
        try:
            store = jobrun.SqlJobRunStore(engine)
            return (await jobrun.start_job_run(store, module_id="a", job="b")).id
        finally:
            await engine.dispose()

    return run_in_thread(start)


async def _get(config: uvicorn.Config, path: str, peer: str = "127.0.0.1", **headers: str) -> Any:
    transport = httpx.ASGITransport(app=config.app, client=(peer, 40000))
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:8080") as client:
        return await client.get(path, headers=headers)


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (
            ("--host", "0.0.0.0"),
            "--host 0.0.0.0 is reachable from other machines: name the host names",
        ),
        (("--allowed-host", "*"), "--allowed-host has '*': name each host"),
        (("--allowed-host", "a b"), "--allowed-host has 'a b', which is not a host name"),
        (("--forwarded-allow-ips", "proxy"), "forwarded_allow_ips has 'proxy', which is not"),
        (("--base-path", "/jobs?x=1"), "--base-path '/jobs?x=1' is not a plain path like /jobs"),
        (("--base-path", "/jo#bs"), "--base-path '/jo#bs' is not a plain path like /jobs"),
        (("--base-path", "/%2e%2e"), "--base-path '/%2e%2e' is not a plain path like /jobs"),
        (("--root-path", "/a?b"), "--root-path '/a?b' is not a plain path like /jobs"),
    ],
)
def test_refuses_to_start_with_what_it_could_not_serve_safely(
    arguments: tuple[str, ...], message: str, sqlite_url: str, configs: list[Any]
) -> None:
    code, output = _ui("--url", sqlite_url, *arguments)
    assert code == 2
    assert output.startswith(f"Error: {message}")
    assert output.count("\n") == 1
    assert configs == []


def test_on_loopback_it_answers_to_loopback_names_only(
    sqlite_url: str, run_id: str, configs: list[Any]
) -> None:
    async def probe(config: uvicorn.Config) -> None:
        assert config.proxy_headers is False
        for host in ("localhost:8080", "127.0.0.1:8080", "[::1]:8080"):
            page = await _get(config, f"/db/0/runs/{run_id}", host=host)
            assert page.status_code == 200, host
            assert 'method="post"' in page.text
        refused = await _get(config, "/db/0/runs", host="evil.example:8080")
        assert refused.status_code == 400

    configs.append(probe)
    code, output = _ui("--url", sqlite_url)
    assert code == 0, output
    assert len(configs) == 2


def test_elsewhere_it_answers_to_the_allowed_hosts(sqlite_url: str, configs: list[Any]) -> None:
    async def probe(config: uvicorn.Config) -> None:
        assert (await _get(config, "/db/0/runs", host="jobs.example.com")).status_code == 200
        assert (await _get(config, "/db/0/runs", host="localhost:8080")).status_code == 400

    configs.append(probe)
    code, output = _ui(
        "--url", sqlite_url, "--host", "0.0.0.0", "--allowed-host", "jobs.example.com"
    )
    assert code == 0, output
    assert len(configs) == 2


def test_forwarded_headers_count_from_trusted_proxies_only(
    sqlite_url: str, configs: list[Any]
) -> None:
    forwarded = {"x-forwarded-host": "jobs.example.com", "x-forwarded-proto": "https"}

    async def probe(config: uvicorn.Config) -> None:
        assert config.root_path == "/jobs"
        proxied = await _get(config, "/db/0/runs", peer="10.1.2.3", host="backend", **forwarded)
        assert proxied.status_code == 200
        assert "; secure" in proxied.headers["set-cookie"].lower()
        # A client talking to the console directly cannot claim an allowed host.
        direct = await _get(config, "/db/0/runs", peer="192.0.2.1", host="backend", **forwarded)
        assert direct.status_code == 400

    configs.append(probe)
    code, output = _ui(
        "--url", sqlite_url, "--allowed-host", "jobs.example.com",
        "--forwarded-allow-ips", "10.0.0.0/8", "--root-path", "/jobs",
    )  # fmt: skip
    assert code == 0, output
    assert len(configs) == 2
