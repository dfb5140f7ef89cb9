"""A small HTTP/1.1 server standing in for an external system that limits its callers.

Used by the walk tests and ``benchmarks/scenarios/external_walk.py``. Every request
waits ``latency_ms`` (the API's own latency), then is served if the server's
token bucket holds a token, else refused with ``429 Too Many Requests`` and a
``Retry-After`` header. The bucket refills at ``per_second`` and holds
``burst + 0.1 * per_second`` tokens, so a client that keeps to the declared rate
and burst is never refused even with scheduling jitter.

Routes:

* ``GET /objects/{n}``: object ``n`` (``{"id": n, "size": ...}``);
* ``POST /objects/{n}/mark``: a write; with an ``Idempotency-Key`` header, a key
  seen before is answered from memory and not written again;
* ``GET /stats``: what the server saw (served and refused counts, fetches per
  object, writes per object, requests served per second).

Run alone: ``python -m tests.fake_api --per-second 300 --burst 5`` prints its port.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REASONS = {200: "OK", 404: "Not Found", 429: "Too Many Requests", 400: "Bad Request"}


def object_size(number: int) -> int:
    """Object ``number``'s size: fixed, so a walk's total can be checked."""
    return (number * 7919) % 10_000 + 1


@dataclass
class Bucket:
    """The server's token bucket, on the server's monotonic clock."""

    per_second: float
    depth: float
    tokens: float = 0.0
    refilled_at_s: float = field(default_factory=time.monotonic)

    def __post_init__(self) -> None:
        self.tokens = self.depth

    def take(self) -> float:
        """0 when a token was taken, else the seconds until one is there."""
        now_s = time.monotonic()
        self.tokens = min(self.depth, self.tokens + (now_s - self.refilled_at_s) * self.per_second)
        self.refilled_at_s = now_s
        if self.tokens >= 1:
            self.tokens -= 1
            return 0.0
        return (1 - self.tokens) / self.per_second


@dataclass
class FakeApi:
    """The server's state; ``per_second`` ``None`` serves everything."""

    per_second: float | None = None
    burst: int = 1
    latency_ms: float = 20.0
    served: int = 0
    refused: int = 0
    fetches: Counter[int] = field(default_factory=Counter)
    writes: Counter[int] = field(default_factory=Counter)
    keys: dict[str, int] = field(default_factory=dict)
    served_per_second: Counter[int] = field(default_factory=Counter)
    started_at_s: float = field(default_factory=time.monotonic)
    bucket: Bucket | None = None

    def __post_init__(self) -> None:
        if self.per_second is not None:
            self.bucket = Bucket(self.per_second, self.burst + 0.1 * self.per_second)

    def stats(self) -> dict[str, Any]:
        return {
            "served": self.served,
            "refused": self.refused,
            "fetches": {str(number): count for number, count in self.fetches.items()},
            "writes": {str(number): count for number, count in self.writes.items()},
            "served_per_second": [self.served_per_second[s] for s in self._seconds()],
        }

    def _seconds(self) -> range:
        return range(max(self.served_per_second, default=-1) + 1)

    async def answer(self, method: str, path: str, headers: dict[str, str]) -> tuple[int, Any]:
        if path == "/stats":
            return 200, self.stats()
        # asyncio.sleep: the external system's latency being simulated.
        await asyncio.sleep(self.latency_ms / 1000)
        if self.bucket is not None:
            wait_s = self.bucket.take()
            if wait_s > 0:
                self.refused += 1
                return 429, {"retry_after_s": wait_s}
        self.served += 1
        self.served_per_second[int(time.monotonic() - self.started_at_s)] += 1
        parts = path.strip("/").split("/")
        if len(parts) < 2 or parts[0] != "objects" or not parts[1].isdigit():
            return 404, {"error": f"no route {path}"}
        number = int(parts[1])
        if method == "GET" and len(parts) == 2:
            self.fetches[number] += 1
            return 200, {"id": number, "size": object_size(number)}
        if method == "POST" and parts[2:] == ["mark"]:
            key = headers.get("idempotency-key")
            if key is None or key not in self.keys:
                self.writes[number] += 1
                if key is not None:
                    self.keys[key] = number
            return 200, {"id": number, "marked": True}
        return 404, {"error": f"no route {method} {path}"}


async def _read_request(reader: asyncio.StreamReader) -> tuple[str, str, dict[str, str]] | None:
    line = await reader.readline()
    if not line:
        return None
    method, path, _ = line.decode("latin-1").split(" ", 2)
    headers: dict[str, str] = {}
    while (header := await reader.readline()) not in (b"\r\n", b"\n", b""):
        name, _, value = header.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    length = int(headers.get("content-length", "0"))
    if length:
        await reader.readexactly(length)
    return method, path, headers


