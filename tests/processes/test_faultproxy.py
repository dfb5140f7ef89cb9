"""The fault-injecting TCP proxy (``tests/faultproxy.py``) in front of Postgres.

Bytes flow through it; ``cut`` resets open connections and lets new ones in;
``blackhole`` stalls a query (and a new connection) until ``heal``; the same
controls work from a separate process over stdin.
"""

from __future__ import annotations

import asyncio
import os
import sys
from asyncio.subprocess import PIPE

import asyncpg
import pytest
from sqlalchemy import make_url

from tests.faultproxy import FaultProxy, ThreadedProxy
from tests.support import REPO

pytestmark = pytest.mark.postgres


def _target() -> tuple[str, int, str]:
    url = make_url(os.environ.get("JOBRUN_TEST_POSTGRES_URL", "postgresql://postgres@x/postgres"))
    return url.host or "127.0.0.1", url.port or 5432, url.username or "postgres"


async def _connect(port: int) -> asyncpg.Connection:
    user = _target()[2]
    return await asyncpg.connect(host="127.0.0.1", port=port, user=user, database="postgres")


async def test_bytes_flow_and_cut_resets_open_connections_only() -> None:
    host, port, _ = _target()
    async with FaultProxy(host, port) as proxy:
        connection = await _connect(proxy.port)
        assert await connection.fetchval("SELECT 41 + 1", timeout=10) == 42
        assert proxy.open_connections == 1
        assert proxy.cut() == 1
        with pytest.raises((OSError, asyncpg.PostgresConnectionError, asyncpg.InterfaceError)):
            await connection.fetchval("SELECT 1", timeout=10)
        assert connection.is_closed()
        again = await _connect(proxy.port)
        assert await again.fetchval("SELECT 2", timeout=10) == 2
        await again.close()
        assert proxy.accepted == 2


async def test_a_blackhole_stalls_a_query_and_a_new_connection_until_heal() -> None:
    host, port, _ = _target()
    async with FaultProxy(host, port) as proxy:
        connection = await _connect(proxy.port)
        proxy.blackhole()
        query = asyncio.ensure_future(connection.fetchval("SELECT 7", timeout=30))
        connecting = asyncio.ensure_future(_connect(proxy.port))
        # A look for something that must not happen: nothing gets through while blackholed.
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(asyncio.shield(query), 0.5)
        assert not connecting.done()
        assert proxy.open_connections == 2
        proxy.heal()
        assert await asyncio.wait_for(query, 10) == 7
        late = await asyncio.wait_for(connecting, 10)
        assert await late.fetchval("SELECT 8", timeout=10) == 8
        await late.close()
        await connection.close()


async def test_the_threaded_proxy_cuts_from_synchronous_code() -> None:
    host, port, _ = _target()
    with ThreadedProxy(host, port) as proxy:
        connection = await _connect(proxy.port)
        assert await connection.fetchval("SELECT 1", timeout=10) == 1
        assert await asyncio.to_thread(proxy.cut) == 1
        with pytest.raises((OSError, asyncpg.PostgresConnectionError, asyncpg.InterfaceError)):
            await connection.fetchval("SELECT 1", timeout=10)


async def test_the_proxy_obeys_commands_from_a_separate_process() -> None:
    host, port, _ = _target()
    command = ["-m", "tests.faultproxy", "--target-host", host, "--target-port", str(port)]
    child = await asyncio.create_subprocess_exec(
        sys.executable, *command, cwd=REPO, stdin=PIPE, stdout=PIPE
    )
    assert child.stdin is not None
    assert child.stdout is not None

    async def answer() -> list[str]:
        return (await asyncio.wait_for(child.stdout.readline(), 30)).decode().split()  # type: ignore[union-attr]

    async def ask(command: str) -> list[str]:
        child.stdin.write(command.encode() + b"\n")  # type: ignore[union-attr]
        await child.stdin.drain()  # type: ignore[union-attr]
        return await answer()

    try:
        proxy_port = int((await answer())[1])
        connection = await _connect(proxy_port)
        assert await connection.fetchval("SELECT 3", timeout=10) == 3
        assert await ask("count") == ["open", "1", "accepted", "1"]
        assert await ask("cut") == ["cut", "1"]
        with pytest.raises((OSError, asyncpg.PostgresConnectionError, asyncpg.InterfaceError)):
            await connection.fetchval("SELECT 1", timeout=10)
        child.stdin.write(b"quit\n")
        assert await asyncio.wait_for(child.wait(), 10) == 0
    finally:
        if child.returncode is None:
            child.kill()
            await child.wait()


