"""The child process of the kill -9 suite (``test_crash.py``); not a test module itself.

It drives one run of a paged walk until the run is done, and SIGKILLs itself at
the point its plan names: the Nth time it reaches that kind of point. Every step
body appends a line to an fsync'ed log before its effect, and every kill appends
one right before ``os.kill``, so the parent can tell afterwards exactly which
executions happened and how each one ended.

Usage: ``python tests/processes/crash_child.py '<json config>'`` (the parent builds the config).

Exit codes: 0 the run is done; 3 the run ended in another state; -9 (SIGKILL) as planned.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import json
import os
import random
import signal
import sys
from collections.abc import AsyncIterator
from typing import Any

from sqlalchemy import Column, Integer, MetaData, Table, Text, insert
from sqlalchemy.ext.asyncio import create_async_engine

import jobrun

MODULE_ID = "@test/crash"
JOB = "walk"

# Where the child may kill itself. The parent knows which of them leave a
# step's effect without its ledger row (the at-least-once window).
KINDS = (
    "claim_after",  # the claim statement ran (a lone statement: committed)
    "body_before_effect",  # inside a step body, after its log line, before its effect
    "window_body",  # inside a step body, after its effect was committed
    "window_ledger_before",  # the body returned; the ledger write is about to execute
    "ledger_after",  # the ledger write executed (a lone statement: committed)
    "between_steps",  # a step returned (its ledger row committed); the next has not begun
    "commit_before",  # the pass commit is about to execute its ledger drop / CTE
    "commit_after",  # the pass commit executed (before COMMIT on SQLite; committed on Postgres)
    "failure_patch_before",  # the failure patch of a failed pass is about to execute
    "failure_patch_after",  # the failure patch executed (a lone statement: committed)
)

sink_metadata = MetaData()
# No key of any kind: a repeated effect shows up as a second row.
sink = Table(
    "crash_sink",
    sink_metadata,
    Column("object_id", Integer, nullable=False),
    Column("exec", Text, nullable=False),
)


class TransientError(Exception):
    """The failure the child injects on purpose; the retry policy lets the run go on."""


class Log:
    """An append-only file; every line is written in one call and fsync'ed."""

    def __init__(self, path: str, invocation: int) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._invocation = invocation

    def write(self, **record: Any) -> None:
        record["inv"] = self._invocation
        os.write(self._fd, (json.dumps(record, sort_keys=True) + "\n").encode())
        os.fsync(self._fd)


