"""kill -9: a long walk survives its driver being killed at any point, on SQLite and Postgres.

A child process (``crash_child.py``) walks about 6,000 objects (more with more
kills) in pages, one page per step and four steps per pass, the cursor being the
next page. Each step writes its page into ``crash_sink``, a table with no key,
so an effect that happened twice is a second row. The child SIGKILLs itself at a
point the parent chose from a seeded random source: in a step body before its
effect, after its effect but before its ledger row (the at-least-once window),
just after the ledger write, between steps, in the claim, in the pass commit,
and in the failure patch of a pass that failed on purpose. The parent restarts a
child after each kill (sometimes releasing the dead child's lease, sometimes
waiting for it to expire) until the run is done, then checks what the contract
promises:

* every object is in the sink, and every extra copy is explained by a kill in
  the at-least-once window (exactly: one more copy of the page per window);
* no step ran again once its ledger row had been committed (the log orders
  every execution and says how each ended: recorded, failed, or killed where);
* the run is ``done``, its counter equals the number of objects, its ledger is
  empty, and at no pass start did the ledger hold more than one pass's steps or
  a memo of an earlier pass.

Environment:

* ``JOBRUN_CRASH_SEED`` forces the schedule's seed (the pytest header and the test's
  output name the seed used); under CI (``CI`` set) the seed is fixed, so CI replays
  the same schedule every run.
* ``JOBRUN_CRASH_KILLS`` sets the number of kills per backend (default 50, for CI).
  By hand, for a longer soak: ``JOBRUN_CRASH_KILLS=1000 .venv/bin/pytest
  tests/processes/test_crash.py -m slow -s --timeout 0`` (the walk grows with the kills).
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import json
import os
import random
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import create_async_engine

import jobrun
from tests.support import CRASH_SEED, SQL_BACKENDS

sys.path.insert(0, str(Path(__file__).parent))
from crash_child import JOB, KINDS, MODULE_ID, sink, sink_metadata

CHILD = Path(__file__).with_name("crash_child.py")
KILLS = int(os.environ.get("JOBRUN_CRASH_KILLS", "50"))
PAGE_SIZE = 12
STEPS_PER_PASS = 4
# Enough pages that the planned kills are spent long before the walk ends. A
# child gets about six pages further than the one before it on average, but one
# that waits for its second failure patch with max_passes=1000 can walk far: at
# ten pages a kill one seed in a few ran out of walk (seed 2514064087, default lease).
PAGES = max(840, KILLS * 20)
OBJECTS = PAGES * PAGE_SIZE - 7  # the last page is short
# Short enough that renewals and takeovers by expiry happen all through the walk, long
# enough that a child the machine starves for a moment keeps its lease: this suite
# judges kills, and a child that fences itself (superseded) fails it. At 400 ms, two
# children of fifty did so at load 3-6 (renewals every 100 ms, refused once late).
LEASE_MS = 1500
CHILD_TIMEOUT_S = 120.0
# How far into its kind of point a child runs before it kills itself (1 = the first one).
NTH_RANGE = {
    "claim_after": (1, 3),
    "body_before_effect": (1, 6),
    "window_body": (1, 6),
    "window_ledger_before": (1, 6),
    "ledger_after": (1, 6),
    "between_steps": (1, 6),
    "commit_before": (1, 2),
    "commit_after": (1, 2),
    "failure_patch_before": (1, 2),
    "failure_patch_after": (1, 2),
}


@dataclass
class Execution:
    """One run of one step body, as the log tells it."""

    exec_id: str
    order: tuple[int, int]
    cursor: int
    step: str
    page: int
    outcomes: list[str] = field(default_factory=list)

    @property
    def ending(self) -> str:
        """How it ended: ``recorded``, ``failed`` or the kind of kill (``?`` if not exactly one)."""
        return self.outcomes[0] if len(self.outcomes) == 1 else "?"


def page_objects(page: int) -> range:
    return range(page * PAGE_SIZE, min((page + 1) * PAGE_SIZE, OBJECTS))


def plan_kills(rng: random.Random, kills: int) -> list[dict[str, Any]]:
    """Each child's plan: every kind in turn (in a shuffled order), at a random depth."""
    kinds: list[str] = []
    while len(kinds) < kills:
        batch = list(KINDS)
        rng.shuffle(batch)
        kinds.extend(batch)
    plans = []
    for kind in kinds[:kills]:
        low, high = NTH_RANGE[kind]
        plans.append(
            {
                "kill_kind": kind,
                "kill_nth": rng.randint(low, high),
                # Failure patches need failures: make them likely in those children.
                "fail_rate": 0.5 if kind.startswith("failure_patch") else 0.1,
            }
        )
    return plans