async def test_blackhole_when_silences_only_the_connection_that_sent_the_markers() -> None:
    host, port, _ = _target()
    async with FaultProxy(host, port) as proxy:
        victim, other = await _connect(proxy.port), await _connect(proxy.port)
        proxy.blackhole_when(b"wedge-", b"-here")
        # The markers are bytes of the query's parameters, as a step write's are.
        query = asyncio.ensure_future(victim.fetchval("SELECT $1::text", "wedge--here"))
        with pytest.raises(TimeoutError):
            # A look for something that must not happen: the silenced query never answers.
            await asyncio.wait_for(asyncio.shield(query), 1.0)
        assert proxy.silenced == 1
        assert await other.fetchval("SELECT $1::text", "wedge--here", timeout=10) == "wedge--here"
        assert not victim.is_closed(), "its socket stays open: silent, not closed"
        query.cancel()
        victim.terminate()
        await other.close()


async def test_drop_loses_chunks_until_heal() -> None:
    host, port, _ = _target()
    async with FaultProxy(host, port) as proxy:
        connection = await _connect(proxy.port)
        proxy.drop(1.0)
        query = asyncio.ensure_future(connection.fetchval("SELECT 3"))
        with pytest.raises(TimeoutError):
            # A look for something that must not happen: its bytes were lost.
            await asyncio.wait_for(asyncio.shield(query), 1.0)
        assert proxy.dropped >= 1
        proxy.heal()
        # Lost, not held: the stalled query stays stalled after heal; a new one goes through.
        assert not query.done()
        query.cancel()
        connection.terminate()
        fresh = await _connect(proxy.port)
        assert await fresh.fetchval("SELECT 4", timeout=10) == 4
        await fresh.close()


async def test_half_close_ends_the_server_session_and_tells_the_client_nothing() -> None:
    host, port, _ = _target()
    async with FaultProxy(host, port) as proxy:
        connection = await _connect(proxy.port)
        backend = await connection.fetchval("SELECT pg_backend_pid()", timeout=10)
        assert proxy.half_close() == 1
        watcher = await _connect_direct()
        try:
            # The server saw the FIN and ended the session.
            for _ in range(200):
                alive = await watcher.fetchval(
                    "SELECT count(*) FROM pg_stat_activity WHERE pid = $1", backend
                )
                if not alive:
                    break
                await asyncio.sleep(0.05)  # sleep: a poll of the server's sessions
            assert not alive, "the server ended the session"
        finally:
            await watcher.close()
        query = asyncio.ensure_future(connection.fetchval("SELECT 5"))
        with pytest.raises(TimeoutError):
            # A look for something that must not happen: the client hears nothing.
            await asyncio.wait_for(asyncio.shield(query), 1.0)
        assert not connection.is_closed()
        query.cancel()
        connection.terminate()


async def _connect_direct() -> asyncpg.Connection:
    host, port, user = _target()
    return await asyncpg.connect(host=host, port=port, user=user, database="postgres")


async def test_drop_only_with_loses_only_the_chunks_holding_those_bytes() -> None:
    host, port, _ = _target()
    async with FaultProxy(host, port) as proxy:
        connection = await _connect(proxy.port)
        proxy.drop(1.0, only_with=b"lost-one")
        kept = await connection.fetchval("SELECT $1::text", "kept-one", timeout=10)
        assert kept == "kept-one"
        lost = asyncio.ensure_future(connection.fetchval("SELECT $1::text", "lost-one"))
        with pytest.raises(TimeoutError):
            # A look for something that must not happen: that query's bytes were lost.
            await asyncio.wait_for(asyncio.shield(lost), 1.0)
        assert proxy.dropped == 1
        lost.cancel()
        connection.terminate()
