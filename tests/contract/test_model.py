"""A model of the pass state machine, checked against the real stores by hypothesis.

The model below is a few dozen lines of plain Python that say what a run and its
step ledger must look like after each operation: starts (new or joined), drives
with limits and pass budgets whose handlers follow drawn plans (steps that
succeed or fail, with the job's policy or their own; a handler error; a cursor
moved, kept, or the run done; a Ctrl-C), clock advances, operator cancel and
resume. After every rule each run row and ledger the store holds must equal the
model's, field by field, and the step bodies called must be exactly those the
model predicts (a recorded step is never called again).
"""

from __future__ import annotations

import asyncio
import json
import shutil
import tempfile
from collections import deque
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    invariant,
    rule,
    run_state_machine_as_test,
)
from sqlalchemy.ext.asyncio import create_async_engine

import jobrun
from jobrun._core.model.records import RunRow, StepRow
from jobrun.testing import FakeClock, MemoryJobRunStore
from tests.support import iso

MODULE = "model"
JOB = "walk"
INSTANCES = ["a", "b", "c"]
STEP_NAMES = ["x", "y", "z"]
JOB_POLICY = jobrun.RetryPolicy(max_attempts=3, base_delay_ms=1000, max_delay_ms=3000)
STEP_POLICY = jobrun.RetryPolicy(max_attempts=2, base_delay_ms=400, max_delay_ms=3000)
ENDINGS = ["advance", "keep", "done", "raise", "interrupt"]