def _response(status: int, body: Any) -> bytes:
    data = json.dumps(body).encode()
    lines = [
        f"HTTP/1.1 {status} {REASONS.get(status, 'Error')}",
        "Content-Type: application/json",
        f"Content-Length: {len(data)}",
    ]
    if status == 429:
        # Whole seconds, as HTTP says; a client that wants finer waits reads the body.
        lines.append(f"Retry-After: {max(1, math.ceil(body['retry_after_s']))}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + data


class Serving:
    """A running server: ``url`` to call it, ``close()`` to stop it and its connections."""

    def __init__(self, api: FakeApi) -> None:
        self.api = api
        self.url = ""
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()

    async def start(self, host: str, port: int) -> Serving:
        self._server = await asyncio.start_server(self._connection, host, port)
        self.url = f"http://{host}:{self._server.sockets[0].getsockname()[1]}"
        return self

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in self._connections:
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)

    async def __aenter__(self) -> Serving:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        try:
            while (request := await _read_request(reader)) is not None:
                status, body = await self.api.answer(*request)
                writer.write(_response(status, body))
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError, ValueError):
            pass  # the client went away or sent what this small server does not parse
        except asyncio.CancelledError:
            # Only close() cancels these tasks; a cancelled one would make asyncio's
            # stream callback log an error (Python 3.11), so it ends normally.
            pass
        finally:
            writer.close()
            self._connections.discard(task)


async def serve(api: FakeApi, host: str = "127.0.0.1", port: int = 0) -> Serving:
    """Start serving ``api``; ``async with`` the result, or ``close()`` it."""
    return await Serving(api).start(host, port)


REPO = Path(__file__).resolve().parents[1]


@contextlib.contextmanager
def in_a_process(
    per_second: float | None, burst: int = 1, latency_ms: float = 20.0
) -> Iterator[str]:
    """This server in a process of its own (``per_second`` ``None``: no limit); its base URL."""
    command = [sys.executable, "-m", "tests.fake_api", "--latency-ms", str(latency_ms)]
    if per_second is not None:
        command += ["--per-second", str(per_second), "--burst", str(burst)]
    environment = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"}
    server = subprocess.Popen(command, cwd=REPO, env=environment, stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        url = server.stdout.readline().strip()
        assert url.startswith("http://"), f"the fake API did not start: {url!r}"
        yield url
    finally:
        server.kill()
        server.wait()
        if server.stdout is not None:
            server.stdout.close()


def stats_of(url: str) -> dict[str, Any]:
    """What the server at ``url`` saw (its ``/stats``)."""
    import httpx  # only the callers that read stats need it

    found: dict[str, Any] = httpx.get(f"{url}/stats", timeout=10).json()
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--per-second", type=float, default=None)
    parser.add_argument("--burst", type=int, default=1)
    parser.add_argument("--latency-ms", type=float, default=20.0)
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args()

    async def run() -> None:
        api = FakeApi(args.per_second, args.burst, args.latency_ms)
        async with await serve(api, port=args.port) as serving:
            print(serving.url, flush=True)
            await asyncio.Event().wait()  # until killed

    asyncio.run(run())


if __name__ == "__main__":
    main()


class Answer:
    """What :class:`LightClient` answers: the parts of an httpx response the walk reads."""

    def __init__(self, status_code: int, headers: dict[str, str], body: bytes) -> None:
        self.status_code = status_code
        self.headers = headers
        self._body = body

    def json(self) -> Any:
        return json.loads(self._body)

    def raise_for_status(self) -> None:
        if self.status_code >= 400:
            raise RuntimeError(f"HTTP {self.status_code}: {self._body[:200]!r}")


class LightClient:
    """A minimal HTTP/1.1 keep-alive client for this server, for benchmarks.

    httpx spends milliseconds of CPU per request; on a 2-core machine shared with
    the server and the database that, not jobrun, caps a walk's request rate. This
    client spends a few tens of microseconds, so a benchmark measures the limiter.
    It speaks only what this server answers (Content-Length bodies).
    """

    def __init__(self, base_url: str, most_connections: int) -> None:
        host_port = base_url.removeprefix("http://").rstrip("/")
        host, _, port = host_port.partition(":")
        self._host, self._port = host, int(port or "80")
        self._idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
        self._slots = asyncio.Semaphore(most_connections)

    async def request(
        self, method: str, path: str, headers: dict[str, str] | None = None
    ) -> Answer:
        async with self._slots:
            if self._idle:
                reader, writer = self._idle.pop()
            else:
                reader, writer = await asyncio.open_connection(self._host, self._port)
            lines = [f"{method} {path} HTTP/1.1", f"Host: {self._host}", "Content-Length: 0"]
            lines += [f"{name}: {value}" for name, value in (headers or {}).items()]
            writer.write(("\r\n".join(lines) + "\r\n\r\n").encode())
            status = int((await reader.readline()).split()[1])
            answer_headers: dict[str, str] = {}
            while (line := await reader.readline()) not in (b"\r\n", b""):
                name, _, value = line.decode("latin-1").partition(":")
                answer_headers[name.strip().lower()] = value.strip()
            body = await reader.readexactly(int(answer_headers.get("content-length", "0")))
            self._idle.append((reader, writer))
            return Answer(status, _CaseBlind(answer_headers), body)

    async def aclose(self) -> None:
        for _, writer in self._idle:
            writer.close()
        self._idle.clear()


class _CaseBlind(dict[str, str]):
    """Header names read case-blind, as httpx's headers are."""

    def get(self, name: str, default: Any = None) -> Any:  # type: ignore[override]
        return super().get(name.lower(), default)