class Child:
    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config
        self.backend: str = config["backend"]
        self.run_id: str = config["run_id"]
        self.pages: int = config["pages"]
        self.page_size: int = config["page_size"]
        self.objects: int = config["objects"]
        self.steps_per_pass: int = config["steps_per_pass"]
        self.kill_kind: str | None = config["kill_kind"]
        self.kill_nth: int = config["kill_nth"]
        self.invocation: int = config["invocation"]
        self.random = random.Random(config["child_seed"])
        self.fail_rate: float = config["fail_rate"]
        self.log = Log(config["log_path"], self.invocation)
        self.seen = 0
        self.exec_numbers = itertools.count(1)
        # The body that returned and whose ledger write is pending: (exec id, page).
        self.pending: tuple[str, int] | None = None
        # Set when this pass raised its injected failure: the next run patch is the failure patch.
        self.failing = False
        self.fail_between: int | None = None
        self.fail_in_step: int | None = None
        self.engine = create_async_engine(config["url"])
        self.store = jobrun.SqlJobRunStore(self.engine, statement_hook=self.hook)

    # --- kill points -------------------------------------------------------------------

    def point(self, kind: str, **info: Any) -> None:
        if kind != self.kill_kind:
            return
        self.seen += 1
        if self.seen < self.kill_nth:
            return
        window = kind in ("window_body", "window_ledger_before")
        self.log.write(ev="kill", kind=kind, window=window, **info)
        os.kill(os.getpid(), signal.SIGKILL)

    def _pending_info(self) -> dict[str, Any]:
        assert self.pending is not None
        return {"exec": self.pending[0], "page": self.pending[1]}

    def before_sql(self, statement: str) -> None:
        if statement.startswith("INSERT INTO _substrat_job_steps"):
            if self.pending is not None:
                self.point("window_ledger_before", **self._pending_info())
        elif self._is_commit(statement):
            self.point("commit_before")
        elif self.failing and statement.startswith("UPDATE _substrat_job_runs SET status="):
            self.point("failure_patch_before")

    def after_sql(self, statement: str) -> None:
        if statement.startswith("INSERT INTO _substrat_job_steps"):
            if self.pending is not None:
                self.point("ledger_after", **self._pending_info())
        elif self._is_commit(statement):
            self.point("commit_after")
        elif self.failing and statement.startswith("UPDATE _substrat_job_runs SET status="):
            self.point("failure_patch_after")
        elif statement.startswith("UPDATE _substrat_job_runs SET attempts="):
            # The claim (it is the only write that starts this way).
            self.point("claim_after")

    def _is_commit(self, statement: str) -> bool:
        if self.backend == "postgres":
            # One statement: the fenced UPDATE and the ledger DELETE as CTEs.
            return statement.startswith("WITH written AS")
        # Two statements in one transaction; the DELETE is the second.
        return statement.startswith("DELETE FROM _substrat_job_steps")

    @contextlib.asynccontextmanager
    async def hook(self, _operation: str, statement: str, _parameters: Any) -> AsyncIterator[None]:
        """The store's statement hook: the kill points sit on the path users run."""
        self.before_sql(statement)
        yield
        self.after_sql(statement)

    # --- the job -----------------------------------------------------------------------

    async def handler(self, job_pass: jobrun.JobPass) -> jobrun.PassResult:
        cursor: int = 0 if job_pass.cursor is None else job_pass.cursor
        self.failing = False
        self.pending = None
        await self._check_ledger(cursor)
        self._plan_failure()
        for index in range(self.steps_per_pass):
            page = cursor + index
            if page >= self.pages:
                break
            if self.fail_between == index:
                self.failing = True
                self.log.write(ev="fail", where="between", cursor=cursor, step=index)
                raise TransientError(f"injected before step {index} of page {cursor}")
            body = functools.partial(self.body, cursor, index, page)
            result = await job_pass.step(f"page-{index}", body)
            if self.pending is not None:
                # Only now is the step's ledger row known to be committed.
                self.log.write(ev="recorded", exec=self.pending[0])
                self.pending = None
            if result["page"] != page:
                self.log.write(ev="wrong_memo", cursor=cursor, step=index, got=result)
            job_pass.count("objects", result["count"])
            self.point("between_steps", cursor=cursor, step=index)
        next_page = cursor + self.steps_per_pass
        return jobrun.PassResult(cursor=next_page, done=next_page >= self.pages)

    async def body(self, cursor: int, index: int, page: int) -> dict[str, int]:
        exec_id = f"{self.invocation}.{next(self.exec_numbers)}"
        # Logged before the effect: the parent sees every execution, finished or not.
        self.log.write(
            ev="body", exec=exec_id, run=self.run_id, cursor=cursor, step=f"page-{index}", page=page
        )
        self.point("body_before_effect", exec=exec_id, page=page)
        if self.fail_in_step == index:
            self.failing = True
            self.log.write(ev="fail", where="step", exec=exec_id)
            raise TransientError(f"injected in step {index} of page {cursor}")
        first = page * self.page_size
        rows = [
            {"object_id": number, "exec": exec_id}
            for number in range(first, min(first + self.page_size, self.objects))
        ]
        async with self.engine.begin() as connection:
            await connection.execute(insert(sink), rows)
        self.pending = (exec_id, page)
        self.point("window_body", exec=exec_id, page=page)
        return {"page": page, "count": len(rows)}

    async def _check_ledger(self, cursor: int) -> None:
        """The ledger holds this pass's steps only: never more, never an older pass's memo."""
        ledger = await self.store.steps(self.run_id)
        stale = []
        for name, row in ledger.items():
            if row.result is None:
                continue
            index = int(name.removeprefix("page-"))
            if json.loads(row.result)["page"] != cursor + index:
                stale.append(name)
        self.log.write(ev="pass", cursor=cursor, ledger=len(ledger), stale=stale)

    def _plan_failure(self) -> None:
        self.fail_between = self.fail_in_step = None
        if self.random.random() >= self.fail_rate:
            return
        where = self.random.randrange(self.steps_per_pass)
        if self.random.random() < 0.5:
            self.fail_in_step = where
        else:
            self.fail_between = where

    # --- the driver --------------------------------------------------------------------

    async def drive(self) -> int:
        registry = jobrun.JobRegistry()
        registry.register(
            MODULE_ID,
            JOB,
            self.handler,
            # Injected failures and takeovers charge attempts; neither may end the run.
            retry=jobrun.RetryPolicy(max_attempts=1_000_000, base_delay_ms=0),
            # None: the library's default lease (a minute), so only proven death
            # lets the next child go on without waiting.
            **({} if self.config["lease_ms"] is None else {"lease_ms": self.config["lease_ms"]}),
            max_takeovers=1_000_000,
        )
        if self.config["release"]:
            # The parent saw the previous child die: its lease can go at once.
            await jobrun.release_job_lease(self.store, self.run_id)
        while True:
            run = await jobrun.get_job_run(self.store, self.run_id)
            assert run is not None
            if run.status == "done":
                return 0
            if run.status != "running":
                self.log.write(ev="ended", status=run.status, last_error=run.last_error)
                return 3
            report = await jobrun.run_due_jobs(
                self.store, registry, limit=1, max_passes=self.config["max_passes"]
            )
            if report.superseded:
                self.log.write(ev="superseded", count=report.superseded)
            if report.attempted == 0:
                # The dead child's lease has not expired yet.
                await asyncio.sleep(0.02)


async def main(config: dict[str, Any]) -> int:
    child = Child(config)
    try:
        return await child.drive()
    finally:
        await child.engine.dispose()


if __name__ == "__main__":
    sys.exit(asyncio.run(main(json.loads(sys.argv[1]))))
