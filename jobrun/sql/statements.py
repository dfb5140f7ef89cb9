"""Every statement the SQL store sends, as SQLAlchemy Core, compiled once per store.

Values are bound parameters, never part of the statement, so each statement is
compiled once (``Compiler``) and only its parameter list is built per call; the
store picks a statement, binds its values by the names given here, and maps the
rows. The statements of the pass and the claim's write are compiled with the
store (``Statements``). Statements whose shape depends on the call (how many jobs
a claim asks for, which filters a listing or a console page uses, how many ids a
prune batch deletes), and those only some stores send (schedules, the console's
reads, the Postgres clock), are compiled once per shape on first use and kept
(``Shapes``).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any

from sqlalchemy import (
    JSON,
    TIMESTAMP,
    Float,
    Integer,
    String,
    Text,
    and_,
    bindparam,
    case,
    cast,
    delete,
    exists,
    extract,
    false,
    func,
    literal,
    literal_column,
    not_,
    null,
    or_,
    select,
    text,
    true,
    tuple_,
    type_coerce,
    union_all,
    update,
)
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.sql import visitors
from sqlalchemy.sql.elements import Grouping
from sqlalchemy.sql.expression import ClauseElement

from jobrun._core import (
    CLAIM_FIELDS,
    JobRunStatus,
    RunPatch,
    RunRow,
    WorkerRow,
    takeover_note_parts,
)
from jobrun.sql.executor import Compiler, Prepared
from jobrun.sql.presence import presence_held
from jobrun.sql.schema import (
    BY_AGE_ONLY,
    LEASED_ONLY,
    LIVE_ONLY,
    concurrency_slots,
    due_at_of,
    job_retention,
    job_runs,
    job_schedules,
    job_steps,
    job_workers,
    rate_buckets,
)

RUNNING = JobRunStatus.RUNNING.value
FAILED = JobRunStatus.FAILED.value
RUN_COLUMNS = tuple(column.name for column in job_runs.c)
# Statements return whole runs in table order, which is RunRow's field order.
assert tuple(RunRow.__dataclass_fields__) == RUN_COLUMNS
PATCH_COLUMNS = tuple(RunPatch.__dataclass_fields__)
STEP_COLUMNS = ("run_id", "step", "result", "attempts", "last_error", "recorded_at")
_KEY = (job_runs.c.module_id, job_runs.c.job, job_runs.c.instance)
_RUNS = job_runs.c


# -- the rules: SQL twins of jobrun._core.model.predicates, of the same names ----------------------
# Each takes the runs' columns (``job_runs.c`` or an alias's) and returns a condition;
# tests/contract/test_rule_parity.py checks each against its Python home on every
# backend, and tests/unit/test_one_home.py that neither is spelled anywhere else.


def due_at(runs: Any = _RUNS) -> Any:
    """Twin of :func:`jobrun._core.model.predicates.due_at` (the claim-order index's key)."""
    return due_at_of(runs)


def waiting_since(runs: Any = _RUNS) -> Any:
    """Twin of :func:`jobrun._core.model.predicates.waiting_since` (health's oldest wait)."""
    return func.coalesce(runs.next_attempt_at, runs.updated_at)


def is_live(runs: Any = _RUNS) -> Any:
    """Twin of :func:`jobrun._core.model.predicates.is_live` (the constant written into the
    text: one parameter fewer to bind, on the step write among others)."""
    return runs.status == literal_column(f"'{RUNNING}'")


def stored_version(runs: Any = _RUNS) -> Any:
    """Twin of :func:`jobrun._core.model.predicates.stored_version`."""
    return func.coalesce(runs.job_version, literal_column("1"))


def runnable_by(versioned: int, runs: Any = _RUNS) -> Any:
    """Twin of :func:`jobrun._core.model.predicates.runnable_by`, for code whose jobs of a
    version above 1 are ``versioned_module_{i}``, ``versioned_job_{i}`` of version
    ``versioned_version_{i}`` (every other job: version 1). A per-row condition of
    no index: the claim applies it to the rows its index order reads."""
    arms = [
        (
            and_(
                runs.module_id == bindparam(f"versioned_module_{index}"),
                runs.job == bindparam(f"versioned_job_{index}"),
            ),
            bindparam(f"versioned_version_{index}", type_=Integer),
        )
        for index in range(versioned)
    ]
    newest: Any = case(*arms, else_=literal_column("1")) if arms else literal_column("1")
    return stored_version(runs) <= newest


def is_due(now_at: Any, runs: Any = _RUNS) -> Any:
    """Twin of :func:`jobrun._core.model.predicates.is_due` (the claim-order index's range)."""
    return and_(is_live(runs), now_at >= due_at(runs))


def is_leased(now_at: Any, runs: Any = _RUNS) -> Any:
    """Twin of :func:`jobrun._core.model.predicates.is_leased`."""
    return and_(is_live(runs), runs.lease_owner.is_not(None), now_at < due_at(runs))


def is_stranded(now_at: Any, runs: Any = _RUNS) -> Any:
    """Twin of :func:`jobrun._core.model.predicates.is_stranded`."""
    return and_(is_due(now_at, runs), runs.lease_owner.is_not(None))


def has_ended_since(since_at: Any, runs: Any = _RUNS) -> Any:
    """Twin of :func:`jobrun._core.model.predicates.has_ended_since`."""
    return runs.ended_at >= since_at


def is_failed_since(since_at: Any, runs: Any = _RUNS) -> Any:
    """Twin of :func:`jobrun._core.model.predicates.is_failed_since`."""
    return and_(runs.status == FAILED, has_ended_since(since_at, runs))


def is_cancelled(runs: Any = _RUNS) -> Any:
    """Twin of :func:`jobrun._core.model.predicates.is_cancelled`."""
    return and_(runs.status == FAILED, runs.cancelled == 1)


def slot_counts(now_at: Any, slots: Any, runs: Any = _RUNS) -> Any:
    """Twin of :func:`jobrun._core.model.predicates.slot_counts`, for the slot row ``slots``
    and its run ``runs``."""
    return and_(is_leased(now_at, runs), runs.lease_owner == slots.lease_token)


def live_run_of() -> Any:
    """Twin of :func:`jobrun._core.model.predicates.live_run_of`: the live run of the key
    ``row_module_id``, ``row_job``, ``row_instance`` (the partial unique index on
    ``LIVE_ONLY`` keeps it to one)."""
    runs = job_runs.c
    return select(job_runs).where(
        runs.module_id == bindparam("row_module_id"),
        runs.job == bindparam("row_job"),
        runs.instance == bindparam("row_instance"),
        is_live(),
    )


def refill_on_resume() -> Any:
    """Twin of :func:`jobrun._core.model.predicates.refill_on_resume`: the steps of run
    ``run_id`` that never completed get their attempts back; completed ones keep
    their memo."""
    steps = job_steps.c
    return (
        update(job_steps)
        .where(steps.run_id == bindparam("run_id"), steps.result.is_(None))
        .values(attempts=0)
    )


def _fence() -> Any:
    """``this run, still running, still held by this token``, as bound parameters."""
    return and_(
        job_runs.c.id == bindparam("fence_id"),
        is_live(),
        job_runs.c.lease_owner == bindparam("fence_token"),
    )


def dialect_insert(is_postgres: bool, table: Any) -> Any:
    """The dialect's INSERT construct, which knows ``ON CONFLICT``."""
    from sqlalchemy.dialects import postgresql, sqlite

    return (postgresql if is_postgres else sqlite).insert(table)


def _record_step(is_postgres: bool) -> Any:
    """The step write: the ledger row taken from the run's own row, so that the run,
    still running, still held by this token, is both the fence and the source of
    ``run_id`` (no row, nothing written). Seven parameters, all given by the caller
    in :data:`RECORD_STEP_ORDER` (the constants are written into the text): the
    step's path builds that list directly and binds no more than it must."""
    runs = job_runs.c
    given = (bindparam(f"step_{name}", type_=job_steps.c[name].type) for name in STEP_COLUMNS[1:])
    held = select(runs.id, *given).where(
        runs.id == bindparam("fence_id"),
        is_live(),
        runs.lease_owner == bindparam("fence_token"),
    )
    if is_postgres:
        # Lock the run row for the statement: a claim that would take the run over
        # (an UPDATE of that row) waits until this write commits, so the check and
        # the write cannot come apart. SQLite's writer holds the database's write
        # lock for the whole statement.
        held = held.with_for_update(read=True)
    upsert = dialect_insert(is_postgres, job_steps).from_select(list(STEP_COLUMNS), held)
    upsert = upsert.on_conflict_do_update(
        index_elements=[job_steps.c.run_id, job_steps.c.step],
        set_={name: upsert.excluded[name] for name in STEP_COLUMNS[2:]},
    )
    if is_postgres:
        # "Written" is the row this gives back. (Reading asyncpg's status text
        # instead measured no cheaper at 64 in flight: benchmarks/README.md.)
        return upsert.returning(literal_column("1"))
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


def start_insert(is_postgres: bool, *, notify: bool = True) -> Any:
    """Insert ``row_*`` unless its key is live; on Postgres also NOTIFY ``notify_channel``
    (the NOTIFY rides in the insert's statement, sent only when a row was inserted)
    unless ``notify`` is false (``jobrun.sql.start_wakeups`` sends it later)."""
    insert = (
        dialect_insert(is_postgres, job_runs)
        .values({name: bindparam(f"row_{name}") for name in RUN_COLUMNS})
        .on_conflict_do_nothing(index_elements=list(_KEY), index_where=LIVE_ONLY)
        .returning(job_runs.c.id)
    )
    if not (is_postgres and notify):
        return insert
    # Wake listening workers now rather than at their next poll.
    added = insert.cte("added")
    channel = bindparam("notify_channel", type_=Text)
    payload = bindparam("notify_payload", type_=Text)
    return select(func.pg_notify(channel, payload)).select_from(added)


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


def start_many_insert(is_postgres: bool) -> Any:
    """Insert each run of the JSON array ``rows`` (each an array of ``RUN_COLUMNS``
    values) whose key is not live; returns the inserted ids. On Postgres one NOTIFY
    per job among them rides in the statement: one wake-up per batch, not per run."""
    given = _given_rows("rows", is_postgres)
    values = [_element(given, index, job_runs.c[name]) for index, name in enumerate(RUN_COLUMNS)]
    # SQLite: an INSERT ... SELECT with an upsert clause needs a WHERE, or its
    # parser reads ON CONFLICT as a join's ON.
    chosen = select(*values).select_from(given).where(true())
    insert = (
        dialect_insert(is_postgres, job_runs)
        .from_select(list(RUN_COLUMNS), chosen)
        .on_conflict_do_nothing(index_elements=list(_KEY), index_where=LIVE_ONLY)
    )
    if not is_postgres:
        return insert.returning(job_runs.c.id)
    added = insert.returning(job_runs.c.id, job_runs.c.module_id, job_runs.c.job).cte("added")
    job_text = cast(func.json_build_array(added.c.module_id, added.c.job), Text).label("job")
    jobs = select(job_text).distinct().subquery("added_jobs")
    # Postgres refuses a notification of 8000 bytes or more: then an empty one,
    # which wakes listeners for any job (as notify_payload does).
    payload = case((func.octet_length(jobs.c.job) <= 7000, jobs.c.job), else_=literal(""))
    woke = select(func.pg_notify(bindparam("notify_channel", type_=Text), payload)).cte("woke")
    # A CTE runs only where it is read: this reads ``woke`` once the batch inserted.
    sent = select(func.count()).select_from(woke).scalar_subquery()
    return select(added.c.id).where(sent >= 0)


def notify_many() -> Any:
    """Postgres: one NOTIFY ``notify_channel`` per payload of the JSON array ``payloads``,
    in one statement (``jobrun.sql.start_wakeups``)."""
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


class Statements:
    """The store's fixed statements, compiled for one dialect."""

    def __init__(self, compile_: Compiler, is_postgres: bool) -> None:
        runs = job_runs.c
        by_id = runs.id == bindparam("run_id")
        patch_values: dict[str, Any] = {name: bindparam(f"new_{name}") for name in PATCH_COLUMNS}
        if is_postgres:
            patch_values["next_attempt_at"] = _handed_on_expiry()
        patch = update(job_runs).where(_fence()).values(patch_values).returning(runs.id)
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
        self.commit_in_one = compile_(select(written.c.id).add_cte(dropped))
        self.record_step = compile_(_record_step(is_postgres)).in_order(RECORD_STEP_ORDER)
        self.extend_lease = compile_(_extend_lease(False))
        # Postgres, a lease claimed on the database's clock: renewed on it too.
        self.extend_lease_on_database_clock = compile_(_extend_lease(is_postgres))
        self.start = compile_(start_insert(is_postgres))
        self.live = compile_(live_run_of())
        self.start_quiet = compile_(start_insert(is_postgres, notify=False))
        self.notify_many = compile_(notify_many())
        self.start_many = compile_(start_many_insert(is_postgres))
        self.live_many = compile_(live_runs_of_keys(is_postgres))
        self._operator(compile_)

    def _operator(self, compile_: Compiler) -> None:
        self.refill = compile_(refill_on_resume())
        self._operator_reads(compile_)

    def _operator_reads(self, compile_: Compiler) -> None:
        runs = job_runs.c
        now_at = bindparam("now_at", type_=Text)
        live = is_live()
        # Due includes the stranded: a lease that expired is due since its expiry.
        waiting = is_due(now_at)
        # The running range of the claim-order index (status leads it).
        self.due_by_job = compile_(
            select(runs.module_id, runs.job, func.count())
            .where(waiting)
            .group_by(runs.module_id, runs.job)
        )
        # The running range of the status index; a few rows per job (one per version).
        version = stored_version()
        self.versions_by_job = compile_(
            select(runs.module_id, runs.job, version, func.count())
            .where(live)
            .group_by(runs.module_id, runs.job, version)
        )
        # Finished runs are kept forever; every filter here leads with status so
        # the history is never scanned (done runs are not counted at all).
        self.health = compile_(
            select(
                func.count().filter(live),
                func.count().filter(waiting),
                func.count().filter(is_leased(now_at)),
                func.count().filter(runs.status == FAILED),
                func.min(waiting_since()).filter(waiting),
                func.count().filter(is_cancelled()),
            ).where(runs.status.in_([literal(RUNNING), literal(FAILED)]))
        )


class Shapes:
    """Statements compiled once per shape, on first use."""

    def __init__(self, compile_: Compiler) -> None:
        self._compile = compile_
        self._known: dict[tuple[Hashable, ...], Prepared] = {}

    def of(self, build: Callable[..., ClauseElement], *shape: Hashable) -> Prepared:
        """``build(*shape)``, compiled the first time this shape is asked for."""
        key = (build, *shape)
        found = self._known.get(key)
        if found is None:
            found = self._known[key] = self._compile(build(*shape))
        return found


def _in_flight(module: str, job: str) -> Any:
    """How many runs of the job named by parameters ``module`` and ``job`` are leased
    (a separate alias: the count must not correlate with the claim's candidate row)."""
    leased = job_runs.alias("leased")
    return (
        select(func.count())
        .select_from(leased)
        .where(
            # The partial index's predicate spelled as its own, so both engines use it.
            LEASED_ONLY,
            leased.c.module_id == bindparam(module),
            leased.c.job == bindparam(job),
            is_leased(bindparam("now_at", type_=Text), leased.c),
        )
        .scalar_subquery()
    )


def limit_locks(count: int) -> Any:
    """Postgres: the advisory locks ``lock_{i}`` that order limited claims."""
    return select(*(func.pg_advisory_xact_lock(bindparam(f"lock_{i}")) for i in range(count)))


def _due_runs(
    runs: Any, columns: list[Any], limited: int, by_age: bool, versioned: int, jobs: int
) -> Any:
    """The due runs in claim order (of ``runs``, the table or an alias's columns), among
    the requested jobs under their limits. The order is an index's key order, so a
    claim reads it front to back and stops at the first fits: priority first
    (``_substrat_job_runs_claim_order``), or, ``by_age``, due instant then id
    (``_substrat_job_runs_due_order``)."""
    pairs: list[Any] = [(bindparam(f"module_{i}"), bindparam(f"job_{i}")) for i in range(jobs)]
    candidate = select(*columns).where(
        is_due(bindparam("now_at", type_=Text), runs),
        tuple_(runs.module_id, runs.job).in_([tuple_(*pair) for pair in pairs]),
        runnable_by(versioned, runs),
    )
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
                _room(index) > 0,
            )
        )
    return candidate


