"""Each rule's Python home (``jobrun._core.model.predicates``, ``browse.run_matches``,
``leases.claims.claim_candidate``) and its SQL twin in ``jobrun.sql.statements``
(``rules``, ``browse``, ``claims``) select the same rows: the same table of edge
cases (every status, NULL and equal instants, leases expired, expiring now and
unexpired) is written on memory, SQLite and Postgres, and every store read built
on a rule is compared with the rule applied in Python; on the SQL stores each
twin is also run bare.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import BigInteger, Text, bindparam, func, insert, literal, select, update

from jobrun._core.leases.claims import claim_candidate, claim_transition, is_orphan
from jobrun._core.leases.holders import PRESENCE_PATTERN, HolderIdentity, parse_holder
from jobrun._core.model import predicates
from jobrun._core.model.records import (
    BootInstant,
    ClaimRequest,
    HealthCounts,
    RunFilter,
    RunRow,
    StepRow,
)
from jobrun._core.operator.activity import ActivityQuery, count_activity
from jobrun._core.operator.browse import RunQuery, run_matches
from jobrun._core.rules.transitions import resume_transition
from jobrun.sql.schema import job_runs, job_steps
from jobrun.sql.statements import rules
from tests.support import SQL_BACKENDS, hand_made_row, put_rows

BEFORE = "2026-01-01T11:00:00.000Z"
NOW = "2026-01-01T12:00:00.000Z"
AFTER = "2026-01-01T13:00:00.000Z"
INSTANTS = (BEFORE, NOW, AFTER)
JOBS = (("m", "a"), ("m", "b"))


def _table() -> list[RunRow]:
    """Every combination of the columns the rules read, each row its own key."""
    combinations = itertools.product(
        ("running", "done", "failed"),
        (None, *INSTANTS),  # next_attempt_at
        (None, "TOKEN"),  # lease_owner
        INSTANTS,  # started_at
        (None, *INSTANTS),  # ended_at
        JOBS,
    )
    rows = []
    for index, (status, next_at, owner, started_at, ended_at, job) in enumerate(combinations):
        row = hand_made_row(index, module_id=job[0], job=job[1], at=started_at)
        rows.append(
            dataclasses.replace(
                row,
                status=status,
                next_attempt_at=next_at,
                lease_owner=owner,
                lease_driver=None if owner is None else "driver",
                # A taken-over lease whose pass had begun is charged an attempt.
                lease_began_at=None if owner is None or index % 5 == 0 else started_at,
                last_error=None if index % 7 else "earlier",
                ended_at=ended_at,
                priority=index % 2,
                # Versioned jobs: none stored (version 1), 1, 2 and 3.
                job_version=(None, 1, 2, 3)[index % 4],
                cancelled=int(index % 3 == 0),
                # Apart from started_at, so the wait's fallback is told from the due instant's.
                updated_at=INSTANTS[index % 3],
                # Revision 0009: some paused, whatever else they are (leased, due, ended).
                paused_at=NOW if index % 11 in (3, 8) else None,
                pause_reason="held" if index % 11 == 3 else None,
                # Revision 0010: boot-clock expiries of this lease, of another, or none.
                lease_boot_id=("b@TOKEN", "b@OTHER", None, "c@TOKEN")[index % 4],
                lease_boot_expires_ms=(None, 500, 1000, 1500, 2000)[index % 5],
            )
        )
    return rows


ROWS = _table()


def _ids(rows: Any, keep: Callable[[RunRow], bool]) -> set[str]:
    return {row.id for row in rows if keep(row)}


async def _sql_ids(engine: Any, condition: Any, values: dict[str, Any]) -> set[str]:
    async with engine.connect() as connection:
        found = await connection.execute(select(job_runs.c.id).where(condition), values)
        return {row[0] for row in found}


NOW_AT = bindparam("now_at", type_=Text)
ROW_RULES: list[tuple[str, Callable[[RunRow, str], bool], Any]] = [
    ("is_due", predicates.is_due, rules.is_due(NOW_AT)),
    ("is_leased", predicates.is_leased, rules.is_leased(NOW_AT)),
    ("is_stranded", predicates.is_stranded, rules.is_stranded(NOW_AT)),
    ("is_failed_since", predicates.is_failed_since, rules.is_failed_since(NOW_AT)),
    ("has_ended_since", predicates.has_ended_since, rules.has_ended_since(NOW_AT)),
]


@pytest.mark.parametrize("backend", SQL_BACKENDS, indirect=True)
async def test_each_rule_and_its_sql_twin_select_the_same_rows(store: Any, engine: Any) -> None:
    await put_rows(store, engine, ROWS)
    assert await _sql_ids(engine, rules.is_live(), {}) == _ids(ROWS, predicates.is_live)
    cancelled = _ids(ROWS, predicates.is_cancelled)
    assert cancelled
    assert await _sql_ids(engine, rules.is_cancelled(), {}) == cancelled
    paused = _ids(ROWS, predicates.is_paused)
    assert paused
    assert await _sql_ids(engine, rules.is_paused(), {}) == paused
    runs = job_runs.c
    parked = rules.parked(runs.status, runs.paused_at, runs.lease_owner, runs.next_attempt_at)
    for at, (name, rule, twin) in itertools.product(INSTANTS, ROW_RULES):
        wanted = {row.id for row in ROWS if rule(row, at)}
        assert await _sql_ids(engine, twin, {"now_at": at}) == wanted, (name, at)
    async with engine.connect() as connection:
        found = await connection.execute(select(job_runs.c.id, rules.due_at()))
        assert dict(found.all()) == {row.id: predicates.due_at(row) for row in ROWS}
        found = await connection.execute(select(job_runs.c.id, rules.waiting_since()))
        assert dict(found.all()) == {row.id: predicates.waiting_since(row) for row in ROWS}
        found = await connection.execute(select(job_runs.c.id, rules.stored_version()))
        assert dict(found.all()) == {row.id: predicates.stored_version(row) for row in ROWS}
        found = await connection.execute(select(job_runs.c.id, parked))
        wanted_due = {row.id: predicates.parked(row).next_attempt_at for row in ROWS}
        assert dict(found.all()) == wanted_due
        assert predicates.PARKED_AT in wanted_due.values()
    for boot in BOOTS:
        if boot is None:
            continue
        wanted = {row.id for row in ROWS if predicates.boot_held(row, boot)}
        assert wanted, boot
        values = {"boot_id": boot.boot_id, "boot_ms": boot.ms}
        assert await _sql_ids(engine, rules.boot_held(), values) == wanted, boot
    for versions in VERSIONS:
        versioned = sorted((job, version) for job, version in versions.items() if version != 1)
        values: dict[str, Any] = {}
        for i, ((module_id, job), version) in enumerate(versioned):
            values |= {
                f"versioned_module_{i}": module_id,
                f"versioned_job_{i}": job,
                f"versioned_version_{i}": version,
            }
        twin = rules.runnable_by(len(versioned))
        wanted = {row.id for row in ROWS if predicates.runnable_by(row, versions)}
        assert await _sql_ids(engine, twin, values) == wanted, versions


# The code's version per job, as claims send them (a job left out: version 1).
VERSIONS: list[dict[tuple[str, str], int]] = [
    {},
    {JOBS[0]: 1, JOBS[1]: 1},
    {JOBS[0]: 2},
    {JOBS[0]: 3, JOBS[1]: 2},
]


# The claimer's boot clock: none, before and at some boot expiries, another boot's.
BOOTS = (None, BootInstant("b", 1000), BootInstant("b", 1600), BootInstant("c", 0))


PRUNES: list[tuple[tuple[str, ...], Any, Any]] = [
    (("done",), None, frozenset()),
    (("done", "failed"), None, frozenset({JOBS[0]})),
    (("failed",), frozenset({JOBS[1]}), frozenset()),
    (("running", "done"), frozenset(JOBS), frozenset({JOBS[1]})),
]


@pytest.mark.parametrize("backend", SQL_BACKENDS, indirect=True)
async def test_prunable_and_its_sql_twin_agree(store: Any, engine: Any) -> None:
    await put_rows(store, engine, ROWS)
    for (statuses, only, excepted), at in itertools.product(PRUNES, INSTANTS):
        only_pairs = None if only is None else sorted(only)
        condition = rules.is_prunable(
            len(statuses), None if only_pairs is None else len(only_pairs), len(excepted)
        )
        values: dict[str, Any] = {"ended_before": at}
        values |= {f"pruned_status_{i}": status for i, status in enumerate(statuses)}
        for prefix, pairs in (("only_", only_pairs or []), ("except_", sorted(excepted))):
            for i, (module_id, job) in enumerate(pairs):
                values |= {f"{prefix}module_{i}": module_id, f"{prefix}job_{i}": job}
        wanted = {
            row.id for row in ROWS if predicates.is_prunable(row, at, statuses, only, excepted)
        }
        assert await _sql_ids(engine, condition, values) == wanted, (statuses, only, excepted)


@pytest.mark.parametrize("at", INSTANTS)
async def test_the_operators_reads_count_by_the_rules(store: Any, engine: Any, at: str) -> None:
    await put_rows(store, engine, ROWS)
    due = [row for row in ROWS if predicates.is_due(row, at)]
    assert await store.health(at) == HealthCounts(
        running=len(_ids(ROWS, predicates.is_live)),
        due=len(due),
        leased=len(_ids(ROWS, lambda row: predicates.is_leased(row, at))),
        failed=sum(1 for row in ROWS if row.status == "failed"),
        oldest_due_at=min(map(predicates.waiting_since, due), default=None),
        cancelled=len(_ids(ROWS, predicates.is_cancelled)),
        paused=len(_ids(ROWS, predicates.is_paused)),
    )
    by_job = {job: sum(1 for row in due if (row.module_id, row.job) == job) for job in JOBS}
    assert await store.due_by_job(at) == {job: count for job, count in by_job.items() if count}
    by_version: dict[tuple[str, str], dict[int, int]] = {}
    for row in ROWS:
        if predicates.is_live(row):
            counts = by_version.setdefault((row.module_id, row.job), {})
            version = predicates.stored_version(row)
            counts[version] = counts.get(version, 0) + 1
    assert await store.versions_by_job() == by_version
    held = await store.held_leases(at, None)
    # A paused run is never taken over: its holder's death is nobody's business.
    assert {lease.run_id for lease in held} == _ids(
        ROWS, lambda row: predicates.is_leased(row, at) and not predicates.is_paused(row)
    )
    for load in await store.job_loads(at, at):
        rows = [row for row in ROWS if (row.module_id, row.job) == (load.module_id, load.job)]
        job_due = [row for row in rows if predicates.is_due(row, at)]
        assert dataclasses.astuple(load)[2:] == (
            len(_ids(rows, predicates.is_live)),
            len(job_due),
            min(map(predicates.waiting_since, job_due), default=None),
            len(_ids(rows, lambda row: predicates.is_stranded(row, at))),
            len(_ids(rows, lambda row: predicates.is_failed_since(row, at))),
        )


def _queries(at: str) -> list[RunQuery]:
    statuses = [
        combination
        for size in range(4)
        for combination in itertools.combinations(("running", "done", "failed"), size)
    ]
    return [
        RunQuery(statuses=chosen, stranded_at=stranded_at, module_id=module_id, job=job, limit=500)
        for chosen in statuses
        for stranded_at in (None, at)
        for module_id, job in ((None, None), JOBS[1])
    ] + [
        RunQuery(
            leased_at=leased_at,
            failed_since_at=failed_since_at,
            cancelled=cancelled,
            job=job,
            limit=500,
        )
        for leased_at in (None, at)
        for failed_since_at in (None, at)
        for cancelled in (None, True, False)
        for job in (None, JOBS[1][1])
    ]


@pytest.mark.parametrize("at", INSTANTS)
async def test_the_console_filter_selects_by_the_rules(store: Any, engine: Any, at: str) -> None:
    await put_rows(store, engine, ROWS)
    for query in _queries(at):
        wanted = sorted((row.id for row in ROWS if run_matches(row, query)), reverse=True)
        assert [row.id for row in await store.find(query)] == wanted[: query.limit], query
        assert await store.count(query, 1000) == len(wanted), query


@pytest.mark.parametrize("at", INSTANTS)
async def test_the_activity_chart_counts_by_the_rules(store: Any, engine: Any, at: str) -> None:
    await put_rows(store, engine, ROWS)
    for chars, (module_id, job) in itertools.product((13, 16), ((None, None), JOBS[1])):
        query = ActivityQuery(at, chars, module_id, job)
        assert await store.activity(query) == count_activity(ROWS, query), query


@pytest.mark.parametrize("at", INSTANTS)
async def test_a_claim_takes_the_run_the_rules_choose(store: Any, engine: Any, at: str) -> None:
    await put_rows(store, engine, ROWS)
    dead_or_not = (frozenset(), frozenset({"TOKEN"}))
    # Passing over every run without a lease leaves leased ones first in line, whose
    # boot-clock expiries then decide.
    unleased = frozenset(row.id for row in ROWS if row.lease_owner is None)
    choices = itertools.product(dead_or_not, (False, True), VERSIONS, BOOTS, (False, True))
    one_host = engine is None or engine.dialect.name == "sqlite"
    for dead, by_age, versions, boot, leased_only in choices:
        request = ClaimRequest(
            at,
            "NEW",
            "me",
            dict.fromkeys(JOBS, AFTER),
            dead_owners=dead,
            by_age=by_age,
            versions=versions,
            boot=boot,
            boot_expires_ms=dict.fromkeys(JOBS, 9000) if boot else {},
            skip_ids=unleased if leased_only else frozenset(),
        )
        claimed = await store.claim(request)
        if not one_host:
            # Postgres judges on its own clock (or the one given): no boot clock.
            request = dataclasses.replace(request, boot=None, boot_expires_ms={})
        wanted = claim_candidate(ROWS, request)
        assert (claimed is None) == (wanted is None), (at, dead, by_age, versions, boot)
        if claimed is None or wanted is None:
            continue
        chosen = next(row for row in ROWS if row.id == claimed.row.id)
        if is_orphan(wanted, request):
            # Orphans come first, in no particular order among themselves.
            assert is_orphan(chosen, request), (at, chosen)
        else:
            assert chosen == wanted, (at, by_age, versions, boot)
        # What the store wrote is what the core's transition makes of the row it chose
        # (Postgres writes it in SQL: jobrun.sql.statements.claims._claimed_values).
        wrote = claim_transition(chosen, request)
        assert (claimed.row, claimed.previous) == (wrote.row, wrote.previous), (at, dead, chosen)
        await _put_back(store, engine, chosen)


async def _put_back(store: Any, engine: Any, row: RunRow) -> None:
    """Undo a claim behind jobrun's back, for the next request to see the same rows."""
    if engine is None:
        store.runs[row.id] = row
        return
    async with engine.begin() as connection:
        values = dataclasses.asdict(row)
        await connection.execute(update(job_runs).where(job_runs.c.id == row.id).values(**values))