async def run_children(
    url: str, backend: str, run_id: str, log_path: Path, seed: int, say: Any, lease_ms: int | None
) -> collections.Counter[str]:
    """Start children until one finds the run done; return how each child ended."""
    rng = random.Random(seed)
    plans = plan_kills(rng, KILLS)
    endings: collections.Counter[str] = collections.Counter()
    for invocation in itertools.count():
        plan = (
            plans[invocation]
            if invocation < len(plans)
            else {"kill_kind": None, "kill_nth": 0, "fail_rate": 0.1}
        )
        config = {
            "url": url,
            "backend": backend,
            "run_id": run_id,
            "log_path": str(log_path),
            "pages": PAGES,
            "page_size": PAGE_SIZE,
            "objects": OBJECTS,
            "steps_per_pass": STEPS_PER_PASS,
            "invocation": invocation,
            "child_seed": rng.getrandbits(32),
            "lease_ms": lease_ms,
            # Short lease: half the restarts release the dead child's lease by hand, half
            # take it over (proven dead, or expired). Default lease: never by hand.
            "release": rng.random() < 0.5 and lease_ms is not None,
            # One pass per claim, or many passes handing the lease on between them.
            "max_passes": rng.choice([1, 3, 1000]),
            **plan,
        }
        stderr_path = log_path.with_name(f"child-{invocation}.stderr")
        with stderr_path.open("wb") as stderr:
            process = await asyncio.create_subprocess_exec(
                sys.executable,
                str(CHILD),
                json.dumps(config),
                stdout=stderr,
                stderr=stderr,
            )
            try:
                code = await asyncio.wait_for(process.wait(), CHILD_TIMEOUT_S)
            except TimeoutError:
                process.kill()
                await process.wait()
                say(f"child {invocation} hung for {CHILD_TIMEOUT_S} s; plan {plan}")
                raise
        if code == -signal.SIGKILL:
            endings["killed"] += 1
            continue
        if code == 0:
            endings["done"] += 1
            if plan["kill_kind"] is not None:
                say(
                    f"child {invocation} finished the walk without reaching its planned kill "
                    f"{plan} (a walk too short, or a kill point whose SQL no longer matches)"
                )
            return endings
        say(
            f"child {invocation} exited {code} (plan {plan}):\n"
            + stderr_path.read_text(errors="replace")[-4000:]
        )
        raise AssertionError(f"child {invocation} exited {code}")
    raise AssertionError("unreachable")


