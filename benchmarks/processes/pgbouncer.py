"""A PgBouncer of the checks' own, and how jobrun's engines connect through it.

The PgBouncer: an ini in a temporary directory, one free port, never a service.
Started in the foreground as a child process (as the ``postgres`` user when run as
root, which PgBouncer refuses to be), in front of the Postgres server a direct URL
names, with ``auth_type = trust`` and the pool mode asked for; stopped and its
directory removed at the end. Its admin console is reached with ``psql``, as it
speaks the simple query protocol only.

The engines: ``SAFE_CONNECT_ARGS`` are what a transaction pooler without
prepared-statement support (PgBouncer before 1.21, or without
``max_prepared_statements``) needs from asyncpg and SQLAlchemy.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from sqlalchemy import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

import jobrun
from benchmarks.harness import plain_url

SAFE_CONNECT_ARGS: dict[str, Any] = {
    # asyncpg: unnamed statements, parsed and run in one turn on one server connection.
    "statement_cache_size": 0,
    # SQLAlchemy's own statements (migrations, the schema check): no cache, and names
    # no other client can have used on the same server connection.
    "prepared_statement_cache_size": 0,
    "prepared_statement_name_func": lambda: f"__asyncpg_{uuid.uuid4()}__",
}


@dataclass(frozen=True)
class Target:
    """Where a check connects (``url``: direct or through PgBouncer), whether with
    ``SAFE_CONNECT_ARGS``, and the same database's direct URL (for looking behind)."""

    url: str
    safe: bool
    direct: str


def engine_for(target: Target, **engine_options: Any) -> AsyncEngine:
    connect_args = dict(SAFE_CONNECT_ARGS) if target.safe else {}
    return create_async_engine(target.url, connect_args=connect_args, **engine_options)


@contextlib.asynccontextmanager
async def stores(
    target: Target, count: int = 1, **engine_options: Any
) -> AsyncIterator[list[jobrun.SqlJobRunStore]]:
    """``count`` stores on engines of their own (so drivers of their own), disposed after."""
    engines = [engine_for(target, **engine_options) for _ in range(count)]
    try:
        yield [jobrun.SqlJobRunStore(engine) for engine in engines]
    finally:
        for engine in engines:
            await engine.dispose()


INI = """\
[databases]
* = host={host} port={port}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {listen_port}
unix_socket_dir =
auth_type = trust
auth_file = {directory}/userlist.txt
admin_users = {user}
pool_mode = {mode}
default_pool_size = {pool_size}
max_client_conn = 1000
logfile = {directory}/pgbouncer.log
pidfile = {directory}/pgbouncer.pid
ignore_startup_parameters = extra_float_digits
"""


def pgbouncer_binary() -> str | None:
    return shutil.which("pgbouncer") or next(
        (path for path in ("/usr/sbin/pgbouncer", "/usr/bin/pgbouncer") if Path(path).exists()),
        None,
    )


def port_is_free(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) != 0


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def psql(url: str, statement: str) -> str:
    """One statement with psql, what it printed (PgBouncer's console speaks the simple
    query protocol only)."""
    command = ["psql", plain_url(url), "-At", "-c", statement]
    return subprocess.run(command, capture_output=True, text=True, check=False).stdout


class PgBouncer:
    """``with PgBouncer(url, port, ...) as bouncer:`` ... ``bouncer.url(database)``."""

    def __init__(self, server_url: str, port: int, pool_size: int, mode: str = "transaction"):
        self.server = make_url(server_url)
        self.port = port
        self.pool_size = pool_size
        self.mode = mode
        self.directory = Path(tempfile.mkdtemp(prefix="jobrun-pgbouncer-"))
        self.process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> PgBouncer:
        binary = pgbouncer_binary()
        if binary is None:
            raise SystemExit("no pgbouncer here: apt-get install -y pgbouncer (not as a service)")
        if not port_is_free(self.port):
            raise SystemExit(f"port {self.port} is taken: pass another with --port")
        user = self.server.username or "postgres"
        (self.directory / "userlist.txt").write_text(f'"{user}" ""\n')
        ini = self.directory / "pgbouncer.ini"
        ini.write_text(
            INI.format(
                host=self.server.host or "127.0.0.1",
                port=self.server.port or 5432,
                listen_port=self.port,
                directory=self.directory,
                user=user,
                mode=self.mode,
                pool_size=self.pool_size,
            )
        )
        command = [binary, str(ini)]
        if os.geteuid() == 0:
            # PgBouncer will not run as root; its files must be the user's then.
            owner = pwd.getpwnam("postgres")
            for path in [self.directory, *self.directory.iterdir()]:
                os.chown(path, owner.pw_uid, owner.pw_gid)
            command = [binary, "-u", "postgres", str(ini)]
        # Its output goes to a file: a pipe nobody reads fills up and stops PgBouncer.
        with (self.directory / "stderr.log").open("wb") as output:
            self.process = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT)
        self._wait_listening()
        return self

    def _wait_listening(self) -> None:
        deadline = time.monotonic() + 10
        while port_is_free(self.port):
            assert self.process is not None
            if self.process.poll() is not None or time.monotonic() > deadline:
                output = (self.directory / "stderr.log").read_text(errors="replace")
                raise SystemExit(f"pgbouncer did not start: {output}{self.log()}")
            time.sleep(0.05)  # poll interval while PgBouncer binds its port

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        if self.process is not None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        shutil.rmtree(self.directory, ignore_errors=True)

    def url(self, database: str) -> str:
        """The asyncpg URL of ``database`` through this PgBouncer."""
        through = self.server.set(host="127.0.0.1", port=self.port, database=database)
        return through.render_as_string(hide_password=False)

    def admin(self, command: str) -> str:
        """Run ``command`` on the admin console; its output."""
        return psql(self.url("pgbouncer"), command)

    def version(self) -> str:
        binary = pgbouncer_binary()
        done = subprocess.run([str(binary), "--version"], capture_output=True, text=True)
        return done.stdout.split("\n")[0].removeprefix("PgBouncer ").strip()

    def log(self) -> str:
        path = self.directory / "pgbouncer.log"
        return path.read_text(errors="replace") if path.exists() else ""
