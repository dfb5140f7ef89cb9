"""The browse facet's statements: the operator's listing and the console's reads.

``JobRunStore.list`` (the listing of ``jobrun.job_runs``) and the reads of
``jobrun._core.operator.browse.BrowsableStore``: a page of runs, a capped count, each
job's load and the activity chart. :func:`run_matches` is the SQL twin of
``jobrun._core.operator.browse.run_matches``. (Which presences Postgres holds, also shown
by the console, is read by :func:`jobrun.sql.postgres.presence.live_presences_statement`,
with the presence's other SQL.)
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    String,
    Text,
    and_,
    bindparam,
    func,
    literal,
    literal_column,
    not_,
    select,
    text,
    union_all,
)

from jobrun._core import JobRunStatus
from jobrun.sql.schema import job_runs
from jobrun.sql.statements.rules import (
    FAILED,
    RUNNING,
    has_ended_since,
    is_cancelled,
    is_due,
    is_failed_since,
    is_leased,
    is_live,
    is_paused,
    is_stranded,
    waiting_since,
)

LIST_FILTERS = ("module_id", "job", "instance", "status")


def list_statement(
    filters: tuple[str, ...], cancelled: bool | None = None, paused: bool | None = None
) -> Any:
    """The operator listing for the named equality filters (``filter_<name>``) and
    ``limit``; ``cancelled`` (``paused``) True or False keeps only the runs that are
    (are not) cancelled (paused)."""
    conditions = [job_runs.c[name] == bindparam(f"filter_{name}") for name in filters]
    if cancelled is not None:
        conditions.append(is_cancelled() if cancelled else not_(is_cancelled()))
    if paused is not None:
        conditions.append(is_paused() if paused else not_(is_paused()))
    return (
        select(job_runs)
        .where(and_(True, *conditions))
        .order_by(job_runs.c.id.desc())
        .limit(bindparam("limit", type_=job_runs.c.attempts.type))
    )


def collation_statement() -> Any:
    """Postgres: the database's collation (its text columns' default)."""
    return text("SELECT datcollate FROM pg_database WHERE datname = current_database()")


def is_bytewise_collation(name: str) -> bool:
    """Whether a Postgres collation orders text by code point (so a range holds every
    string with a prefix): C, POSIX and C.UTF-8 do; linguistic ones (en_US…) need not."""
    return name in ("C", "POSIX", "ucs_basic") or name.upper().replace("-", "") in ("C.UTF8",)


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
    if "query_paused" in names:
        conditions.append(is_paused())
    if "query_not_paused" in names:
        conditions.append(not_(is_paused()))
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