async def test_prune_deletes_what_the_rule_selects(store: Any, engine: Any) -> None:
    await put_rows(store, engine, ROWS)
    left = list(ROWS)
    for statuses, only, excepted in PRUNES:
        for at in INSTANTS:
            doomed = {
                row.id for row in left if predicates.is_prunable(row, at, statuses, only, excepted)
            }
            deleted = await store.prune(at, statuses, 7, only_jobs=only, except_jobs=excepted)
            assert deleted == len(doomed), (statuses, only, excepted, at)
            left = [row for row in left if row.id not in doomed]
            kept = await store.list(_every_run())
            assert {row.id for row in kept} == {row.id for row in left}


def _every_run() -> RunFilter:
    return RunFilter(limit=10_000)


async def test_a_resume_refills_steps_and_keeps_one_live_run_per_key(
    store: Any, engine: Any
) -> None:
    failed = dataclasses.replace(
        hand_made_row(1, at=BEFORE), status="failed", ended_at=BEFORE, attempts=3
    )
    live = dataclasses.replace(hand_made_row(2, at=BEFORE), instance="shared")
    ended = dataclasses.replace(hand_made_row(3, at=BEFORE), instance="shared", status="done")
    await put_rows(store, engine, [failed, live, ended])
    steps = [
        StepRow("completed", '"memo"', 2, None),
        StepRow("failing", None, 5, "boom"),
        StepRow("untried", None, 0, None),
    ]
    if engine is None:
        store.ledgers[failed.id] = {step.step: (step, BEFORE) for step in steps}
    else:
        async with engine.begin() as connection:
            await connection.execute(
                insert(job_steps),
                [
                    dataclasses.asdict(step) | {"run_id": failed.id, "recorded_at": BEFORE}
                    for step in steps
                ],
            )
    assert await store.resume(failed.id, resume_transition(NOW))
    refilled = {step.step: predicates.refill_on_resume(step) for step in steps}
    assert await store.steps(failed.id) == refilled
    # One live run per key: a start of a key with a live run joins it, else inserts.
    lonely = dataclasses.replace(hand_made_row(4, at=BEFORE), status="done", ended_at=BEFORE)
    await put_rows(store, engine, [lonely])
    for index, row in enumerate((live, ended, failed, lonely)):
        fresh = dataclasses.replace(row, id=f"{90 + index:026d}", status="running", ended_at=None)
        wanted = predicates.live_run_of(await store.list(_every_run()), fresh)
        started, inserted = await store.start_or_join(fresh)
        assert (started.id, inserted) == (
            (fresh.id, True) if wanted is None else (wanted.id, False)
        ), row.id
    assert wanted is None, "the last key had no live run"


