"""The runs facet's statements: starts, the pass's reads and writes, leases held and renewed.

What the store sends for ``JobRunStore``'s runs and leases (the claim's statements
are in :mod:`jobrun.sql.statements.claims`). The pass's and the start's statements are
compiled with the store (:class:`RunStatements`); the others once per shape.
Also here: the database's clock as Postgres reads it in a statement, which the
claim, the renewal and a lease handed on use to judge and count a lease there.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    JSON,
    Integer,
    Text,
    and_,
    bindparam,
    case,
    cast,
    delete,
    func,
    literal,
    literal_column,
    not_,
    null,
    select,
    true,
    tuple_,
    union_all,
    update,
)

from jobrun._core import RunPatch, RunRow
from jobrun.sql.executor import Compiler
from jobrun.sql.postgres.presence import presence_held
from jobrun.sql.schema import LIVE_ONLY, job_runs, job_steps
from jobrun.sql.statements.clock import database_instant, database_now_at, moved_to_database_clock
from jobrun.sql.statements.compiled import dialect_insert
from jobrun.sql.statements.rules import is_leased, is_live, is_paused, live_run_of, parked

RUN_COLUMNS = tuple(column.name for column in job_runs.c)
# Statements return whole runs in table order, which is RunRow's field order.
assert tuple(RunRow.__dataclass_fields__) == RUN_COLUMNS
PATCH_COLUMNS = tuple(RunPatch.__dataclass_fields__)
STEP_COLUMNS = ("run_id", "step", "result", "attempts", "last_error", "recorded_at")
_KEY = (job_runs.c.module_id, job_runs.c.job, job_runs.c.instance)


def _fence() -> Any:
    """``this run, still running, still held by this token``, as bound parameters."""
    return and_(
        job_runs.c.id == bindparam("fence_id"),
        is_live(),
        job_runs.c.lease_owner == bindparam("fence_token"),
    )


def _record_step(is_postgres: bool) -> Any:
    """The step write: the ledger row taken from the run's own row, so that the run,
    still running, still held by this token, is both the fence and the source of
    ``run_id`` (no row, nothing written). Seven parameters, all given by the caller
    in :data:`RECORD_STEP_ORDER` (the constants are written into the text): the
    step's path builds that list directly and binds no more than it must."""
    runs = job_runs.c
    given = [bindparam(f"step_{name}", type_=job_steps.c[name].type) for name in STEP_COLUMNS[1:]]
    fence = (
        runs.id == bindparam("fence_id"),
        is_live(),
        runs.lease_owner == bindparam("fence_token"),
    )
    held: Any = select(runs.id, *given).where(*fence)
    if is_postgres:
        # Lock the run row for the statement: a claim that would take the run over
        # (an UPDATE of that row) waits until this write commits, so the check and
        # the write cannot come apart. SQLite's writer holds the database's write
        # lock for the whole statement.
        held = held.with_for_update(read=True)
    else:
        # The run's pause, told by the change count: a paused run's row is written
        # twice (the same values), so 2 rows changed (see RECORD_STEP_ORDER_SQLITE).
        held = union_all(held, select(runs.id, *given).where(*fence, runs.paused_at.is_not(None)))
    upsert = dialect_insert(is_postgres, job_steps).from_select(list(STEP_COLUMNS), held)
    upsert = upsert.on_conflict_do_update(
        index_elements=[job_steps.c.run_id, job_steps.c.step],
        set_={name: upsert.excluded[name] for name in STEP_COLUMNS[2:]},
    )
    if is_postgres:
        # "Written" is the row this gives back, and with it the run's pause. (Reading
        # asyncpg's status text instead measured no cheaper at 64 in flight:
        # benchmarks/README.md.)
        # (run_id: the row just written; the runs table has no column of that name.)
        of_run = job_runs.alias("paused_run")
        paused = select(of_run.c.paused_at).where(of_run.c.id == literal_column("run_id"))
        return upsert.returning(paused.scalar_subquery())
    # No RETURNING on SQLite: "written" is sqlite3's change count (``write_in_order``),
    # which spares SQLite the returned row and aiosqlite the fetch.
    return upsert


