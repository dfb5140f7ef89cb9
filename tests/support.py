"""Plain helpers shared by several test files (fixtures live in ``conftest.py``).

Rows written "behind jobrun's back" go through the engine on SQL backends and
into ``store.runs`` on the memory store (``engine`` is None there).
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import inspect
import json
import os
import queue
import random
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import pytest
from sqlalchemy import insert, text, update
from sqlalchemy import inspect as inspect_schema
from sqlalchemy.ext.asyncio import AsyncEngine

import jobrun
import jobrun.worker.serving as worker_module
from jobrun._core.engine.observe import PassEnd, PassStart
from jobrun._core.leases.holders import HolderIdentity
from jobrun._core.model.formats import add_milliseconds, format_instant
from jobrun._core.model.records import ClaimRequest, RunRow, StepRow
from jobrun._host.system import local_identity
from jobrun.sql.schema import job_runs as runs_table
from jobrun.sql.upgrades.migrate import current_revision
from jobrun.testing import FakeClock, MemoryJobRunStore

REPO = Path(__file__).resolve().parents[1]
ALEMBIC = Path(sys.executable).with_name("alembic")
JOBRUN = Path(sys.executable).with_name("jobrun")
DRIVERS_CHILD = Path(__file__).parent / "processes" / "drivers_child.py"
IN_CI = bool(os.environ.get("CI"))
# The job ``start`` starts and ``registry_for`` registers unless a test names another.
MODULE_ID, JOB = "crm", "import"
SQL_BACKENDS = [
    pytest.param("sqlite", id="sqlite"),
    pytest.param("postgres", id="postgres", marks=pytest.mark.postgres),
]
T = TypeVar("T")


def run_in_thread(make: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run a coroutine to completion on a private loop, from sync or async code alike."""
    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(lambda: asyncio.run(make())).result()


# The kill -9 suite's schedule: JOBRUN_CRASH_SEED if set, else fixed under CI (so CI
# replays one schedule), else drawn once per session. The report header shows it.
CI_CRASH_SEED = 20261201
CRASH_SEED = int(
    os.environ.get("JOBRUN_CRASH_SEED")
    or (CI_CRASH_SEED if os.environ.get("CI") else random.SystemRandom().randrange(2**32))
)


def fixed_random() -> float:
    """Jitter factor exactly 1.0 (0.8 + 0.5 * 0.4), so backoff is predictable."""
    return 0.5


def iso(moment: datetime) -> str:
    """Stored timestamp text, written out independently of jobrun's formatter."""
    utc = moment.astimezone(UTC)
    return utc.strftime("%Y-%m-%dT%H:%M:%S.") + f"{utc.microsecond // 1000:03d}Z"


async def start(store: Any, clock: FakeClock | None = None, **kw: Any) -> jobrun.JobRun:
    """Start a run of ``MODULE_ID``/``JOB`` unless ``module_id``/``job`` say otherwise
    (on the real clock when ``clock`` is None)."""
    kw.setdefault("module_id", MODULE_ID)
    kw.setdefault("job", JOB)
    return await jobrun.start_job_run(store, clock=clock, **kw)


async def start_id(store: Any, clock: FakeClock | None = None, **kw: Any) -> str:
    """The id of a run started as ``start`` starts it."""
    return (await start(store, clock, **kw)).id


def registry_for(handler: Any, retry: jobrun.RetryPolicy | None = None) -> jobrun.JobRegistry:
    """A registry whose one job, ``MODULE_ID``/``JOB``, is ``handler``."""
    registry = jobrun.JobRegistry()
    registry.register(MODULE_ID, JOB, handler, retry=retry)
    return registry


async def drive(
    store: Any, registry: jobrun.JobRegistry, clock: FakeClock, **options: Any
) -> jobrun.JobDriveReport:
    """``run_due_jobs`` with a jitter factor of exactly 1.0 unless ``random`` is given."""
    options.setdefault("random", fixed_random)
    return await jobrun.run_due_jobs(store, registry, clock=clock, **options)


async def snapshot(store: Any, run_id: str) -> tuple[RunRow | None, dict[str, StepRow]]:
    """A run's row and its step ledger, as the store has them now."""
    return await store.get(run_id), await store.steps(run_id)


async def row_of(store: Any, run_id: str) -> RunRow:
    row = await store.get(run_id)
    assert row is not None
    return row


def sized_store(store: Any, engine: AsyncEngine | None, **limits: int) -> Any:
    """A store of the same backend with other size caps."""
    if engine is None:
        return MemoryJobRunStore(jobrun.StoreLimits(**limits))
    return jobrun.SqlJobRunStore(engine, **limits)


def hand_made_row(
    index: int,
    *,
    module_id: str = "elsewhere",
    job: str = "theirs",
    at: str = "2025-12-31T00:00:00.000Z",
) -> RunRow:
    """A due, running row whose id sorts before every minted ULID, in ``index`` order.

    By default its job is one no test registers.
    """
    return RunRow(
        id=f"{index:026d}",
        module_id=module_id,
        job=job,
        instance=f"i{index}",
        payload="null",
        status="running",
        cursor=None,
        counters="{}",
        attempts=0,
        last_error=None,
        started_at=at,
        updated_at=at,
        next_attempt_at=None,
        ended_at=None,
    )


COLUMNS_0006 = ("job_version", "cancelled", "error_origin")
"""The run columns revision 0006 adds (a test writing rows at 0005 leaves them out)."""
COLUMNS_0009 = ("paused_at", "pause_reason")
"""The run columns revision 0009 adds (a test writing rows at 0008 or before leaves them out)."""
COLUMNS_0010 = ("lease_boot_id", "lease_boot_expires_ms")
"""The run columns revision 0010 adds (a test writing rows at 0009 or before leaves them out)."""


def row_values(row: RunRow, *, without: Sequence[str] = ()) -> dict[str, Any]:
    """``row`` as column values, less the columns ``without`` (those an older revision
    under test does not have yet)."""
    return {name: getattr(row, name) for name in row.__dataclass_fields__ if name not in without}


async def insert_values(engine: AsyncEngine, table: str, rows: list[dict[str, Any]]) -> None:
    """Insert ``rows`` (column values, all with the same columns) into ``table`` by name,
    as a writer that knows only those columns would."""
    columns = list(rows[0])
    statement = text(
        f"INSERT INTO {table} ({', '.join(columns)}) "
        f"VALUES ({', '.join(':' + column for column in columns)})"
    )
    async with engine.begin() as connection:
        await connection.execute(statement, rows)


async def table_rows(engine: AsyncEngine, table: str, columns: str) -> list[tuple[Any, ...]]:
    """``columns`` (SQL text) of every row of ``table``, by id: what a migration kept."""
    async with engine.connect() as connection:
        found = await connection.execute(text(f"SELECT {columns} FROM {table} ORDER BY id"))
        return [tuple(row) for row in found]


async def table_names(engine: AsyncEngine) -> set[str]:
    """The tables of the database (as a migration left them)."""
    async with engine.connect() as connection:
        return set(await connection.run_sync(lambda sync: inspect_schema(sync).get_table_names()))


async def column_names(engine: AsyncEngine, table: str) -> set[str]:
    """The columns of ``table`` (as a migration left them)."""
    async with engine.connect() as connection:
        return await connection.run_sync(
            lambda sync: {column["name"] for column in inspect_schema(sync).get_columns(table)}
        )


async def put_rows(store: Any, engine: AsyncEngine | None, rows: list[RunRow]) -> None:
    """Write whole run rows behind jobrun's back."""
    if not rows:
        return
    if engine is None:
        for row in rows:
            store.runs[row.id] = row
        return
    async with engine.begin() as connection:
        await connection.execute(insert(runs_table), [dataclasses.asdict(row) for row in rows])


