"""The limits facet's statements: rate-limit buckets and concurrency slots.

The SQL of :mod:`jobrun._core.limits.buckets`: a token is taken in one upsert that
refills the bucket on the database's clock; a slot is inserted only while fewer
than the limit count, in one statement. Only the clock's spelling differs
between the engines (:mod:`jobrun.sql.statements.clock`); everything else is the
same SQL on both. Also here: the advisory locks that order the takers of a limit
on Postgres, a job's limited claims and a concurrency key's slots alike.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    Integer,
    Text,
    and_,
    bindparam,
    case,
    cast,
    delete,
    exists,
    func,
    literal,
    literal_column,
    not_,
    or_,
    select,
    true,
    update,
)

from jobrun.sql.schema import concurrency_slots, job_runs, rate_buckets
from jobrun.sql.statements.clock import (
    database_later,
    database_now,
    ms_between,
    on_database_clock,
)
from jobrun.sql.statements.compiled import dialect_insert
from jobrun.sql.statements.rules import slot_counts


def limit_locks(count: int) -> Any:
    """Postgres: the advisory locks ``lock_{i}`` that order limited claims."""
    return select(*(func.pg_advisory_xact_lock(bindparam(f"lock_{i}")) for i in range(count)))


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
    milli-tokens left. The arithmetic is :func:`jobrun._core.limits.buckets.take`'s:
    whole milli-tokens gained (``bucket_rate`` per ms), capped at
    ``bucket_burst_milli``, minus 1000. On Postgres the row lock orders concurrent
    takers; SQLite runs one writer at a time. Also returns the milliseconds until
    the bucket's refill instant, when a cooling down put it in the future, and
    whether the key is paused."""
    from jobrun.sql.statements.pauses import limit_is_paused

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
        # Revision 0009: a paused key's token never comes (the taker gives it back).
        limit_is_paused(bindparam("bucket_key", type_=Text)),
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


def _slots_counting(key: Any, booted: bool) -> Any:
    """How many slots of concurrency key ``key`` count at ``now_at``."""
    held = concurrency_slots.alias("held")
    runs = job_runs.alias("holder")
    counts = slot_counts(bindparam("now_at", type_=Text), held.c, runs.c, booted)
    return (
        select(func.count())
        .select_from(held.join(runs, runs.c.id == held.c.run_id))
        .where(held.c.limit_key == key, counts)
        .scalar_subquery()
    )


def acquire_slot_statement(
    is_postgres: bool, booted: bool = False, database_clock: bool = False
) -> Any:
    """Insert slot ``slot_*`` while fewer than ``slot_most`` slots of ``slot_key`` count
    at ``now_at``; returns a row when it did. On Postgres it runs after the key's
    advisory lock (``limit_locks``) in the same transaction, so concurrent takers
    count one after the other; SQLite runs one writer at a time. ``booted``: slots
    whose lease is held on the taker's boot clock (``boot_id``, ``boot_ms``) count
    too; ``database_clock`` (Postgres): ``now_at`` is the database's clock."""
    statement = _acquire_slot(is_postgres, booted)
    return on_database_clock(statement) if database_clock else statement


def _acquire_slot(is_postgres: bool, booted: bool) -> Any:
    from jobrun.sql.statements.pauses import limit_is_paused

    slots = concurrency_slots.c
    names = ["limit_key", "lease_token", "step", "run_id", "acquired_at"]
    key = bindparam("slot_key", type_=Text)
    values = select(
        key,
        bindparam("slot_token", type_=Text),
        bindparam("slot_step", type_=Text),
        bindparam("slot_run_id", type_=Text),
        bindparam("now_at", type_=Text),
    ).where(
        _slots_counting(key, booted) < bindparam("slot_most", type_=Integer),
        # Revision 0009: none while the key is paused (limit_paused tells why).
        not_(limit_is_paused(key)),
    )
    insert = dialect_insert(is_postgres, concurrency_slots).from_select(names, values)
    # The same holder's row again (a release that failed): taken again, not an error.
    return insert.on_conflict_do_update(
        index_elements=[slots.limit_key, slots.lease_token, slots.step],
        set_={"acquired_at": insert.excluded.acquired_at},
    ).returning(slots.limit_key)


def release_slot_statement(booted: bool = False, database_clock: bool = False) -> Any:
    """Delete slot ``slot_*``, and every slot of ``slot_key`` that no longer counts at
    ``now_at`` (stale rows are cleaned here, lazily, and nowhere else); ``booted`` and
    ``database_clock`` as for :func:`acquire_slot_statement`."""
    slots = concurrency_slots.c
    runs = job_runs.alias("holder")
    counts = slot_counts(bindparam("now_at", type_=Text), slots, runs.c, booted)
    still_counts = exists(
        select(literal(1)).select_from(runs).where(runs.c.id == slots.run_id, counts)
    )
    mine = and_(slots.lease_token == bindparam("slot_token"), slots.step == bindparam("slot_step"))
    statement = delete(concurrency_slots).where(
        slots.limit_key == bindparam("slot_key"), or_(mine, not_(still_counts))
    )
    return on_database_clock(statement) if database_clock else statement


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