RECORD_STEP_ORDER = (
    "step_step",
    "step_result",
    "step_attempts",
    "step_last_error",
    "step_recorded_at",
    "fence_id",
    "fence_token",
)
"""The step write's parameters, in the order the store passes them."""

RECORD_STEP_ORDER_SQLITE = RECORD_STEP_ORDER * 2
"""The same on SQLite, whose statement reads the run twice (the second time only
when it is paused): the list is passed twice over."""


def start_insert(is_postgres: bool) -> Any:
    """Insert ``row_*`` unless its key is live; on Postgres also NOTIFY ``notify_channel``
    (the NOTIFY rides in the insert's statement, sent only when a row was inserted)."""
    from jobrun.sql.statements.pauses import started_paused

    given = {name: bindparam(f"row_{name}", type_=job_runs.c[name].type) for name in RUN_COLUMNS}
    # Its pause comes back (a run of a paused job starts paused): the last two columns.
    insert = (
        dialect_insert(is_postgres, job_runs)
        .values(given | started_paused(given))
        .on_conflict_do_nothing(index_elements=list(_KEY), index_where=LIVE_ONLY)
        .returning(job_runs.c.id, job_runs.c.paused_at, job_runs.c.pause_reason)
    )
    if not is_postgres:
        return insert
    # Wake listening workers now rather than at their next poll.
    added = insert.cte("added")
    channel = bindparam("notify_channel", type_=Text)
    payload = bindparam("notify_payload", type_=Text)
    return select(func.pg_notify(channel, payload), added.c.paused_at, added.c.pause_reason)


def _given_rows(name: str, is_postgres: bool) -> Any:
    """The JSON array bound as ``name`` (a text), one row per element in ``value``:
    one statement text for a batch of any size, so statement caches hit."""
    if is_postgres:
        from sqlalchemy.dialects.postgresql import JSONB

        # jsonb: parsed once; each ``->>`` on plain json would parse its element again.
        source = func.jsonb_array_elements(cast(bindparam(name, type_=Text), JSONB))
    else:
        source = func.json_each(bindparam(name, type_=Text))
    return source.table_valued("value").alias(f"given_{name}")


def _element(given: Any, index: int, column: Any) -> Any:
    """Element ``index`` of each given row's array, as ``column``'s type (``->>``
    reads both dialects' JSON the same way: a string unquoted, null as NULL)."""
    value = given.c.value.op("->>")(literal_column(str(index)))
    return cast(value, Integer) if isinstance(column.type, Integer) else value


START_MANY_OWN = (
    "id",
    "module_id",
    "job",
    "instance",
    "payload",
    "priority",
    "started_at",
    "updated_at",
    "next_attempt_at",
)
"""The columns in which the rows of a batch of starts differ, each row's array of
``start_many``'s ``rows`` in this order (the start instants too: concurrent
callers' single starts go out as one batch); every other column is one value for the
whole batch, bound once as ``shared_<column>`` (:data:`START_MANY_SHARED`)."""

START_MANY_SHARED = tuple(name for name in RUN_COLUMNS if name not in START_MANY_OWN)


def start_many_insert(is_postgres: bool) -> Any:
    """Insert each run of the JSON array ``rows`` (each an array of its
    :data:`START_MANY_OWN` values; the rest bound once, ``shared_*``) whose key is not
    live; returns the inserted ids. On Postgres one NOTIFY per job among them rides
    in the statement: one wake-up per batch, not per run."""
    from jobrun.sql.statements.pauses import job_pause_of, started_paused_by

    given = _given_rows("rows", is_postgres)
    own = {
        name: _element(given, index, job_runs.c[name]) for index, name in enumerate(START_MANY_OWN)
    }
    shared = {
        name: bindparam(f"shared_{name}", type_=job_runs.c[name].type) for name in START_MANY_SHARED
    }
    elements = {name: own[name] if name in own else shared[name] for name in RUN_COLUMNS}
    # The job's pause record, looked up once per row by an outer join.
    pause = job_pause_of(elements["module_id"], elements["job"])
    elements |= started_paused_by(elements, pause)
    # SQLite: an INSERT ... SELECT with an upsert clause needs a WHERE, or its
    # parser reads ON CONFLICT as a join's ON.
    chosen = select(*elements.values()).select_from(given.outerjoin(*pause)).where(true())
    insert = (
        dialect_insert(is_postgres, job_runs)
        .from_select(list(elements), chosen)
        .on_conflict_do_nothing(index_elements=list(_KEY), index_where=LIVE_ONLY)
    )
    # Each run's pause comes back with its id (a run of a paused job starts paused).
    returned = (job_runs.c.paused_at, job_runs.c.pause_reason)
    if not is_postgres:
        return insert.returning(job_runs.c.id, *returned)
    added = insert.returning(job_runs.c.id, job_runs.c.module_id, job_runs.c.job, *returned)
    added = added.cte("added")
    job_text = cast(func.json_build_array(added.c.module_id, added.c.job), Text).label("job")
    jobs = select(job_text).distinct().subquery("added_jobs")
    # Postgres refuses a notification of 8000 bytes or more: then an empty one,
    # which wakes listeners for any job (as notify_payload does).
    payload = case((func.octet_length(jobs.c.job) <= 7000, jobs.c.job), else_=literal(""))
    woke = select(func.pg_notify(bindparam("notify_channel", type_=Text), payload)).cte("woke")
    # A CTE runs only where it is read: this reads ``woke`` once the batch inserted.
    sent = select(func.count()).select_from(woke).scalar_subquery()
    return select(added.c.id, added.c.paused_at, added.c.pause_reason).where(sent >= 0)


def notify_many() -> Any:
    """Postgres: one NOTIFY ``notify_channel`` per payload of the JSON array ``payloads``,
    in one statement (the wake-up after a pause changes, ``jobrun.sql.store.pauses``)."""
    given = func.json_array_elements_text(cast(bindparam("payloads", type_=Text), JSON))
    payloads = given.table_valued("value").alias("payloads")
    channel = bindparam("notify_channel", type_=Text)
    return select(func.pg_notify(channel, payloads.c.value)).select_from(payloads)


def live_runs_of_keys(is_postgres: bool) -> Any:
    """The live run of each key of the JSON array ``keys`` (each ``[module_id, job,
    instance]``) that has one."""
    given = _given_rows("keys", is_postgres)
    runs = job_runs.c
    matches = and_(
        runs.module_id == _element(given, 0, runs.module_id),
        runs.job == _element(given, 1, runs.job),
        runs.instance == _element(given, 2, runs.instance),
    )
    return select(job_runs).select_from(given).join(job_runs, matches).where(is_live())


class RunStatements:
    """The runs facet's fixed statements (the pass's and the start's), compiled for one
    dialect with the store."""

    def __init__(self, compile_: Compiler, is_postgres: bool) -> None:
        runs = job_runs.c
        by_id = runs.id == bindparam("run_id")
        patch_values: dict[str, Any] = {
            name: bindparam(f"new_{name}", type_=runs[name].type) for name in PATCH_COLUMNS
        }
        if is_postgres:
            patch_values["next_attempt_at"] = _handed_on_expiry()
        # A run paused while its pass ran waits for its unpause once the lease goes.
        patch_values["next_attempt_at"] = parked(
            patch_values["status"],
            runs.paused_at,
            patch_values["lease_owner"],
            patch_values["next_attempt_at"],
        )
        # Whether the run is paused: the pass's commit learns it here (see commit_pass).
        patch = (
            update(job_runs).where(_fence()).values(patch_values).returning(runs.id, runs.paused_at)
        )
        self.get = compile_(select(job_runs).where(by_id))
        self.steps = compile_(
            select(
                job_steps.c.step, job_steps.c.result, job_steps.c.attempts, job_steps.c.last_error
            ).where(job_steps.c.run_id == bindparam("run_id"))
        )
        self.patch = compile_(patch)
        self.drop_ledger = compile_(
            delete(job_steps).where(job_steps.c.run_id == bindparam("fence_id"))
        )
        # Postgres: the pass commit in one statement, atomic by itself; the ledger
        # is dropped only if the fenced write applied.
        written = patch.cte("written")
        dropped = (
            delete(job_steps)
            .where(job_steps.c.run_id.in_(select(written.c.id)))
            .cte("dropped_ledger")
        )
        self.commit_in_one = compile_(select(written.c.id, written.c.paused_at).add_cte(dropped))
        order = RECORD_STEP_ORDER if is_postgres else RECORD_STEP_ORDER_SQLITE
        self.record_step = compile_(_record_step(is_postgres)).in_order(order)
        self.extend_lease = compile_(_extend_lease(False))
        # Postgres, a lease claimed on the database's clock: renewed on it too.
        self.extend_lease_on_database_clock = compile_(_extend_lease(is_postgres))
        self.start = compile_(start_insert(is_postgres))
        self.live = compile_(live_run_of())
        self.notify_many = compile_(notify_many())
        self.start_many = compile_(start_many_insert(is_postgres))
        self.live_many = compile_(live_runs_of_keys(is_postgres))