async def set_columns(store: Any, engine: AsyncEngine | None, run_id: str, **values: Any) -> None:
    """Overwrite columns of one row behind jobrun's back."""
    if engine is None:
        store.runs[run_id] = dataclasses.replace(store.runs[run_id], **values)
        return
    async with engine.begin() as connection:
        await connection.execute(
            update(runs_table).where(runs_table.c.id == run_id).values(**values)
        )


def spawn_worker(app: str, *args: str) -> subprocess.Popen[str]:
    """``jobrun worker --app APP ...`` as a user starts it at the repository root;
    its output is piped."""
    return subprocess.Popen(
        [str(JOBRUN), "worker", "--app", app, *args],
        cwd=REPO,
        env=dict(os.environ, PYTHONPATH=str(REPO)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def unused_pid() -> int:
    """A pid no process has on this host right now (the highest free one)."""
    limit = int(Path("/proc/sys/kernel/pid_max").read_text(encoding="ascii"))
    for pid in range(limit - 1, 1, -1):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return pid
        except OSError:
            continue
    raise AssertionError("no free pid")


def proc_identity() -> HolderIdentity:
    """This process's holder identity; skips the test where no ``/proc`` could prove a death."""
    if not Path("/proc/self/stat").exists():
        pytest.skip("this host has no /proc to prove a death with")
    here = local_identity()
    # With /proc every field is learnt: a missing one would make every death unprovable.
    assert None not in (here.boot, here.pid_namespace, here.pid, here.start_ticks), here
    return here


def dead_driver() -> str:
    """A ``lease_driver`` text whose holder is provably dead on this host."""
    return dataclasses.replace(proc_identity(), host="x", pid=unused_pid(), start_ticks=1).describe(
        "dead"
    )


async def revision_of(engine: AsyncEngine) -> str | None:
    """The database's current migration revision (None before the first)."""
    async with engine.connect() as connection:
        return await connection.run_sync(current_revision)


async def query_plan(connection: Any, statement: str, parameters: Any = ()) -> str:
    """How the database would run ``statement``: SQLite's or Postgres's plan, as text."""
    prefix = "EXPLAIN QUERY PLAN " if connection.dialect.name == "sqlite" else "EXPLAIN "
    rows = await connection.exec_driver_sql(prefix + statement, parameters)
    # SQLite: (id, parent, notused, detail); Postgres: one line of text per row.
    return "\n".join(str(row[-1]) for row in rows)


async def run_alembic(
    *args: str, env: dict[str, str], cwd: Path = REPO, timeout_s: float = 60
) -> tuple[int, str]:
    """``alembic ...`` as a user would type it in ``cwd`` (the repository root unless
    given): exit code, output."""
    process = await asyncio.create_subprocess_exec(
        str(ALEMBIC),
        *args,
        cwd=cwd,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    output, _ = await asyncio.wait_for(process.communicate(), timeout=timeout_s)
    return process.returncode or 0, output.decode()


class StatementLog:
    """A ``statement_hook`` that records every statement a store sends, as
    ``(operation, sql, parameters)``; ``before``/``after`` (if set) run around each one."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str, Sequence[Any]]] = []
        self.before: Any = None
        self.after: Any = None

    @asynccontextmanager
    async def __call__(
        self, operation: str, sql: str, parameters: Sequence[Any]
    ) -> AsyncIterator[None]:
        self.seen.append((operation, sql, parameters))
        if self.before is not None:
            await self.before(operation, sql)
        yield
        if self.after is not None:
            await self.after(operation, sql)

    def sql(self, containing: str = "") -> list[str]:
        return [sql for _, sql, _ in self.seen if containing in sql]


class RecordingStore:
    """Wraps a store: every call passes through, and each coroutine method called is
    recorded by name, in order, before it runs (``calls``), with what it returned
    (``results[name]``). ``after[name]``, if set, is awaited with the call's arguments
    once the call has returned."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.calls: list[str] = []
        self.results: collections.defaultdict[str, list[Any]] = collections.defaultdict(list)
        self.after: dict[str, Callable[..., Awaitable[None]]] = {}

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.inner, name)
        if not inspect.iscoroutinefunction(method):
            return method

        async def recorded(*args: Any, **kwargs: Any) -> Any:
            self.calls.append(name)
            result = await method(*args, **kwargs)
            self.results[name].append(result)
            if name in self.after:
                await self.after[name](*args, **kwargs)
            return result

        return recorded

    def count(self, name: str) -> int:
        return self.calls.count(name)

    def only(self, *names: str) -> list[str]:
        """The calls to any of ``names``, in order."""
        return [call for call in self.calls if call in names]


def logged_store(engine: AsyncEngine, **options: Any) -> tuple[jobrun.SqlJobRunStore, StatementLog]:
    """A SQL store on ``engine`` whose statements are recorded (the path users run)."""
    log = StatementLog()
    return jobrun.SqlJobRunStore(engine, statement_hook=log, **options), log


def log_worker_statements(monkeypatch: pytest.MonkeyPatch) -> StatementLog:
    """Every statement of the stores ``run_worker`` builds, through the store's own hook."""
    log = StatementLog()

    # A subclass, not a partial: run_worker also asks isinstance(database, SqlJobRunStore)
    # (so give it engines or URLs, not stores of your own).
    class LoggedStore(jobrun.SqlJobRunStore):
        def __init__(self, engine: AsyncEngine, **options: Any) -> None:
            super().__init__(engine, statement_hook=log, **options)

    monkeypatch.setattr(worker_module, "SqlJobRunStore", LoggedStore)
    return log


async def claim_as(
    store: Any,
    clock: Any,
    token: str,
    *,
    driver: str = "dead-host:1",
    lease_ms: int = 1000,
    job: tuple[str, str] = ("m", "j"),
) -> RunRow | None:
    """Claim through the store port like a driver that then does nothing else."""
    now_at = format_instant(clock())
    claimed = await store.claim(
        ClaimRequest(now_at, token, driver, {job: add_milliseconds(now_at, lease_ms)})
    )
    return None if claimed is None else claimed.row


async def done_at_once(p: jobrun.JobPass) -> jobrun.PassResult:
    """A handler whose run is done after one pass."""
    return jobrun.PassResult(done=True)


class PassEnds:
    """An observer that keeps every pass's start and end."""

    def __init__(self) -> None:
        self.starts: list[PassStart] = []
        self.ends: list[PassEnd] = []

    def pass_started(self, start: PassStart) -> PassEnds:
        self.starts.append(start)
        return self

    def step_started(self, name: str) -> None:
        return None

    def step_ended(self, end: object) -> None:
        return None

    def pass_ended(self, end: PassEnd) -> None:
        self.ends.append(end)


class Child:
    """A driver process and the JSON events it prints."""

    def __init__(
        self,
        name: str,
        url: str,
        logs: Path,
        *options: str,
        script: Path = DRIVERS_CHILD,
        env: dict[str, str] | None = None,
    ) -> None:
        self.name = name
        self._stderr_path = logs / f"{name}.stderr"
        self._stderr = self._stderr_path.open("w")
        self.process = subprocess.Popen(
            [sys.executable, str(script), "--url", url, "--name", name, *options],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            text=True,
            env=env,
        )
        self.events: list[dict[str, Any]] = []
        self._queue: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            try:
                self._queue.put(json.loads(line))
            except json.JSONDecodeError:
                self._queue.put({"event": "garbage", "line": line})
        self._queue.put(None)

    def stderr(self) -> str:
        self._stderr.flush()
        return self._stderr_path.read_text()[-3000:]

    def wait_for(
        self, event: str, timeout: float, where: Callable[[dict[str, Any]], bool] = lambda _: True
    ) -> dict[str, Any]:
        for seen in self.events:
            if seen["event"] == event and where(seen):
                return seen
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            try:
                item = self._queue.get(timeout=left)
            except queue.Empty:
                break
            if item is None:
                self._queue.put(None)
                break
            self.events.append(item)
            if item["event"] == event and where(item):
                return item
        raise AssertionError(
            f"{self.name}: no {event!r} event within {timeout} s "
            f"(exit code {self.process.poll()}); events {self.events[-5:]}; "
            f"stderr:\n{self.stderr()}"
        )

    def report(self, timeout: float = 100) -> dict[str, Any]:
        found = self.wait_for("report", timeout)
        assert self.process.wait(timeout=10) == 0, self.stderr()
        return found

    def go(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write("go\n")
        self.process.stdin.flush()

    def stop(self) -> None:
        if self.process.poll() is None:
            # Resume first: a stopped process does not die of SIGKILL until it runs.
            self.process.send_signal(signal.SIGCONT)
            self.process.kill()
        self.process.wait(timeout=10)
        self._reader.join(timeout=5)
        for stream in (self.process.stdin, self.process.stdout):
            if stream is not None:
                stream.close()
        self._stderr.close()


class Fleet:
    """Starts children and always kills them."""

    def __init__(self, url: str, logs: Path) -> None:
        self.url = url
        self.logs = logs
        self.children: list[Child] = []

    def start(self, name: str, *options: str, script: Path = DRIVERS_CHILD) -> Child:
        child = Child(name, self.url, self.logs, *options, script=script)
        self.children.append(child)
        return child

    def stop_all(self) -> None:
        for child in self.children:
            child.stop()


def assert_walks_index_in_order(plan: str, index: str) -> None:
    """A Postgres claim plan reads ``index`` in order under a ``Limit``: any ``Sort`` in it
    ranks only the bounded window the limit let through (the one-statement claim ranks
    its locked rows), never the table; and no sequential scan of the runs."""
    lines = plan.splitlines()
    pattern = re.compile(rf"Index (Only )?Scan using {index}\b")
    scans = [number for number, line in enumerate(lines) if pattern.search(line)]
    assert scans, plan
    limits = [number for number, line in enumerate(lines[: scans[0]]) if "Limit" in line]
    assert limits, plan
    between = lines[limits[-1] : scans[0]]
    assert not any(re.search(r"\bSort\b", line) for line in between), plan
    assert "Seq Scan on _substrat_job_runs" not in plan, plan


def stored_index_ddl(connection: Any, tables: Sequence[str]) -> dict[str, str]:
    """Each index of ``tables`` (primary keys aside) as the database keeps it, in the
    spelling SQLAlchemy compiles the metadata's: SQLite's ``sqlite_master`` keeps the
    statement's text; Postgres's ``pg_indexes`` renders the stored definition, with
    a schema, ``USING btree``, ``::text`` casts, brackets round the predicate and
    each of its terms, and upper-case function names, taken off here."""
    if connection.dialect.name == "sqlite":
        query = "SELECT name, sql FROM sqlite_master WHERE type = 'index' AND sql IS NOT NULL"
    else:
        names = ", ".join(f"'{table}'" for table in sorted(tables))
        query = (
            "SELECT indexname, indexdef FROM pg_indexes "
            f"WHERE tablename IN ({names}) AND right(indexname, 5) <> '_pkey'"
        )
    stored = {}
    for name, ddl in connection.exec_driver_sql(query):
        ddl = " ".join(ddl.split()).replace(" ON public.", " ON ").replace(" USING btree", "")
        ddl = re.sub(r" WHERE \((.*)\)$", r" WHERE \1", re.sub(r"::[a-z ]+", "", ddl))
        ddl = unbracketed_terms(ddl)
        stored[name] = re.sub(r"\b[A-Z_]+(?=\()", lambda function: function[0].lower(), ddl)
    return stored


def unbracketed_terms(predicate: str) -> str:
    """A predicate of several terms as the metadata spells it: Postgres stores
    ``(a = 'x') AND (b IS NOT NULL)`` for ``a = 'x' AND b IS NOT NULL``."""
    return re.sub(r"\((\w+ (?:= '[^']*'|IS (?:NOT )?NULL))\)", r"\1", predicate)