def _room(index: int) -> Any:
    """How many more runs limited job ``index`` may lease now."""
    most = bindparam(f"limited_most_{index}", type_=job_runs.c.attempts.type)
    return most - _in_flight(f"limited_module_{index}", f"limited_job_{index}")


def _due_candidate(jobs: int, skipped: int, limited: int, by_age: bool, versioned: int) -> Any:
    """The first due run in claim order, among the requested jobs under their limits."""
    runs = job_runs.c
    candidate = _due_runs(runs, [runs.id], limited, by_age, versioned, jobs).limit(1)
    return candidate.where(*_not_skipped(skipped)).scalar_subquery()


def _not_skipped(skipped: int) -> list[Any]:
    if not skipped:
        return []
    return [job_runs.c.id.not_in([bindparam(f"skip_{i}") for i in range(skipped)])]


def _dead(dead: int) -> list[Any]:
    return [bindparam(f"dead_{i}") for i in range(dead)]


def _orphan_candidate(pairs: list[Any], dead: int, skipped: int, versioned: int) -> Any:
    """An orphaned run: leased by a holder proven dead (``dead_{i}``; see
    ``leases.proof_of_death``), as ``rules.transitions.is_orphan``. Taking it
    over adds no pass in flight, so per-job limits do not apply."""
    runs = job_runs.c
    return (
        select(runs.id)
        .where(
            # Leased (once expired it is simply due): the due index's range.
            is_leased(bindparam("now_at", type_=Text)),
            runs.lease_owner.in_(_dead(dead)),
            tuple_(runs.module_id, runs.job).in_([tuple_(*pair) for pair in pairs]),
            runnable_by(versioned),
            *_not_skipped(skipped),
        )
        .limit(1)
        .scalar_subquery()
    )


