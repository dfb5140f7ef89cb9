"""A TCP proxy that injects network faults between a client and a server (issue 21).

It listens on 127.0.0.1 (a random port) and forwards every connection to its
target (Postgres at 127.0.0.1:5432 by default). Its controls:

* ``cut()``: every open connection is reset now, on both sides (SO_LINGER 0,
  so the peers see a reset, as after a network failure); new connections are
  accepted as usual;
* ``blackhole()``: the connections stay open but no byte moves in either
  direction, and a new connection is accepted and held without being forwarded,
  as in a partition: the peers wait on their reads;
* ``heal()``: bytes move again (those held during the blackhole are delivered,
  as TCP would after the partition), held connections are connected; chunks are
  no longer dropped (``drop``);
* ``blackhole_when(*markers, half_close=False)``: the first connection whose
  client next sends a chunk holding every marker (bytes of a query's
  parameters, say) goes silent for good: that chunk and everything after it,
  both ways, is swallowed, its sockets stay open; the other connections go on
  (one dead path in a pool). With ``half_close`` its server side also gets a
  FIN (``half_close`` below, for that one connection);
* ``drop(probability, seed, only_with=None)``: each chunk, either way (with
  ``only_with``: each client chunk holding those bytes), is lost with that
  probability until ``heal()`` (bytes lost from the stream: a peer waits for
  what never comes, or reads garbage);
* ``half_close()``: every open connection's server side gets an orderly FIN
  while its client side stays open and hears nothing more (the server ended
  the session, and the client was never told);
* ``open_connections`` / ``accepted``: connections open now / accepted so far.

Three ways to use it: ``async with FaultProxy(...) as proxy`` in a test's event
loop; ``ThreadedProxy`` (the same, on a loop of its own in a thread, for
synchronous code such as the chaos runner); or a separate process,
``python -m tests.faultproxy --target-port 5432``, which prints
``port <n>`` and then obeys the lines ``cut``, ``blackhole``, ``heal``,
``drop <probability>``, ``half-close``, ``count`` and ``quit`` on stdin,
answering each with one line.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import socket
import struct
import sys
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

HOST = "127.0.0.1"
CHUNK = 65536
T = TypeVar("T")


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close a socket with a reset (RST), not an orderly FIN."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


class _Link:
    """One client connection and its upstream connection."""

    def __init__(self, client: asyncio.StreamWriter) -> None:
        self.writers: list[asyncio.StreamWriter] = [client]
        self.tasks: list[asyncio.Task[None]] = []
        # Swallowing everything, both ways (``blackhole_when``, ``half_close``).
        self.silent = False

    def reset(self) -> None:
        for task in self.tasks:
            task.cancel()
        for writer in self.writers:
            _reset(writer)


class FaultProxy:
    """The proxy, on the running event loop."""

    def __init__(self, target_host: str = HOST, target_port: int = 5432) -> None:
        self.target = (target_host, target_port)
        self.port = 0
        self.accepted = 0
        self._links: set[_Link] = set()
        self._flowing = asyncio.Event()
        self._flowing.set()
        self._server: asyncio.Server | None = None
        self._markers: tuple[bytes, ...] = ()
        self._half_close_marked = False
        self._drop_probability = 0.0
        self._drop_only_with: bytes | None = None
        self._random = random.Random(0)
        self.silenced = 0  # connections gone silent by ``blackhole_when``
        self.dropped = 0  # chunks lost by ``drop``

    @property
    def open_connections(self) -> int:
        return len(self._links)

    @property
    def blackholed(self) -> bool:
        return not self._flowing.is_set()

    async def start(self) -> FaultProxy:
        self._server = await asyncio.start_server(self._serve, HOST, 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def close(self) -> None:
        self.heal()
        self.cut()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def __aenter__(self) -> FaultProxy:
        return await self.start()

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    def cut(self) -> int:
        """Reset every open connection, both sides; returns how many there were."""
        links, self._links = self._links, set()
        for link in links:
            link.reset()
        return len(links)

    def blackhole(self) -> None:
        self._flowing.clear()

    def heal(self) -> None:
        self._flowing.set()
        self._drop_probability = 0.0

    def blackhole_when(self, *markers: bytes, half_close: bool = False) -> None:
        """Silence, for good, the first connection whose client sends a chunk
        holding every one of ``markers`` (with ``half_close``, FIN its server side)."""
        self._markers, self._half_close_marked = markers, half_close

    def drop(self, probability: float, seed: int = 0, only_with: bytes | None = None) -> None:
        """Lose each chunk (only client chunks holding ``only_with``, if given) with
        ``probability`` until ``heal()``."""
        self._random = random.Random(seed)
        self._drop_probability, self._drop_only_with = probability, only_with

    def half_close(self) -> int:
        """FIN to the server side of every open connection; its client hears
        nothing more. Returns how many there were."""
        links = [link for link in self._links if len(link.writers) == 2]
        for link in links:
            link.silent = True
            with contextlib.suppress(OSError, RuntimeError):
                link.writers[1].write_eof()
        return len(links)

    def _lost(self, link: _Link, chunk: bytes, from_client: bool) -> bool:
        """Whether ``chunk`` is swallowed (and, on a marker, its link silenced)."""
        if link.silent:
            return True
        markers = self._markers
        if from_client and markers and all(marker in chunk for marker in markers):
            self._markers = ()
            link.silent = True
            self.silenced += 1
            if self._half_close_marked:
                with contextlib.suppress(OSError, RuntimeError):
                    link.writers[1].write_eof()
            return True
        if not self._drop_probability:
            return False
        only_with = self._drop_only_with
        if only_with is not None and not (from_client and only_with in chunk):
            return False
        if self._random.random() < self._drop_probability:
            self.dropped += 1
            return True
        return False

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        link = _Link(writer)
        self._links.add(link)
        try:
            # A connection made during a blackhole is held, not refused.
            await self._flowing.wait()
            up_reader, up_writer = await asyncio.open_connection(*self.target)
            link.writers.append(up_writer)
            if link not in self._links:  # cut while connecting
                link.reset()
                return
            link.tasks = [
                asyncio.create_task(self._pump(link, reader, up_writer, True)),
                asyncio.create_task(self._pump(link, up_reader, writer, False)),
            ]
            await asyncio.wait(link.tasks, return_when=asyncio.FIRST_COMPLETED)
            if link.silent:
                # Silenced: its client keeps an open socket that says nothing, whatever
                # the server side did, until the client hangs up (or a cut).
                await link.tasks[0]
        except (OSError, asyncio.CancelledError):
            pass
        finally:
            if link in self._links:
                self._links.discard(link)
                link.reset()

    async def _pump(
        self,
        link: _Link,
        source: asyncio.StreamReader,
        sink: asyncio.StreamWriter,
        from_client: bool,
    ) -> None:
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            while chunk := await source.read(CHUNK):
                # Blackholed: hold what was read; TCP's buffers hold the rest.
                await self._flowing.wait()
                if self._lost(link, chunk, from_client):
                    continue
                sink.write(chunk)
                await sink.drain()


class ThreadedProxy:
    """A ``FaultProxy`` on an event loop of its own thread, driven from synchronous code."""

    def __init__(self, target_host: str = HOST, target_port: int = 5432) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self.proxy = self._call(self._make(target_host, target_port))
        self.port = self.proxy.port

    async def _make(self, host: str, port: int) -> FaultProxy:
        return await FaultProxy(host, port).start()

    def _call(self, coroutine: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout=30)

    async def _do(self, action: str) -> Any:
        return getattr(self.proxy, action)()

    def cut(self) -> int:
        return int(self._call(self._do("cut")))

    def blackhole(self) -> None:
        self._call(self._do("blackhole"))

    def heal(self) -> None:
        self._call(self._do("heal"))

    def blackhole_when(self, *markers: bytes) -> None:
        self._call(self._on_loop(self.proxy.blackhole_when, *markers))

    def blackhole_when_half_closed(self, *markers: bytes) -> None:
        self._call(self._on_loop(self.proxy.blackhole_when, *markers, half_close=True))

    def drop(self, probability: float, seed: int = 0, only_with: bytes | None = None) -> None:
        self._call(self._on_loop(self.proxy.drop, probability, seed, only_with))

    def half_close(self) -> int:
        return int(self._call(self._do("half_close")))

    async def _on_loop(self, action: Any, *arguments: Any, **keywords: Any) -> Any:
        return action(*arguments, **keywords)

    @property
    def open_connections(self) -> int:
        return self.proxy.open_connections

    def close(self) -> None:
        try:
            self._call(self.proxy.close())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
            self._loop.close()

    def __enter__(self) -> ThreadedProxy:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


async def _obey(proxy: FaultProxy) -> None:
    """The separate-process mode: one command per stdin line, one answer per line."""
    print(f"port {proxy.port}", flush=True)
    while line := await asyncio.to_thread(sys.stdin.readline):
        command = line.strip()
        if command == "cut":
            print(f"cut {proxy.cut()}", flush=True)
        elif command in ("blackhole", "heal"):
            getattr(proxy, command)()
            print(command, flush=True)
        elif command.startswith("drop "):
            proxy.drop(float(command.split()[1]))
            print("drop", flush=True)
        elif command == "half-close":
            print(f"half-closed {proxy.half_close()}", flush=True)
        elif command == "count":
            print(f"open {proxy.open_connections} accepted {proxy.accepted}", flush=True)
        elif command == "quit":
            break
        else:
            print(f"unknown {command!r}", flush=True)


async def _main(target_host: str, target_port: int) -> None:
    async with FaultProxy(target_host, target_port) as proxy:
        await _obey(proxy)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--target-host", default=HOST)
    parser.add_argument("--target-port", type=int, default=5432)
    arguments = parser.parse_args()
    asyncio.run(_main(arguments.target_host, arguments.target_port))