def _handed_on_expiry() -> Any:
    """Postgres: a pass commit that hands its lease to this driver's next pass
    (``handed_on``) writes a lease expiry counted from its ``updated_at``: counted
    on the database's clock instead. Every other patch writes its value as is."""
    return case(
        (
            bindparam("handed_on", type_=Integer) == 1,
            moved_to_database_clock("new_next_attempt_at", "new_updated_at"),
        ),
        else_=bindparam("new_next_attempt_at", type_=Text),
    )


def _extend_lease(on_database_clock: bool) -> Any:
    """Renew lease ``fence_token`` of run ``fence_id``; never an expired lease, nor to
    an expiry already past. On the caller's clock: ``expires_at`` judged at ``now_at``
    (see ``jobrun._core.time.wall_steps``). On the database's clock (Postgres): both there,
    the new expiry ``lease_ms`` after the statement's start."""
    if on_database_clock:
        now_at: Any = database_now_at()
        lease = func.make_interval(0, 0, 0, 0, 0, 0, bindparam("lease_ms", type_=Integer) / 1000.0)
        expires_at: Any = database_instant(func.statement_timestamp() + lease)
    else:
        now_at = bindparam("now_at", type_=Text)
        expires_at = bindparam("expires_at", type_=Text)
    return (
        update(job_runs)
        # Not expired: an expired lease is never renewed back to life.
        .where(_fence(), is_leased(now_at), expires_at > now_at)
        .values(next_attempt_at=expires_at, **_boot_expiry(on_database_clock))
        .returning(job_runs.c.id)
    )


def _boot_expiry(on_database_clock: bool) -> dict[str, Any]:
    """The renewal's expiry on the boot clock (``boot_id``, ``boot_expires_ms``; NULL
    on Postgres); on the database's clock the columns are left as they are (NULL)."""
    if on_database_clock:
        return {}
    return {
        "lease_boot_id": bindparam("boot_id", type_=Text),
        "lease_boot_expires_ms": bindparam("boot_expires_ms", type_=Integer),
    }


def held_leases_statement(jobs: int | None, with_presence: bool) -> Any:
    """Runs held under an unexpired lease at ``now_at``, of ``jobs`` pairs (``module_{i}``,
    ``job_{i}``; ``None``: every job), with whether each holder's presence is held
    (Postgres, see ``jobrun.sql.postgres.presence``; NULL elsewhere)."""
    runs = job_runs.c
    held = presence_held() if with_presence else null()
    query = select(
        runs.id,
        runs.module_id,
        runs.job,
        runs.lease_owner,
        runs.lease_driver,
        runs.lease_began_at,
        held,
    ).where(
        # Not expired: a held lease's expiry is its due instant (the index's range).
        is_leased(bindparam("now_at", type_=Text)),
        # A paused run is not taken over, so its holder's death concerns no claim.
        not_(is_paused()),
    )
    if jobs is not None:
        pairs = [tuple_(bindparam(f"module_{i}"), bindparam(f"job_{i}")) for i in range(jobs)]
        query = query.where(tuple_(runs.module_id, runs.job).in_(pairs))
    return query