def claim_read(
    jobs: int, skipped: int, limited: int, dead: int, by_age: bool = False, versioned: int = 0
) -> Any:
    """SQLite: the run a claim would get, whole: for ``jobs`` (module_id, job) pairs
    (``module_{i}``, ``job_{i}``), passing over ``skipped`` ids (``skip_{i}``) and
    ``limited`` jobs at their concurrency limit (``limited_*_{i}``,
    ``limited_most_{i}``); a run held by one of ``dead`` proven-dead lease owners
    (``dead_{i}``) comes first; ``by_age``: the due run due longest, whatever its
    priority; neither of a version newer than the code's (``versioned`` jobs of a
    version above 1, see :func:`runnable_by`). The same rules as
    ``jobrun._core.rules.transitions.claim_candidate``."""
    pairs: list[Any] = [(bindparam(f"module_{i}"), bindparam(f"job_{i}")) for i in range(jobs)]
    chosen: Any = _due_candidate(jobs, skipped, limited, by_age, versioned)
    if dead:
        chosen = func.coalesce(_orphan_candidate(pairs, dead, skipped, versioned), chosen)
    return select(job_runs).where(job_runs.c.id == chosen)


# The stored instant text (jobrun._core.model.formats.format_instant), as Postgres writes it.
_INSTANT_FORMAT = 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"'


def database_instant(moment: Any) -> Any:
    """Postgres: a ``timestamptz`` expression as stored instant text (UTC, milliseconds)."""
    return func.to_char(
        func.timezone(literal_column("'UTC'"), moment), literal_column(f"'{_INSTANT_FORMAT}'")
    )


def database_now_at() -> Any:
    """Postgres: the database's clock as the statement runs, as stored instant text.
    The statement's start, not the transaction's: a claim waiting on a limit's lock
    judges expiries and counts its lease from after the wait."""
    return database_instant(func.statement_timestamp())