def compact(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


@dataclass(frozen=True)
class PassPlan:
    """What the handler does in one pass."""

    steps: tuple[tuple[str, bool, bool], ...]  # (name, succeeds, own policy)
    count: int
    ending: str


DEFAULT_PLAN = PassPlan((), 0, "advance")

plans = st.builds(
    PassPlan,
    steps=st.lists(
        st.tuples(st.sampled_from(STEP_NAMES), st.booleans(), st.booleans()),
        max_size=3,
        unique_by=lambda step: step[0],
    ).map(tuple),
    count=st.integers(0, 2),
    ending=st.sampled_from(ENDINGS),
)


@dataclass
class ModelRun:
    row: RunRow
    ledger: dict[str, StepRow] = field(default_factory=dict)
    # Whether the last failure was an exception raised by a body or the handler
    # (the store then keeps where it was raised: RunRow.error_origin).
    raised: bool = False


def due_order(run: ModelRun) -> tuple[str, str]:
    """When the run became due, then its id: the order runs are claimed in."""
    return (run.row.next_attempt_at or run.row.started_at, run.row.id)


class Model:
    """The rules, as plainly as they can be said."""

    def __init__(self) -> None:
        self.runs: dict[str, ModelRun] = {}
        self.calls: list[tuple[str, str]] = []

    def live(self, instance: str) -> ModelRun | None:
        for run in self.runs.values():
            if run.row.instance == instance and run.row.status == "running":
                return run
        return None

    def drive(
        self, now: str, limit: int, max_passes: int, queue: deque[PassPlan]
    ) -> dict[str, int] | None:
        """The report's counts, or ``None`` when a pass was interrupted."""
        report = dict.fromkeys(["attempted", "advanced", "completed", "retrying", "failed"], 0)
        driven: set[str] = set()
        while report["attempted"] < limit:
            due = [
                run
                for run in self.runs.values()
                if run.row.status == "running"
                and (run.row.next_attempt_at or run.row.started_at) <= now
                and run.row.id not in driven
            ]
            if not due:
                break
            run = min(
                due, key=lambda run: (run.row.next_attempt_at or run.row.started_at, run.row.id)
            )
            driven.add(run.row.id)
            report["attempted"] += 1
            # Every claim raises the epoch, and so does every lease handed on.
            run.row = replace(run.row, lease_epoch=run.row.lease_epoch + 1)
            for number in range(max_passes):
                outcome = self.one_pass(run, queue.popleft() if queue else DEFAULT_PLAN, now)
                if outcome is None:
                    return None
                report[outcome] += 1
                if outcome != "advanced" or number + 1 >= max_passes:
                    break
                run.row = replace(run.row, lease_epoch=run.row.lease_epoch + 1)
        return report

    def one_pass(self, run: ModelRun, plan: PassPlan, now: str) -> str | None:
        row = run.row
        failure: tuple[jobrun.RetryPolicy, int, str] | None = None
        for name, succeeds, own in plan.steps:
            policy = STEP_POLICY if own else JOB_POLICY
            prior = run.ledger.get(name)
            if prior is not None and prior.result is not None:
                continue  # a memo: the body is not called
            if prior is not None and prior.attempts >= policy.max_attempts:
                cause = prior.last_error or "exhausted"
                failure = (policy, prior.attempts, f"step {name!r} failed: {cause}")
                break
            attempts = (prior.attempts if prior is not None else 0) + 1
            self.calls.append((row.id, name))
            if succeeds:
                run.ledger[name] = StepRow(name, compact(f"{name}!"), attempts, None)
                continue
            cause = f"RuntimeError: boom {name}"
            run.ledger[name] = StepRow(name, None, attempts, cause)
            failure = (policy, attempts, f"step {name!r} failed: {cause}")
            break
        if failure is None and plan.ending == "interrupt":
            # A real interruption (the pass's task cancelled): nothing recorded but
            # the ledger, the lease handed back; the drive stops there.
            run.row = replace(row, next_attempt_at=None)
            return None
        if failure is None and plan.ending == "raise":
            failure = (JOB_POLICY, row.attempts + 1, "RuntimeError: handler broke")
        if failure is not None:
            policy, against, text = failure
            exhausted = against >= policy.max_attempts
            delay_ms = min(policy.base_delay_ms * 2 ** (against - 1), policy.max_delay_ms)
            retry_at = datetime.fromisoformat(now.replace("Z", "+00:00")) + timedelta(
                milliseconds=delay_ms
            )
            run.row = replace(
                row,
                status="failed" if exhausted else "running",
                attempts=row.attempts + 1,
                last_error=text,
                updated_at=now,
                next_attempt_at=None if exhausted else iso(retry_at),
                ended_at=now if exhausted else None,
            )
            run.raised = True
            return "failed" if exhausted else "retrying"
        counters = json.loads(row.counters)
        if plan.count:
            counters["n"] = counters.get("n", 0) + plan.count
        cursor = row.cursor
        if plan.ending == "advance":
            cursor = compact((0 if row.cursor is None else json.loads(row.cursor)) + 1)
        done = plan.ending == "done"
        run.row = replace(
            row,
            status="done" if done else "running",
            cursor=cursor,
            counters=compact(counters),
            attempts=0,
            last_error=None,
            updated_at=now,
            next_attempt_at=None,
            ended_at=now if done else None,
            passes_committed=row.passes_committed + 1,
            job_version=1,  # a commit writes its code's version (unversioned: 1)
        )
        run.ledger = {}
        run.raised = False
        return "completed" if done else "advanced"

    def cancel(self, run_id: str, reason: str, now: str) -> bool:
        run = self.runs[run_id]
        if run.row.status != "running":
            return False
        run.row = replace(
            run.row,
            status="failed",
            last_error=f"cancelled: {reason}",
            updated_at=now,
            ended_at=now,
            next_attempt_at=None,
            cancelled=1,
        )
        run.raised = False
        return True

    def resume(self, run_id: str, now: str) -> str:
        run = self.runs[run_id]
        if run.row.status != "failed":
            return "not failed"
        if self.live(run.row.instance) is not None:
            return "key live"
        run.row = replace(
            run.row,
            status="running",
            attempts=0,
            updated_at=now,
            ended_at=None,
            next_attempt_at=None,
            cancelled=0,
        )
        run.raised = False
        run.ledger = {
            name: step if step.result is not None else replace(step, attempts=0)
            for name, step in run.ledger.items()
        }
        return "resumed"


class PassMachine(RuleBasedStateMachine):
    """The store under test against the model; ``backend`` is "memory" or "sqlite"."""

    backend = "memory"
    template: Path | None = None
    ids = Bundle("ids")

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.clock = FakeClock()
        self.model = Model()
        self.queue: deque[PassPlan] = deque()
        self.calls: list[tuple[str, str]] = []
        self.engine: Any = None
        self.directory: str | None = None
        if self.backend == "memory":
            self.store: Any = MemoryJobRunStore()
        else:
            assert self.template is not None
            self.directory = tempfile.mkdtemp(prefix="jobrun-model-")
            path = Path(self.directory) / "model.db"
            shutil.copyfile(self.template, path)
            self.engine = create_async_engine(f"sqlite+aiosqlite:///{path}")
            self.store = jobrun.SqlJobRunStore(self.engine)
        self.registry = jobrun.JobRegistry()
        self.registry.register(MODULE, JOB, self.handler, retry=JOB_POLICY)

    def run(self, coroutine: Any) -> Any:
        return self.loop.run_until_complete(coroutine)

    def now(self) -> str:
        return iso(self.clock())

    async def handler(self, p: jobrun.JobPass) -> jobrun.PassResult:
        plan = self.queue.popleft() if self.queue else DEFAULT_PLAN
        for name, succeeds, own in plan.steps:

            def body(name: str = name, succeeds: bool = succeeds) -> str:
                self.calls.append((p.run.id, name))
                if not succeeds:
                    raise RuntimeError(f"boom {name}")
                return f"{name}!"

            assert await p.step(name, body, retry=STEP_POLICY if own else None) == f"{name}!"
        if plan.count:
            p.count("n", plan.count)
        if plan.ending == "advance":
            return jobrun.PassResult(cursor=(p.cursor or 0) + 1)
        if plan.ending == "done":
            return jobrun.PassResult(done=True)
        if plan.ending == "raise":
            raise RuntimeError("handler broke")
        if plan.ending == "interrupt":
            # A real interruption (Ctrl-C under asyncio.run, a host cancelling its
            # task): the pass's task is cancelled. (A KeyboardInterrupt the handler's
            # own code raises is a failed attempt instead.)
            task = asyncio.current_task()
            assert task is not None
            task.cancel()
            await asyncio.sleep(0)
        return jobrun.PassResult()

    # --- rules ---------------------------------------------------------------------------

    @rule(target=ids, instance=st.sampled_from(INSTANCES), payload=st.integers(0, 9))
    def start(self, instance: str, payload: int) -> str:
        live = self.model.live(instance)
        record = self.run(
            jobrun.start_job_run(
                self.store,
                module_id=MODULE,
                job=JOB,
                instance=instance,
                payload=payload,
                clock=self.clock,
            )
        )
        if live is not None:
            assert record.id == live.row.id, "a start did not join the live run"
            return record.id
        assert record.id not in self.model.runs
        now = self.now()
        self.model.runs[record.id] = ModelRun(
            RunRow(
                id=record.id,
                module_id=MODULE,
                job=JOB,
                instance=instance,
                payload=compact(payload),
                status="running",
                cursor=None,
                counters="{}",
                attempts=0,
                last_error=None,
                started_at=now,
                updated_at=now,
                next_attempt_at=None,
                ended_at=None,
            )
        )
        return record.id

    @rule(
        limit=st.integers(1, 3),
        max_passes=st.integers(1, 3),
        drawn=st.lists(plans, max_size=5),
    )
    def drive(self, limit: int, max_passes: int, drawn: list[PassPlan]) -> None:
        self.queue = deque(drawn)
        expected = self.model.drive(self.now(), limit, max_passes, deque(drawn))
        try:
            report = self.run(
                jobrun.run_due_jobs(
                    self.store,
                    self.registry,
                    limit=limit,
                    max_passes=max_passes,
                    clock=self.clock,
                    random=lambda: 0.5,
                )
            )
        except asyncio.CancelledError:
            assert expected is None, "the drive was interrupted where the model was not"
        else:
            assert expected is not None, "the model was interrupted where the drive was not"
            got = {name: getattr(report, name) for name in expected}
            assert got == expected
            assert report.superseded == 0
            failing = report.retrying + report.failed
            assert len(report.errors) == failing
        assert self.calls == self.model.calls

    @rule(milliseconds=st.sampled_from([0, 1, 399, 400, 1000, 2000, 5000]))
    def advance(self, milliseconds: int) -> None:
        self.clock.advance(milliseconds=milliseconds)

    @rule(run_id=ids)
    def cancel(self, run_id: str) -> None:
        expected = self.model.cancel(run_id, "by hand", self.now())
        cancelling = jobrun.cancel_job_run(self.store, run_id, "by hand", clock=self.clock)
        if expected:
            assert self.run(cancelling).status == "failed"
            return
        with pytest.raises(jobrun.JobConflictError) as refused:
            self.run(cancelling)
        assert refused.value.reason == "job_run_not_running"

    @rule(run_id=ids)
    def resume(self, run_id: str) -> None:
        expected = self.model.resume(run_id, self.now())
        resuming = jobrun.resume_job_run(self.store, run_id, clock=self.clock)
        if expected == "resumed":
            assert self.run(resuming).status == "running"
            return
        with pytest.raises(jobrun.JobConflictError) as refused:
            self.run(resuming)
        reason = "job_run_key_live" if expected == "key live" else "job_run_not_failed"
        assert refused.value.reason == reason

    # --- the store equals the model ------------------------------------------------------

    @invariant()
    def store_equals_model(self) -> None:
        self.run(self._compare())

    async def _compare(self) -> None:
        listed = await jobrun.job_runs(self.store, limit=500)
        assert sorted(record.id for record in listed) == sorted(self.model.runs)
        for run_id, run in self.model.runs.items():
            stored = await self.store.get(run_id)
            assert stored is not None
            # Where a failure was raised is a line of this file: the model says only
            # whether there is one (a failure raised by a body or the handler).
            assert (stored.error_origin is not None) == run.raised, stored.error_origin
            stored = replace(stored, error_origin=None)
            assert stored == run.row, f"run {run_id}: store {stored} != model {run.row}"
            assert await self.store.steps(run_id) == run.ledger
            record = await jobrun.get_job_run(self.store, run_id)
            assert record is not None
            assert record.decode_error is None
            assert record.cursor == (None if run.row.cursor is None else json.loads(run.row.cursor))
            assert record.lease_expires_at is None

    def teardown(self) -> None:
        try:
            if self.engine is not None:
                self.run(self.engine.dispose())
        finally:
            self.loop.close()
            if self.directory is not None:
                shutil.rmtree(self.directory, ignore_errors=True)


@pytest.mark.slow
@pytest.mark.parametrize("model_backend", ["memory", "sqlite"])
def test_the_store_follows_the_model(model_backend: str, sqlite_template: Path) -> None:
    machine = type(
        f"PassMachine_{model_backend}",
        (PassMachine,),
        {"backend": model_backend, "template": sqlite_template},
    )
    run_state_machine_as_test(
        machine,
        settings=settings(
            max_examples=30,
            stateful_step_count=20,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )
