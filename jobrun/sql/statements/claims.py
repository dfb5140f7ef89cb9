"""The claim's statements: which runs a driver leases, by the rules of the core.

Part of the runs facet (``JobRunStore.claim`` and ``claim_batch``), in a file of
its own for its size. SQLite reads the run the rules choose (:func:`claim_read`)
and writes the core's decision fenced on what it read (:func:`claim_write`), one
run after another. Postgres leases a whole batch in one statement
(:func:`claim_batch`), passing over rows other claimers have locked. Both are the
SQL of ``jobrun._core.leases.claims.claim_candidate`` and ``claim_transition``;
tests/contract/test_rule_parity.py compares them row for row.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sqlalchemy import (
    Text,
    and_,
    bindparam,
    case,
    cast,
    exists,
    false,
    func,
    literal,
    literal_column,
    not_,
    null,
    or_,
    select,
    true,
    tuple_,
    type_coerce,
    union_all,
    update,
)
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.sql.elements import Grouping

from jobrun._core import CLAIM_FIELDS, takeover_note_parts
from jobrun.sql.schema import BY_AGE_ONLY, LEASED_ONLY, claim_key_of, job_runs, job_steps
from jobrun.sql.statements.clock import moved_to_database_clock, on_database_clock
from jobrun.sql.statements.rules import (
    boot_held,
    due_at,
    is_due,
    is_leased,
    is_live,
    is_paused,
    runnable_by,
)


def _in_flight(module: str, job: str, booted: bool = False) -> Any:
    """How many runs of the job named by parameters ``module`` and ``job`` are leased
    (a separate alias: the count must not correlate with the claim's candidate row);
    ``booted``: or still held on the claimer's boot clock (twin of
    ``jobrun._core.leases.claims.in_flight``)."""
    leased = job_runs.alias("leased")
    held = is_leased(bindparam("now_at", type_=Text), leased.c)
    if booted:
        held = or_(held, and_(is_live(leased.c), boot_held(leased.c)))
    return (
        select(func.count())
        .select_from(leased)
        .where(
            # The partial index's predicate spelled as its own, so both engines use it.
            LEASED_ONLY,
            leased.c.module_id == bindparam(module),
            leased.c.job == bindparam(job),
            held,
        )
        .scalar_subquery()
    )


def _due_runs(
    runs: Any,
    columns: list[Any],
    limited: int,
    by_age: bool,
    versioned: int,
    job: int | tuple[Any, Any],
    booted: bool = False,
) -> Any:
    """The due runs of one requested job in claim order (of ``runs``, the table or an
    alias's columns), under the jobs' limits: job ``job`` (parameters ``module_{job}``,
    ``job_{job}``), or the job a pair of expressions names. The job is compared as
    the claim indexes key it (``claim_key_of``) and the order is their key order, so
    a claim reads the front of one job's range and stops at its first fits: priority
    first (``_substrat_job_runs_claim_order``), or, ``by_age``, due instant then id
    (``_substrat_job_runs_due_order``). ``booted``: not a run held on the claimer's
    boot clock (``boot_id``, ``boot_ms``; a filter on the rows the range reads)."""
    module_key, job_key = claim_key_of(runs)
    if isinstance(job, int):
        job = (bindparam(f"module_{job}", type_=Text), bindparam(f"job_{job}", type_=Text))
    candidate = select(*columns).where(
        is_due(bindparam("now_at", type_=Text), runs),
        module_key == job[0],
        job_key == job[1],
        runnable_by(versioned, runs),
    )
    if booted:
        candidate = candidate.where(not_(boot_held(runs)))
    if by_age:
        # The due-order index's predicate, spelled as its own: only this claim may use it.
        candidate = candidate.where(BY_AGE_ONLY).order_by(due_at(runs), runs.id)
    else:
        candidate = candidate.order_by(runs.priority.desc(), due_at(runs), runs.id)
    for index in range(limited):
        # Uncorrelated, so evaluated once per claim, not once per candidate row.
        candidate = candidate.where(
            or_(
                runs.module_id != bindparam(f"limited_module_{index}"),
                runs.job != bindparam(f"limited_job_{index}"),
                _room(index, booted) > 0,
            )
        )
    return candidate


def _room(index: int, booted: bool = False) -> Any:
    """How many more runs limited job ``index`` may lease now."""
    most = bindparam(f"limited_most_{index}", type_=job_runs.c.attempts.type)
    return most - _in_flight(f"limited_module_{index}", f"limited_job_{index}", booted)


def _due_candidate(
    jobs: int, skipped: int, limited: int, by_age: bool, versioned: int, booted: bool
) -> Any:
    """The first due run in claim order, among the requested jobs under their limits:
    the first of each job's range, then the first of those."""
    runs = job_runs.c
    columns = [runs.id, runs.priority, due_at(runs).label("due_at")]
    firsts = [
        _due_runs(runs, columns, limited, by_age, versioned, job, booted)
        .where(*_not_skipped(skipped))
        .limit(1)
        for job in range(jobs)
    ]
    if len(firsts) == 1:
        return firsts[0].with_only_columns(runs.id).scalar_subquery()
    first = union_all(*[one.subquery().select() for one in firsts]).subquery("firsts")
    return select(first.c.id).order_by(*_claim_order(first, by_age)).limit(1).scalar_subquery()


def _not_skipped(skipped: int) -> list[Any]:
    """SQLite: not one of the runs to pass over, given as one JSON array (``skip_ids``),
    so the statement's text is the same however many there are: a drive's list grows
    by a run per claim, and a text per length was compiled anew on every claim."""
    if not skipped:
        return []
    listed: Any = select(literal_column("value")).select_from(
        func.json_each(bindparam("skip_ids", type_=Text))
    )
    return [job_runs.c.id.not_in(listed)]


def _dead(dead: int) -> list[Any]:
    return [bindparam(f"dead_{i}") for i in range(dead)]


def _orphan_candidate(pairs: list[Any], dead: int, skipped: int, versioned: int) -> Any:
    """An orphaned run: leased by a holder proven dead (``dead_{i}``; see
    ``jobrun._core.leases.proof_of_death``), as
    ``jobrun._core.leases.claims.is_orphan``. Taking it over adds no pass in
    flight, so per-job limits do not apply."""
    runs = job_runs.c
    return (
        select(runs.id)
        .where(
            # Leased (once expired it is simply due): the due index's range.
            is_leased(bindparam("now_at", type_=Text)),
            # A paused run is never claimed, its holder dead or not.
            not_(is_paused()),
            runs.lease_owner.in_(_dead(dead)),
            tuple_(runs.module_id, runs.job).in_([tuple_(*pair) for pair in pairs]),
            runnable_by(versioned),
            *_not_skipped(skipped),
        )
        .limit(1)
        .scalar_subquery()
    )


def claim_read(
    jobs: int,
    skipped: int,
    limited: int,
    dead: int,
    by_age: bool = False,
    versioned: int = 0,
    booted: bool = False,
) -> Any:
    """SQLite: the run a claim would get, whole: for ``jobs`` (module_id, job) pairs
    (``module_{i}``, ``job_{i}``), passing over the ids of ``skip_ids`` (a JSON array,
    when ``skipped``) and ``limited`` jobs at their concurrency limit (``limited_*_{i}``,
    ``limited_most_{i}``); a run held by one of ``dead`` proven-dead lease owners
    (``dead_{i}``) comes first; ``by_age``: the due run due longest, whatever its
    priority; neither of a version newer than the code's (``versioned`` jobs of a
    version above 1, see :func:`runnable_by`); ``booted``: nor a due run still held
    on the claimer's boot clock (``boot_id``, ``boot_ms``; see :func:`boot_held`).
    The same rules as ``jobrun._core.leases.claims.claim_candidate``."""
    pairs: list[Any] = [(bindparam(f"module_{i}"), bindparam(f"job_{i}")) for i in range(jobs)]
    chosen: Any = _due_candidate(jobs, skipped, limited, by_age, versioned, booted)
    if dead:
        chosen = func.coalesce(_orphan_candidate(pairs, dead, skipped, versioned), chosen)
    return select(job_runs).where(job_runs.c.id == chosen)


def claim_write(limited: bool, booted: bool = False) -> Any:
    """Write a claim's decision (``new_*``) on run ``fence_id``, fenced on the values the
    decision read (``was_*``): if any changed since (another claimer, a holder's
    write, an operator), nothing is written. ``limited``: and only while the run's
    job (``check_module``, ``check_job``) holds fewer than ``check_most`` unexpired
    leases, counted in the same statement (``booted``: those held on the claimer's
    boot clock counted too)."""
    runs = job_runs.c
    fence = [runs.id == bindparam("fence_id"), is_live()]
    fence += [runs[name].is_not_distinct_from(bindparam(f"was_{name}")) for name in CLAIM_FIELDS]
    if limited:
        most = bindparam("check_most", type_=runs.attempts.type)
        fence.append(_in_flight("check_module", "check_job", booted) < most)
    values: dict[str, Any] = {name: bindparam(f"new_{name}") for name in CLAIM_FIELDS}
    return update(job_runs).where(*fence).values(values).returning(*job_runs.c)


# -- the Postgres claim: one statement, skipping the rows other claimers hold ----------------
# Parameters: ``now_at``, ``began_at`` (the claimer's instant, where the lease is
# counted from), ``driver``, ``tokens`` (one per run wanted: the i-th claimed gets
# the i-th), ``skip_ids`` and ``dead`` (arrays: the statement's text never depends on
# their lengths, so the driver's prepared statement is reused), and per job
# ``module_{i}``, ``job_{i}``, ``expires_{i}``. See ``jobrun.sql.store.claims``.


def _text_array(name: str) -> Any:
    return cast(bindparam(name), ARRAY(Text))


def _locked_candidates(
    jobs: int, limited: int, by_age: bool, versioned: int, dead: bool, clock: Callable[[Any], Any]
) -> Any:
    """Up to ``len(tokens)`` runs a claim may take, each locked ``FOR UPDATE SKIP
    LOCKED``: a run another claimer (or a holder's step write) has locked is passed
    over, never waited for. Orphans first (``is_orphan``: taking one over adds no
    pass in flight, so the limits do not apply), then due runs in claim order."""
    candidate = job_runs.alias("candidate")
    runs = candidate.c
    wanted = func.cardinality(_text_array("tokens"))
    columns = [
        runs.id,
        runs.module_id,
        runs.job,
        runs.priority,
        due_at(runs).label("due_at"),
        runs.lease_owner,
        runs.lease_driver,
        runs.lease_began_at,
    ]
    not_skipped = runs.id != func.all(_text_array("skip_ids"))
    due_columns = [*columns, literal_column("0").label("orphan"), _ledger_empty(candidate)]
    # Up to ``wanted`` from the front of each job's range; the ranking below keeps the
    # first of them all. One job: its range read directly. Several: one lateral
    # subquery, run once per job of the arrays ``claim_modules``, ``claim_jobs``,
    # planned once whatever the number of jobs (it costs a single job's claim more
    # than the direct read: measured in the drain).
    if jobs == 1:
        job: int | tuple[Any, Any] = 0
        asked = None
    else:
        unnested = func.unnest(_text_array("claim_modules"), _text_array("claim_jobs"))
        asked = unnested.table_valued("module_id", "job").render_derived(name="asked")
        job = (asked.c.module_id, asked.c.job)
    front = _due_runs(runs, due_columns, limited, by_age, versioned, job)
    front = clock(front.where(not_skipped).limit(wanted).with_for_update(skip_locked=True))
    if asked is None:
        due = front
    else:
        fronts = front.lateral("front")
        due = select(*fronts.c).select_from(asked).join(fronts, true())
    if not dead:
        return due.subquery("locked")
    pairs: list[Any] = [(bindparam(f"module_{i}"), bindparam(f"job_{i}")) for i in range(jobs)]
    orphans = (
        select(*columns, literal_column("1").label("orphan"), false().label("ledger_empty"))
        .where(
            is_leased(bindparam("now_at", type_=Text), runs),
            not_(is_paused(runs)),
            runs.lease_owner == func.any(_text_array("dead")),
            tuple_(runs.module_id, runs.job).in_([tuple_(*pair) for pair in pairs]),
            runnable_by(versioned, runs),
            not_skipped,
        )
        .limit(wanted)
        .with_for_update(skip_locked=True)
    )
    branches = [clock(orphans), due]
    return union_all(*[one.subquery().select() for one in branches]).subquery("locked")


def _ledger_empty(candidate: Any) -> Any:
    """Whether the run's ledger is known empty as it is locked: no rows in the
    statement's snapshot, and no holder since that snapshot could have written one
    (unleased there, and the row locked is that very version: same ``xmin``). A
    holder's step writes all commit before the write that lets go of its lease (a
    step write holds the run row's share lock), so an unleased version written
    before the snapshot has every ledger row of the run in the snapshot."""
    runs = candidate.c
    snapshot = job_runs.alias("snapshot")
    unchanged = literal_column("candidate.xmin") == (
        select(literal_column("snapshot.xmin")).where(snapshot.c.id == runs.id).scalar_subquery()
    )
    ledger = select(job_steps.c.run_id).where(job_steps.c.run_id == runs.id)
    return and_(runs.lease_owner.is_(None), unchanged, not_(exists(ledger))).label("ledger_empty")


def _ranked(locked: Any, by_age: bool, limited: int, clock: Callable[[Any], Any]) -> Any:
    """The locked runs that fit, numbered in claim order (``place``: which token each
    gets). A due run of a limited job fits while its place among this claim's due
    runs of that job is within the job's room; orphans and other jobs always fit."""
    in_job = func.row_number().over(
        partition_by=[locked.c.module_id, locked.c.job, locked.c.orphan],
        order_by=_claim_order(locked, by_age),
    )
    numbered = select(locked, in_job.label("place_in_job")).subquery("numbered")
    fitting = select(numbered).where(clock(_within_limits(numbered, limited))).subquery("fitting")
    order = [fitting.c.orphan.desc(), *_claim_order(fitting, by_age)]
    return select(fitting, func.row_number().over(order_by=order).label("place")).subquery("chosen")


def _claim_order(candidates: Any, by_age: bool) -> list[Any]:
    order = [candidates.c.due_at, candidates.c.id]
    return order if by_age else [candidates.c.priority.desc(), *order]


def _within_limits(numbered: Any, limited: int) -> Any:
    if not limited:
        return true()
    room = case(
        *[
            (
                and_(
                    numbered.c.module_id == bindparam(f"limited_module_{index}"),
                    numbered.c.job == bindparam(f"limited_job_{index}"),
                ),
                _room(index),
            )
            for index in range(limited)
        ],
        else_=numbered.c.place_in_job,
    )
    return or_(numbered.c.orphan == 1, numbered.c.place_in_job <= room)


def _claimed_values(chosen: Any, jobs: int, on_database_clock: bool) -> dict[str, Any]:
    """What a claim writes: twin of ``jobrun._core.leases.claims.claim_transition``
    (tests/contract/test_rule_parity.py compares the two row for row)."""
    runs = job_runs.c
    began = and_(runs.lease_owner.is_not(None), runs.lease_began_at.is_not(None))
    died = runs.lease_owner == func.any(_text_array("dead"))
    driver = func.coalesce(runs.lease_driver, literal_column("'None'"))
    notes = {died_: takeover_note_parts(died_) for died_ in (True, False)}
    note = case(
        (died, literal(notes[True][0], Text) + driver + literal(notes[True][1], Text)),
        else_=literal(notes[False][0], Text) + driver + literal(notes[False][1], Text),
    )
    expiries = []
    for index in range(jobs):
        expiry: Any = bindparam(f"expires_{index}", type_=Text)
        if on_database_clock:
            expiry = moved_to_database_clock(f"expires_{index}", "began_at")
        mine = and_(
            runs.module_id == bindparam(f"module_{index}"), runs.job == bindparam(f"job_{index}")
        )
        expiries.append((mine, expiry))
    return {
        # Parenthesised: Postgres reads ``CAST(..)[i]`` as a syntax error.
        "lease_owner": type_coerce(Grouping(_text_array("tokens")), ARRAY(Text))[chosen.c.place],
        "lease_driver": bindparam("driver", type_=Text),
        "lease_began_at": bindparam("began_at", type_=Text),
        "next_attempt_at": case(*expiries),
        "lease_epoch": runs.lease_epoch + literal_column("1"),
        "lease_takeovers": runs.lease_takeovers
        + case((runs.lease_owner.is_not(None), literal_column("1")), else_=literal_column("0")),
        "attempts": runs.attempts + case((began, literal_column("1")), else_=literal_column("0")),
        "last_error": case((began, note), else_=runs.last_error),
        # Postgres judges leases on its own clock: none is kept on a boot clock.
        "lease_boot_id": null(),
        "lease_boot_expires_ms": null(),
    }


def claim_batch(
    jobs: int,
    limited: int,
    by_age: bool,
    versioned: int,
    dead: bool,
    database_clock: bool = False,
) -> Any:
    """Postgres: lease up to ``len(tokens)`` runs in one statement, by the rules of
    ``jobrun._core.leases.claims.claim_candidate`` applied run after run (orphans
    first, then due runs in order; limits counted with the runs this claim takes),
    each written as ``claim_transition`` would. The rows are locked before they
    are read for the write, so nothing between the choice and the write can change
    them: no compare-and-set, no retry. Returns each run as written, its ``place``
    and the holder it was taken from (``was_*``)."""
    # Expiries judged on the database's clock: ``now_at`` read there, at the statement.
    clock: Callable[[Any], Any] = on_database_clock if database_clock else _as_given
    locked = _locked_candidates(jobs, limited, by_age, versioned, dead, clock)
    chosen = _ranked(locked, by_age, limited, clock)
    return (
        update(job_runs)
        .where(
            job_runs.c.id == chosen.c.id,
            chosen.c.place <= func.cardinality(_text_array("tokens")),
        )
        .values(_claimed_values(chosen, jobs, database_clock))
        .returning(
            *job_runs.c,
            chosen.c.place,
            chosen.c.lease_owner.label("was_owner"),
            chosen.c.lease_driver.label("was_driver"),
            chosen.c.lease_began_at.label("was_began_at"),
            chosen.c.ledger_empty,
        )
    )


def _as_given(element: Any) -> Any:
    return element