def _driver_texts() -> list[str]:
    """``lease_driver`` texts as claims write them, with the presence field in every
    position (fields after it too), and texts that carry no valid presence."""
    identity = HolderIdentity("web-7", "5c1d", "4026531836", 4121, 8934, 2**62 + 5, "4026531834")
    texts = [identity.describe(name) for name in ("worker-1/3", "", "a [jobrun presence=1]")]
    texts.append(dataclasses.replace(identity, presence=None).describe("no presence"))
    texts.append(HolderIdentity("h", presence=0).describe("only host"))
    fields = identity.describe("x").split(" [jobrun ", 1)[1].rstrip("]").split(" ")
    for position in range(len(fields)):
        moved = [field for field in fields if not field.startswith("presence=")]
        moved.insert(position, f"presence={identity.presence}")
        texts.append(f"reordered [jobrun {' '.join(moved)}]")
    texts += [
        "worker [jobrun host=a presence=12] and after",
        "worker [jobrun host=a presence=p]",
        "worker [jobrun host=a presence=-3]",
        "worker [jobrun host=a xpresence=3]",
        "worker [jobrun host=a presence=3",
        "worker",
    ]
    return texts


@pytest.mark.postgres
@pytest.mark.parametrize("backend", [SQL_BACKENDS[1]], indirect=True)
async def test_postgres_reads_the_presence_key_as_python_does(store: Any, engine: Any) -> None:
    texts = _driver_texts()
    pattern = literal(PRESENCE_PATTERN)
    async with engine.connect() as connection:
        for text in texts:
            found = await connection.scalar(
                select(func.substring(literal(text), pattern).cast(BigInteger))
            )
            holder = parse_holder(text)
            assert found == (None if holder is None else holder.presence), text


@pytest.mark.parametrize("at", INSTANTS)
async def test_the_live_workers_are_those_the_rule_keeps(store: Any, at: str) -> None:
    from jobrun._core.model.worker_rows import WorkerRow
    from jobrun._core.operator.worker_registry import worker_is_live

    rows = [WorkerRow(f"w{index}", "n", "h", 1, "[]", BEFORE, BEFORE, expiry)
            for index, expiry in enumerate(INSTANTS)]  # fmt: skip
    for row in rows:
        await store.beat_worker(row)
    expected = [row for row in rows if worker_is_live(row, at)]
    assert await store.live_workers(at) == expected
    assert len(expected) == INSTANTS[::-1].index(at)