def on_database_clock(statement: Any) -> Any:
    """``statement`` with its ``now_at`` parameter read from the database's clock."""

    def replace(element: Any, **_: Any) -> Any:
        if getattr(element, "key", None) == "now_at" and element.__visit_name__ == "bindparam":
            return database_now_at()
        return None

    options: dict[str, Any] = {}
    return visitors.replacement_traverse(statement, options, replace)


def _moved_to_database_clock(instant: str, counted_from: str) -> Any:
    """Postgres: parameter ``instant``, counted on a client's clock from parameter
    ``counted_from``, moved by that clock's distance to the database's right now."""

    def moment(name: str) -> Any:
        return cast(bindparam(name, type_=Text), TIMESTAMP(timezone=True))

    return database_instant(moment(instant) + (func.statement_timestamp() - moment(counted_from)))


def _handed_on_expiry() -> Any:
    """Postgres: a pass commit that hands its lease to this driver's next pass
    (``handed_on``) writes a lease expiry counted from its ``updated_at``: counted
    on the database's clock instead. Every other patch writes its value as is."""
    return case(
        (
            bindparam("handed_on", type_=Integer) == 1,
            _moved_to_database_clock("new_next_attempt_at", "new_updated_at"),
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
        .values(next_attempt_at=expires_at)
        .returning(job_runs.c.id)
    )


def claim_write(limited: bool) -> Any:
    """Write a claim's decision (``new_*``) on run ``fence_id``, fenced on the values the
    decision read (``was_*``): if any changed since (another claimer, a holder's
    write, an operator), nothing is written. ``limited``: and only while the run's
    job (``check_module``, ``check_job``) holds fewer than ``check_most`` unexpired
    leases, counted in the same statement."""
    runs = job_runs.c
    fence = [runs.id == bindparam("fence_id"), is_live()]
    fence += [runs[name].is_not_distinct_from(bindparam(f"was_{name}")) for name in CLAIM_FIELDS]
    if limited:
        most = bindparam("check_most", type_=runs.attempts.type)
        fence.append(_in_flight("check_module", "check_job") < most)
    values: dict[str, Any] = {name: bindparam(f"new_{name}") for name in CLAIM_FIELDS}
    return update(job_runs).where(*fence).values(values).returning(*job_runs.c)


# -- the Postgres claim: one statement, skipping the rows other claimers hold ----------------
# Parameters: ``now_at``, ``began_at`` (the claimer's instant, where the lease is
# counted from), ``driver``, ``tokens`` (one per run wanted: the i-th claimed gets
# the i-th), ``skip_ids`` and ``dead`` (arrays: the statement's text never depends on
# their lengths, so the driver's prepared statement is reused), and per job
# ``module_{i}``, ``job_{i}``, ``expires_{i}``. See ``SqlJobRunStore.claim_batch``.


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
    due = _due_runs(
        runs,
        [*columns, literal_column("0").label("orphan"), _ledger_empty(candidate)],
        limited,
        by_age,
        versioned,
        jobs,
    )
    due = clock(due.where(not_skipped).limit(wanted).with_for_update(skip_locked=True))
    if not dead:
        return due.subquery("locked")
    pairs: list[Any] = [(bindparam(f"module_{i}"), bindparam(f"job_{i}")) for i in range(jobs)]
    orphans = (
        select(*columns, literal_column("1").label("orphan"), false().label("ledger_empty"))
        .where(
            is_leased(bindparam("now_at", type_=Text), runs),
            runs.lease_owner == func.any(_text_array("dead")),
            tuple_(runs.module_id, runs.job).in_([tuple_(*pair) for pair in pairs]),
            runnable_by(versioned, runs),
            not_skipped,
        )
        .limit(wanted)
        .with_for_update(skip_locked=True)
    )
    return union_all(clock(orphans).subquery().select(), due.subquery().select()).subquery("locked")


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
    """What a claim writes: twin of ``jobrun._core.rules.transitions.claim_transition``
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
            expiry = _moved_to_database_clock(f"expires_{index}", "began_at")
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
    ``jobrun._core.rules.transitions.claim_candidate`` applied run after run (orphans
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


def change_statement(columns: tuple[str, ...], leased: bool) -> Any:
    """An operator's change (``jobrun._core.rules.transitions.RunChange``): ``new_{column}``
    on run ``run_id`` while its status is ``when_status`` (and, if ``leased``, it
    holds a lease)."""
    runs = job_runs.c
    condition = [runs.id == bindparam("run_id"), runs.status == bindparam("when_status")]
    if leased:
        condition.append(runs.lease_owner.is_not(None))
    return (
        update(job_runs)
        .where(*condition)
        .values({name: bindparam(f"new_{name}") for name in columns})
        .returning(runs.id)
    )


def held_leases_statement(jobs: int | None, with_presence: bool) -> Any:
    """Runs held under an unexpired lease at ``now_at``, of ``jobs`` pairs (``module_{i}``,
    ``job_{i}``; ``None``: every job), with whether each holder's presence is held
    (Postgres, see ``jobrun.sql.presence``; NULL elsewhere)."""
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
    )
    if jobs is not None:
        pairs = [tuple_(bindparam(f"module_{i}"), bindparam(f"job_{i}")) for i in range(jobs)]
        query = query.where(tuple_(runs.module_id, runs.job).in_(pairs))
    return query


LIST_FILTERS = ("module_id", "job", "instance", "status")


def list_statement(filters: tuple[str, ...], cancelled: bool | None = None) -> Any:
    """The operator listing for the named equality filters (``filter_<name>``) and
    ``limit``; ``cancelled`` True or False keeps only the runs that are (are not)
    cancelled."""
    conditions = [job_runs.c[name] == bindparam(f"filter_{name}") for name in filters]
    if cancelled is not None:
        conditions.append(is_cancelled() if cancelled else not_(is_cancelled()))
    return (
        select(job_runs)
        .where(and_(True, *conditions))
        .order_by(job_runs.c.id.desc())
        .limit(bindparam("limit", type_=job_runs.c.attempts.type))
    )


def prune_ledgers(ids: int) -> Any:
    """One prune batch's ledgers: the runs ``id_{i}`` just deleted."""
    id_params: list[Any] = [bindparam(f"id_{i}") for i in range(ids)]
    return delete(job_steps).where(job_steps.c.run_id.in_(id_params))


def _any_job(prefix: str, jobs: int) -> Any:
    """``(module_id, job)`` is one of ``jobs`` pairs (``{prefix}module_{i}``,
    ``{prefix}job_{i}``), spelled without a tuple IN (whose values the drivers would
    need SQLAlchemy to unpack)."""
    runs = job_runs.c
    return or_(
        *(
            and_(
                runs.module_id == bindparam(f"{prefix}module_{i}"),
                runs.job == bindparam(f"{prefix}job_{i}"),
            )
            for i in range(jobs)
        )
    )


def is_prunable(statuses: int, only_jobs: int | None, except_jobs: int) -> Any:
    """Twin of :func:`jobrun._core.model.predicates.is_prunable`: status one of ``statuses``
    (``pruned_status_{i}``), never live, ended before ``ended_before``; of
    ``only_jobs`` pairs (``only_module_{i}``, ``only_job_{i}``; ``None``: any job) and
    none of ``except_jobs`` (``except_*_{i}``)."""
    runs = job_runs.c
    conditions = [
        runs.status.in_(
            [bindparam(f"pruned_status_{i}", type_=runs.status.type) for i in range(statuses)]
        ),
        not_(is_live()),
        runs.ended_at < bindparam("ended_before"),
    ]
    if only_jobs is not None:
        conditions.append(_any_job("only_", only_jobs))
    if except_jobs:
        conditions.append(not_(_any_job("except_", except_jobs)))
    return and_(*conditions)


def prune_runs(statuses: int, only_jobs: int | None, except_jobs: int) -> Any:
    """One prune batch: delete at most ``batch_size`` runs in id order that
    :func:`is_prunable` selects. Each run is checked again as it is deleted (a run
    resumed since the batch was chosen stays); returns the ids deleted."""
    runs = job_runs.c
    doomed = (
        select(runs.id)
        .where(is_prunable(statuses, only_jobs, except_jobs))
        .order_by(runs.id)
        .limit(bindparam("batch_size", type_=runs.attempts.type))
    )
    return delete(job_runs).where(runs.id.in_(doomed), not_(is_live())).returning(runs.id)


def next_due_statement() -> Any:
    """The earliest due instant of the live runs (a lease's expiry among them: while
    a run is leased, its due instant is the lease's end): when an idle worker looks
    again (see ``jobrun.wakeups``)."""
    return select(func.min(due_at())).where(is_live())


def take_database_statement() -> Any:
    """Postgres: try the session advisory lock that says "a worker serves this database"
    (the two-key form, so it is never read as a presence key: those are one bigint)."""
    return select(func.pg_try_advisory_lock(bindparam("lease_class"), bindparam("lease_key")))


def release_database_statement() -> Any:
    """Postgres: let go of the lock of :func:`take_database_statement`."""
    return select(func.pg_advisory_unlock(bindparam("lease_class"), bindparam("lease_key")))


def collation_statement() -> Any:
    """Postgres: the database's collation (its text columns' default)."""
    return text("SELECT datcollate FROM pg_database WHERE datname = current_database()")


def is_bytewise_collation(name: str) -> bool:
    """Whether a Postgres collation orders text by code point (so a range holds every
    string with a prefix): C, POSIX and C.UTF-8 do; linguistic ones (en_US…) need not."""
    return name in ("C", "POSIX", "ucs_basic") or name.upper().replace("-", "") in ("C.UTF8",)


def clock_statement() -> Any:
    """Postgres: the database's clock, read as the statement runs."""
    return select(func.clock_timestamp())


# -- schedules (jobrun._core.port.ScheduleStore) ---------------------------------------------

SCHEDULE_COLUMNS = tuple(column.name for column in job_schedules.c)


def schedule_rows_statement() -> Any:
    """Every schedule's row, in key order."""
    return select(job_schedules).order_by(*job_schedules.primary_key.columns)


def add_schedule_statement(is_postgres: bool) -> Any:
    """Insert the schedule row ``row_*`` unless its key has one already."""
    return (
        dialect_insert(is_postgres, job_schedules)
        .values({name: bindparam(f"row_{name}") for name in SCHEDULE_COLUMNS})
        .on_conflict_do_nothing(index_elements=list(job_schedules.primary_key.columns))
    )


def _slot_key() -> Any:
    slots = job_schedules.c
    return and_(
        slots.module_id == bindparam("slot_module_id"),
        slots.job == bindparam("slot_job"),
        slots.schedule == bindparam("slot_schedule"),
    )


def take_slot_statement() -> Any:
    """The conditional write that picks the one caller who starts a slot: the schedule
    ``slot_*`` moves to ``new_last_slot_at`` (with ``new_last_run_id``,
    ``new_updated_at``) only from an earlier slot of the same cron ``slot_cron``. On
    Postgres a second caller waits on the row, then finds the slot taken."""
    slots = job_schedules.c
    return (
        update(job_schedules)
        .where(
            _slot_key(),
            slots.cron == bindparam("slot_cron"),
            slots.last_slot_at < bindparam("new_last_slot_at"),
        )
        .values(
            last_slot_at=bindparam("new_last_slot_at"),
            last_run_id=bindparam("new_last_run_id"),
            updated_at=bindparam("new_updated_at"),
        )
        .returning(slots.module_id)
    )


def reset_schedule_statement() -> Any:
    """The schedule ``slot_*`` counts the slots of ``new_cron`` from ``new_last_slot_at``
    (with ``new_last_run_id``, ``new_updated_at``), only if its cron is still
    ``old_cron`` (NULL matching NULL): of callers who read the same row, one resets it."""
    slots = job_schedules.c
    return (
        update(job_schedules)
        .where(_slot_key(), slots.cron.is_not_distinct_from(bindparam("old_cron", type_=Text())))
        .values(
            last_slot_at=bindparam("new_last_slot_at"),
            last_run_id=bindparam("new_last_run_id"),
            updated_at=bindparam("new_updated_at"),
            cron=bindparam("new_cron"),
        )
        .returning(slots.module_id)
    )


def remove_schedule_statement() -> Any:
    """Delete the row of the schedule ``slot_*`` (none: nothing)."""
    return delete(job_schedules).where(_slot_key())


def point_slot_statement() -> Any:
    """Point the schedule ``slot_*`` at the live run ``new_last_run_id`` it joined."""
    return update(job_schedules).where(_slot_key()).values(last_run_id=bindparam("new_last_run_id"))


# -- each job's own retention (jobrun._core.port.OperatorStore) ------------------------------


def record_retention_statement(is_postgres: bool) -> Any:
    """Record the retention ``keep_for_s`` of the job ``kept_module_id``, ``kept_job``
    (``updated_at``), replacing what was recorded."""
    inserted = dialect_insert(is_postgres, job_retention).values(
        module_id=bindparam("kept_module_id"),
        job=bindparam("kept_job"),
        keep_for_s=bindparam("keep_for_s"),
        updated_at=bindparam("updated_at"),
    )
    return inserted.on_conflict_do_update(
        index_elements=list(job_retention.primary_key.columns),
        set_={
            "keep_for_s": inserted.excluded.keep_for_s,
            "updated_at": inserted.excluded.updated_at,
        },
    )


def forget_retention_statement() -> Any:
    """Delete the recorded retention of the job ``kept_module_id``, ``kept_job``."""
    kept = job_retention.c
    return delete(job_retention).where(
        kept.module_id == bindparam("kept_module_id"), kept.job == bindparam("kept_job")
    )


def recorded_retention_statement() -> Any:
    """Every job's recorded retention: ``(module_id, job, keep_for_s)``."""
    kept = job_retention.c
    return select(kept.module_id, kept.job, kept.keep_for_s).order_by(kept.module_id, kept.job)


# -- the workers that said they are alive (jobrun._core.operator.worker_registry) ------------------

WORKER_COLUMNS = tuple(column.name for column in job_workers.c)
# Rows come back in table order, which is WorkerRow's field order.
assert tuple(WorkerRow.__dataclass_fields__) == WORKER_COLUMNS


def worker_is_live(now_at: Any) -> Any:
    """Twin of :func:`jobrun._core.operator.worker_registry.worker_is_live`."""
    return job_workers.c.expires_at > now_at


def beat_worker_statement(is_postgres: bool) -> Any:
    """Write the worker row ``worker_*``: inserted at its first heartbeat (or again, if a
    sweep took it for gone), its heartbeat, expiry and jobs refreshed after."""
    inserted = dialect_insert(is_postgres, job_workers).values(
        {name: bindparam(f"worker_{name}") for name in WORKER_COLUMNS}
    )
    return inserted.on_conflict_do_update(
        index_elements=[job_workers.c.id],
        set_={
            name: getattr(inserted.excluded, name)
            for name in ("jobs", "heartbeat_at", "expires_at")
        },
    )


def forget_worker_statement() -> Any:
    """Delete the row of the worker ``worker_id`` (it stopped)."""
    return delete(job_workers).where(job_workers.c.id == bindparam("worker_id"))


def sweep_workers_statement() -> Any:
    """Delete the rows of workers gone by ``now_at``."""
    return delete(job_workers).where(not_(worker_is_live(bindparam("now_at", type_=Text))))


def live_workers_statement() -> Any:
    """The rows of workers live at ``now_at``, oldest first."""
    return (
        select(job_workers)
        .where(worker_is_live(bindparam("now_at", type_=Text)))
        .order_by(job_workers.c.started_at, job_workers.c.id)
    )


# -- the console's reads (jobrun._core.operator.browse.BrowsableStore) -----------------------------


def _instance_prefixed(names: tuple[str, ...]) -> list[Any]:
    """The instance starts with ``query_prefix`` (``query_prefix_length`` characters);
    on SQLite also within ``query_prefix_lower`` and ``query_prefix_upper`` (if given),
    the range that lets the key index seek within a job. SQLite compares text
    bytewise; a Postgres database need not, and a range is a superset of the prefix
    only under a bytewise collation."""
    instance = job_runs.c.instance
    # substr, not LIKE: LIKE is case-blind on SQLite and treats % and _ specially.
    length = bindparam("query_prefix_length", type_=job_runs.c.attempts.type)
    bounds = [func.substr(instance, 1, length) == bindparam("query_prefix", type_=String())]
    if "query_prefix_lower" in names:
        bounds.append(instance >= bindparam("query_prefix_lower"))
    if "query_prefix_upper" in names:
        bounds.append(instance < bindparam("query_prefix_upper"))
    return bounds


def run_matches(names: tuple[str, ...]) -> list[Any]:
    """Twin of :func:`jobrun._core.operator.browse.run_matches`: the conditions of a console
    query (``jobrun._core.operator.browse.RunQuery``) that has the values ``names``:
    ``query_module_id``, ``query_job``, the ``query_prefix`` ones,
    ``query_status_<status>`` (markers), ``query_started_since_at`` with ``query_first_id``,
    ``query_stranded_at``, ``query_before_id``, ``query_leased_at``,
    ``query_failed_since_at``."""
    runs = job_runs.c
    conditions = [
        runs[name] == bindparam(f"query_{name}")
        for name in ("module_id", "job")
        if f"query_{name}" in names
    ]
    if "query_prefix" in names:
        conditions.extend(_instance_prefixed(names))
    # The statuses are part of the statement (markers ``query_status_<status>``, each
    # a JobRunStatus value), not parameters: Postgres's plan for a reused statement
    # must know that 'failed' is a narrow range and 'done' is most of the history.
    statuses: list[Any] = [
        literal_column(f"'{JobRunStatus(name.removeprefix('query_status_')).value}'")
        for name in names
        if name.startswith("query_status_")
    ]
    status: Any = runs.status
    if "query_prefix" in names and "query_job" not in names:
        # The instance range is the narrow one: spelled as an expression, the status
        # cannot draw the planner to its index (SQLite would scan every done run).
        status = status.concat(literal(""))
    if statuses:
        conditions.append(status.in_(statuses))
    if "query_started_since_at" in names:
        # The id bound is the index-friendly half (see RunQuery): a range on every
        # index that ends in id, so the pages and counts seek.
        conditions.append(runs.started_at >= bindparam("query_started_since_at"))
        conditions.append(runs.id >= bindparam("query_first_id"))
    if "query_stranded_at" in names:
        conditions.append(is_stranded(bindparam("query_stranded_at")))
    if "query_before_id" in names:
        conditions.append(runs.id < bindparam("query_before_id"))
    if "query_leased_at" in names:
        conditions.append(is_leased(bindparam("query_leased_at", type_=Text)))
    if "query_failed_since_at" in names:
        conditions.append(is_failed_since(bindparam("query_failed_since_at", type_=Text)))
    # Markers, not values: the statement's shape says which way (see the store).
    if "query_cancelled" in names:
        conditions.append(is_cancelled())
    if "query_not_cancelled" in names:
        conditions.append(not_(is_cancelled()))
    return conditions


def find_statement(names: tuple[str, ...], arms: int) -> Any:
    """A console page: runs the query of values ``names`` selects, newest first, ``limit`` at most.
    With ``arms`` statuses (``arm_{i}``, more than one), each status reads its own
    id-ordered range of (module_id, job, status, id) or (status, id), stopped by the
    limit, and the few rows are merged."""
    runs = job_runs.c
    conditions = run_matches(names)
    limit = bindparam("limit", type_=runs.attempts.type)
    if arms < 2:
        return select(job_runs).where(and_(True, *conditions)).order_by(runs.id.desc()).limit(limit)
    pieces = [
        select(job_runs)
        .where(*conditions, runs.status == bindparam(f"arm_{i}"))
        .order_by(runs.id.desc())
        .limit(limit)
        .subquery()
        for i in range(arms)
    ]
    merged = union_all(*(select(piece) for piece in pieces)).subquery()
    return select(merged).order_by(merged.c.id.desc()).limit(limit)


def count_statement(names: tuple[str, ...]) -> Any:
    """How many runs the query of values ``names`` selects, ``cap`` at most: the LIMIT inside
    bounds the work to ``cap`` index entries."""
    capped = (
        select(literal(1))
        # Named: a query with no conditions would otherwise select from nothing (one row).
        .select_from(job_runs)
        .where(and_(True, *run_matches(names)))
        .limit(bindparam("cap", type_=job_runs.c.attempts.type))
    )
    return select(func.count()).select_from(capped.subquery())


def job_loads_statement() -> Any:
    """Per job with live runs or runs failed since ``failed_since_at``: running, due by
    ``now_at`` (stranded ones included), the oldest due instant, stranded, failed since."""
    runs = job_runs.c
    now_at = bindparam("now_at", type_=Text)
    live = is_live()
    waiting = is_due(now_at)
    failed = is_failed_since(bindparam("failed_since_at"))
    return (
        select(
            runs.module_id,
            runs.job,
            func.count().filter(live),
            func.count().filter(waiting),
            func.min(waiting_since()).filter(waiting),
            func.count().filter(is_stranded(now_at)),
            func.count().filter(failed),
        )
        # Status leads, as in health(): finished history is not scanned.
        .where(runs.status.in_([literal(RUNNING), literal(FAILED)]), live | failed)
        .group_by(runs.module_id, runs.job)
        .order_by(runs.module_id, runs.job)
    )


def _bucket(column: Any, chars: int) -> Any:
    """The first ``chars`` characters of a stored instant: its minute (16) or hour (13).
    A literal, not a parameter: the GROUP BY must repeat the very expression."""
    return func.substr(column, 1, literal_column(str(int(chars)))).label("bucket")


def _of_job(names: tuple[str, ...], *, from_ended_index: bool = False) -> list[Any]:
    """The chart's job filter. ``from_ended_index``: compared as ``column || ''``, which
    keeps SQLite's planner (no statistics) off the job's index: that one would read a
    table row per run the job ever had, where the ended_at range of the finished-runs
    index, which holds the job too, is read alone (about 20 times faster for one job's
    day at 1,000,000 runs)."""
    runs = job_runs.c
    return [
        (runs[name].concat(literal_column("''")) if from_ended_index else runs[name])
        == bindparam(f"activity_{name}")
        for name in ("module_id", "job")
        if f"activity_{name}" in names
    ]


def activity_started_statement(chars: int, names: tuple[str, ...]) -> Any:
    """Runs started per bucket since ``activity_since_at`` (and id from ``activity_first_id``,
    the primary key's range, as a console query's "started since")."""
    runs = job_runs.c
    bucket = _bucket(runs.started_at, chars)
    return (
        select(bucket, func.count())
        .where(
            runs.id >= bindparam("activity_first_id"),
            runs.started_at >= bindparam("activity_since_at"),
            *_of_job(names),
        )
        .group_by(bucket)
    )


def activity_ended_statement(chars: int, names: tuple[str, ...]) -> Any:
    """Runs finished, and of them failed, per bucket since ``activity_since_at`` (the
    ``ended_at`` index's range)."""
    runs = job_runs.c
    bucket = _bucket(runs.ended_at, chars)
    return (
        select(bucket, func.count(), func.count().filter(runs.status == FAILED))
        .where(
            has_ended_since(bindparam("activity_since_at", type_=Text)),
            *_of_job(names, from_ended_index=True),
        )
        .group_by(bucket)
    )


# -- rate and concurrency limits (jobrun._core.limits.declarations) --------------------------------
# The dialect part: the database's clock as instant text, and time between two
# instant texts. Everything else is the same SQL on both engines.


def database_now(is_postgres: bool) -> Any:
    """The database's clock now, as ``jobrun._core.model.formats.format_instant`` writes
    instants (milliseconds truncated, UTC, ``Z``)."""
    if is_postgres:
        utc = func.timezone(literal_column("'UTC'"), func.clock_timestamp())
        return func.to_char(utc, literal_column('\'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"\''))
    return func.strftime(literal_column("'%Y-%m-%dT%H:%M:%fZ'"), literal_column("'now'"))


def database_later(is_postgres: bool) -> Any:
    """The database's clock ``later_s`` seconds (a bind) from now, as
    :func:`database_now` writes instants."""
    if is_postgres:
        seconds = func.make_interval(0, 0, 0, 0, 0, 0, bindparam("later_s", type_=Float))
        utc = func.timezone(literal_column("'UTC'"), func.clock_timestamp() + seconds)
        return func.to_char(utc, literal_column('\'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"\''))
    modifier = bindparam("later_modifier", type_=Text)
    return func.strftime(literal_column("'%Y-%m-%dT%H:%M:%fZ'"), literal_column("'now'"), modifier)


def ms_between(is_postgres: bool, earlier: Any, later: Any) -> Any:
    """Milliseconds from instant text ``earlier`` to ``later`` (whole, as both are)."""
    if is_postgres:
        stamp = TIMESTAMP(timezone=True)
        return extract("epoch", cast(later, stamp) - cast(earlier, stamp)) * 1000
    per_day: Any = literal_column("86400000.0")
    return func.round((func.julianday(later) - func.julianday(earlier)) * per_day)


def _whole(is_postgres: bool, amount: Any) -> Any:
    """``amount`` (never negative here) rounded down to a whole number."""
    return func.floor(amount) if is_postgres else cast(amount, Integer)


def _least(is_postgres: bool, *values: Any) -> Any:
    return func.least(*values) if is_postgres else func.min(*values)


def _greatest(is_postgres: bool, *values: Any) -> Any:
    return func.greatest(*values) if is_postgres else func.max(*values)


def take_token_statement(is_postgres: bool) -> Any:
    """Refill bucket ``bucket_key`` on the database's clock and reserve one token, in
    one statement (created full, less the token, at its first take); returns the
    milli-tokens left. The arithmetic is :func:`jobrun._core.limits.declarations.take`'s:
    whole milli-tokens gained (``bucket_rate`` per ms), capped at
    ``bucket_burst_milli``, minus 1000. On Postgres the row lock orders concurrent
    takers; SQLite runs one writer at a time. Also returns the milliseconds until
    the bucket's refill instant, when a cooling down put it in the future."""
    buckets = rate_buckets.c
    columns = ["limit_key", "per_second", "burst", "milli_tokens", "refilled_at"]
    values = select(
        bindparam("bucket_key", type_=Text),
        bindparam("bucket_per_second", type_=Text),
        bindparam("bucket_burst", type_=Integer),
        bindparam("bucket_first_milli", type_=Integer),
        database_now(is_postgres),
    ).where(true())  # SQLite needs a WHERE before ON CONFLICT in an INSERT ... SELECT
    insert = dialect_insert(is_postgres, rate_buckets).from_select(columns, values)
    now_at = insert.excluded.refilled_at
    # A clock read before another taker's later one counts as no time at all.
    elapsed_ms = _greatest(is_postgres, ms_between(is_postgres, buckets.refilled_at, now_at), 0)
    # Untyped: a float bind would need processing (the drivers take the float as is).
    gained = _whole(is_postgres, elapsed_ms * bindparam("bucket_rate"))
    full = bindparam("bucket_burst_milli", type_=Integer)
    return insert.on_conflict_do_update(
        index_elements=[buckets.limit_key],
        set_={
            "milli_tokens": _least(is_postgres, full, buckets.milli_tokens + gained) - 1000,
            "refilled_at": _greatest(is_postgres, buckets.refilled_at, now_at),
            "per_second": insert.excluded.per_second,
            "burst": insert.excluded.burst,
        },
    ).returning(
        buckets.milli_tokens,
        # A bucket cooling down refills from a later instant: the wait until then.
        _greatest(
            is_postgres, ms_between(is_postgres, database_now(is_postgres), buckets.refilled_at), 0
        ),
    )


def give_back_token_statement(is_postgres: bool) -> Any:
    """One token back to bucket ``bucket_key``, ``bucket_burst_milli`` at most."""
    buckets = rate_buckets.c
    full = bindparam("bucket_burst_milli", type_=Integer)
    return (
        update(rate_buckets)
        .where(buckets.limit_key == bindparam("bucket_key"))
        .values(milli_tokens=_least(is_postgres, full, buckets.milli_tokens + 1000))
    )


def cool_limit_statement(is_postgres: bool) -> Any:
    """Hold bucket ``bucket_key`` until ``later_s`` from the database's now: it refills
    from then on, one token there for the first taker; a longer cooling down
    already set is kept. Created (so held) if nobody took a token yet."""
    buckets = rate_buckets.c
    columns = [
        "limit_key", "per_second", "burst", "milli_tokens", "refilled_at",
        "cooling_until", "cooling_reason",
    ]  # fmt: skip
    until = database_later(is_postgres)
    reason = bindparam("cooling_reason", type_=Text)
    values = select(
        bindparam("bucket_key", type_=Text),
        bindparam("bucket_per_second", type_=Text),
        bindparam("bucket_burst", type_=Integer),
        literal_column("1000"),
        until,
        until,
        reason,
    ).where(true())  # SQLite needs a WHERE before ON CONFLICT in an INSERT ... SELECT
    insert = dialect_insert(is_postgres, rate_buckets).from_select(columns, values)
    later = buckets.refilled_at < insert.excluded.refilled_at
    return insert.on_conflict_do_update(
        index_elements=[buckets.limit_key],
        set_={
            "milli_tokens": case((later, 1000), else_=buckets.milli_tokens),
            "refilled_at": case((later, insert.excluded.refilled_at), else_=buckets.refilled_at),
            "cooling_until": case(
                (later, insert.excluded.cooling_until), else_=buckets.cooling_until
            ),
            "cooling_reason": case(
                (later, insert.excluded.cooling_reason), else_=buckets.cooling_reason
            ),
        },
    )


def _slots_counting(key: Any) -> Any:
    """How many slots of concurrency key ``key`` count at ``now_at``."""
    held = concurrency_slots.alias("held")
    runs = job_runs.alias("holder")
    return (
        select(func.count())
        .select_from(held.join(runs, runs.c.id == held.c.run_id))
        .where(
            held.c.limit_key == key, slot_counts(bindparam("now_at", type_=Text), held.c, runs.c)
        )
        .scalar_subquery()
    )


def acquire_slot_statement(is_postgres: bool) -> Any:
    """Insert slot ``slot_*`` while fewer than ``slot_most`` slots of ``slot_key`` count
    at ``now_at``; returns a row when it did. On Postgres it runs after the key's
    advisory lock (``limit_locks``) in the same transaction, so concurrent takers
    count one after the other; SQLite runs one writer at a time."""
    slots = concurrency_slots.c
    names = ["limit_key", "lease_token", "step", "run_id", "acquired_at"]
    key = bindparam("slot_key", type_=Text)
    values = select(
        key,
        bindparam("slot_token", type_=Text),
        bindparam("slot_step", type_=Text),
        bindparam("slot_run_id", type_=Text),
        bindparam("now_at", type_=Text),
    ).where(_slots_counting(key) < bindparam("slot_most", type_=Integer))
    insert = dialect_insert(is_postgres, concurrency_slots).from_select(names, values)
    # The same holder's row again (a release that failed): taken again, not an error.
    return insert.on_conflict_do_update(
        index_elements=[slots.limit_key, slots.lease_token, slots.step],
        set_={"acquired_at": insert.excluded.acquired_at},
    ).returning(slots.limit_key)


def release_slot_statement() -> Any:
    """Delete slot ``slot_*``, and every slot of ``slot_key`` that no longer counts at
    ``now_at`` (stale rows are cleaned here, lazily, and nowhere else)."""
    slots = concurrency_slots.c
    runs = job_runs.alias("holder")
    still_counts = exists(
        select(literal(1))
        .select_from(runs)
        .where(
            runs.c.id == slots.run_id, slot_counts(bindparam("now_at", type_=Text), slots, runs.c)
        )
    )
    mine = and_(slots.lease_token == bindparam("slot_token"), slots.step == bindparam("slot_step"))
    return delete(concurrency_slots).where(
        slots.limit_key == bindparam("slot_key"), or_(mine, not_(still_counts))
    )


def buckets_statement(is_postgres: bool) -> Any:
    """Every bucket, the milliseconds since its refill on the database's clock
    (negative while it cools down), and its cooling down (until, reason), if any."""
    buckets = rate_buckets.c
    now = database_now(is_postgres)
    since = ms_between(is_postgres, buckets.refilled_at, now)
    cooling = case((buckets.cooling_until > now, buckets.cooling_until), else_=None)
    return select(
        buckets.limit_key,
        buckets.per_second,
        buckets.burst,
        buckets.milli_tokens,
        since,
        cooling,
        buckets.cooling_reason,
    ).order_by(buckets.limit_key)


def slots_held_statement() -> Any:
    """Per concurrency key, the slots that count at ``now_at`` (keys with none left out)."""
    slots = concurrency_slots
    runs = job_runs.alias("holder")
    return (
        select(slots.c.limit_key, func.count())
        .select_from(slots.join(runs, runs.c.id == slots.c.run_id))
        .where(slot_counts(bindparam("now_at", type_=Text), slots.c, runs.c))
        .group_by(slots.c.limit_key)
        .order_by(slots.c.limit_key)
    )