def read_log(log_path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in log_path.read_text().splitlines() if line]


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("lease", ["short", "default"])
@pytest.mark.parametrize("backend", SQL_BACKENDS)
async def test_walk_survives_kill_9(
    backend: str, lease: str, database_url: str, tmp_path: Path
) -> None:
    """``default``: the library's default lease, which no child waits out (each would
    cost a minute): every restart takes the run over because the killed child is
    proven dead."""
    lease_ms = LEASE_MS if lease == "short" else None
    # CI replays one fixed schedule; a local session draws a new one (see tests.support).
    seed = CRASH_SEED
    replay = f"seed {seed} (replay with JOBRUN_CRASH_SEED={seed} JOBRUN_CRASH_KILLS={KILLS})"
    print(f"\n[{backend}, {lease} lease] kill -9 suite: {KILLS} kills, {OBJECTS} objects, {replay}")
    notes: list[str] = []

    def say(text: str) -> None:
        notes.append(text)
        print(text)

    problems: list[str] = []

    def check(condition: bool, message: str) -> None:
        # Collected, not raised: the first broken promise often causes the others
        # (a skipped page ends the walk early), and the report should show them all.
        if not condition and message not in problems:
            problems.append(message)

    engine = create_async_engine(database_url)
    try:
        store = jobrun.SqlJobRunStore(engine)
        async with engine.begin() as connection:
            await connection.run_sync(sink_metadata.create_all)
        run = await jobrun.start_job_run(store, module_id=MODULE_ID, job=JOB, instance="walk")
        log_path = tmp_path / "crash.log"
        began = time.monotonic()
        try:
            endings = await run_children(
                database_url, backend, run.id, log_path, seed, say, lease_ms
            )
        except Exception as error:
            raise AssertionError(f"{error}\n{replay}") from error
        elapsed = time.monotonic() - began

        log = read_log(log_path)
        async with engine.connect() as connection:
            counted = dict(
                (
                    await connection.execute(
                        select(sink.c.object_id, func.count()).group_by(sink.c.object_id)
                    )
                ).all()
            )
        final = await jobrun.get_job_run(store, run.id)
        ledger = await store.steps(run.id)
    finally:
        await engine.dispose()

    # --- the kills -----------------------------------------------------------------------
    kills = [record for record in log if record["ev"] == "kill"]
    check(endings["killed"] == KILLS, f"{endings['killed']} children were killed, not {KILLS}")
    check(len(kills) == KILLS, f"{len(kills)} kills logged for {endings['killed']} SIGKILLs")
    by_kind = collections.Counter(record["kind"] for record in kills)
    if len(KINDS) <= KILLS:
        check(set(by_kind) == set(KINDS), f"some kinds of kill never happened: {by_kind}")
    windows = [record for record in kills if record["window"]]
    for record in log:
        check(record["ev"] not in ("ended", "superseded"), f"unexpected event {record}")

    # --- every execution, and how it ended -------------------------------------------------
    executions: dict[str, Execution] = {}
    for record in log:
        if record["ev"] == "body":
            check(record["run"] == run.id, f"a step ran for another run: {record}")
            invocation, number = map(int, record["exec"].split("."))
            executions[record["exec"]] = Execution(
                record["exec"],
                (invocation, number),
                record["cursor"],
                record["step"],
                record["page"],
            )
    for record in log:
        if record["ev"] == "recorded":
            executions[record["exec"]].outcomes.append("recorded")
        elif record["ev"] == "fail" and record["where"] == "step":
            executions[record["exec"]].outcomes.append("failed")
        elif record["ev"] == "kill" and "exec" in record:
            executions[record["exec"]].outcomes.append(record["kind"])

    # Which endings leave the effect in the sink, and which leave a committed ledger row.
    no_effect = {"failed", "body_before_effect"}
    # A step write is one statement committed on its own, on both dialects.
    committed_ledger = {"recorded", "ledger_after"}
    groups: dict[tuple[int, str], list[Execution]] = collections.defaultdict(list)
    for execution in executions.values():
        check(
            len(execution.outcomes) == 1,
            f"execution {execution} must end exactly one way (recorded, failed or killed)",
        )
        groups[(execution.cursor, execution.step)].append(execution)

    expected_steps = {
        (cursor, f"page-{page - cursor}")
        for cursor in range(0, PAGES, STEPS_PER_PASS)
        for page in range(cursor, min(cursor + STEPS_PER_PASS, PAGES))
    }
    check(
        set(groups) == expected_steps,
        f"steps that never ran: {sorted(expected_steps - set(groups))[:5]}; "
        f"steps that should not exist: {sorted(set(groups) - expected_steps)[:5]}",
    )
    reruns = 0
    for key, runs in groups.items():
        runs.sort(key=lambda execution: execution.order)
        reruns += len(runs) - 1
        for earlier in runs[:-1]:
            check(
                earlier.ending not in committed_ledger,
                f"step {key} ran again after its ledger row was committed: "
                f"{[(run_.exec_id, run_.outcomes) for run_ in runs]}",
            )
        check(
            runs[-1].ending in committed_ledger,
            f"the last execution of step {key} did not commit: {runs[-1]}",
        )

    # --- the sink: nothing lost, every duplicate explained -------------------------------
    effects = collections.Counter(
        execution.page for execution in executions.values() if execution.ending not in no_effect
    )
    missing = [number for number in range(OBJECTS) if counted.get(number, 0) < 1]
    check(not missing, f"{len(missing)} objects never reached the sink, first {missing[:10]}")
    outside = sorted(set(counted) - set(range(OBJECTS)))
    check(not outside, f"the sink holds objects outside the walk: {outside[:10]}")
    duplicates = sum(counted.values()) - OBJECTS
    window_rows = sum(len(page_objects(record["page"])) for record in windows)
    check(
        duplicates <= window_rows,
        f"{duplicates} duplicate rows, but the {len(windows)} at-least-once windows "
        f"explain only {window_rows}",
    )
    wrong = [
        (number, counted.get(number, 0), effects[number // PAGE_SIZE])
        for number in range(OBJECTS)
        if counted.get(number, 0) != effects[number // PAGE_SIZE]
    ]
    check(not wrong, f"(object, rows, effects logged) disagree: {wrong[:10]}")

    # --- the run and its ledger ------------------------------------------------------------
    if final is None:
        raise AssertionError(f"the run is gone\n{replay}")
    check(final.status == "done", f"the run ended {final.status}: {final.last_error}")
    check(final.ended_at is not None, "the done run has no ended_at")
    check(final.counters == {"objects": OBJECTS}, f"counters {final.counters}, not {OBJECTS}")
    check(ledger == {}, f"the ledger of a done run still holds {sorted(ledger)}")
    last_cursor = -(-PAGES // STEPS_PER_PASS) * STEPS_PER_PASS
    check(final.cursor == last_cursor, f"the run ended at cursor {final.cursor}")
    cleared = ("attempts", "last_error", "next_attempt_at")
    cleared += ("lease_driver", "lease_expires_at", "lease_takeovers")
    leftovers = {name: getattr(final, name) for name in cleared if getattr(final, name)}
    check(not leftovers, f"the done run still carries {leftovers}")
    passes = [record for record in log if record["ev"] == "pass"]
    most = max((record["ledger"] for record in passes), default=0)
    check(most <= STEPS_PER_PASS, f"the ledger held {most} rows at a pass start")
    stale = [record for record in passes if record["stale"]]
    check(not stale, f"a pass found an earlier pass's memo: {stale[:3]}")
    check(
        not [record for record in log if record["ev"] == "wrong_memo"],
        "a step returned another page's memo",
    )
    failures = sum(1 for record in log if record["ev"] == "fail")
    last_killed = max((record["inv"] for record in kills), default=-1)
    reached = max(
        (record["cursor"] for record in passes if record["inv"] == last_killed), default=0
    )

    print(
        f"[{backend}] {endings['killed']} kills in {elapsed:.1f} s "
        f"({dict(sorted(by_kind.items()))}); the walk was at page {reached} of {PAGES} "
        f"at the last kill; {len(windows)} at-least-once windows, {duplicates} duplicate rows "
        f"({duplicates / PAGE_SIZE:.0f} pages); {reruns} step re-runs; {failures} injected "
        f"failures; ledger peak {most}; {len(passes)} pass starts"
    )
    assert not problems, "\n".join([*problems[:12], replay, *notes[-5:]])
