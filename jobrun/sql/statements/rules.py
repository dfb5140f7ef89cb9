"""The rules in SQL: twins of :mod:`jobrun._core.model.predicates`, of the same names.

Each takes the runs' columns (``job_runs.c`` or an alias's) and returns a condition
(or, for ``live_run_of`` and ``refill_on_resume``, the statement the rule is);
every facet's statements build on them, and none spells a rule itself.
tests/contract/test_rule_parity.py checks each twin against its Python home on
every backend, and tests/unit/test_one_home.py that neither is spelled anywhere else.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    Integer,
    Text,
    and_,
    bindparam,
    case,
    func,
    literal_column,
    not_,
    or_,
    select,
    update,
)

from jobrun._core import PARKED_AT, JobRunStatus
from jobrun.sql.schema import due_at_of, job_runs, job_steps

RUNNING = JobRunStatus.RUNNING.value
FAILED = JobRunStatus.FAILED.value
_RUNS = job_runs.c


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
    """Twin of :func:`jobrun._core.model.predicates.is_due` (the claim-order index's
    range; a paused run is filtered on its row, and most wait out of that range)."""
    return and_(is_live(runs), now_at >= due_at(runs), runs.paused_at.is_(None))


def is_paused(runs: Any = _RUNS) -> Any:
    """Twin of :func:`jobrun._core.model.predicates.is_paused`."""
    return and_(is_live(runs), runs.paused_at.is_not(None))


def parked(status: Any, paused_at: Any, lease_owner: Any, next_attempt_at: Any) -> Any:
    """Twin of :func:`jobrun._core.model.predicates.parked`: the ``next_attempt_at`` a
    write leaves, given the status, pause and lease the row has after it (each a
    column, or the value the write sets) and the due instant it would write otherwise."""
    waits = and_(
        # Live after the write (the status the write leaves, so not is_live's column).
        status == literal_column(f"'{RUNNING}'", Text),
        paused_at.is_not(None),
        lease_owner.is_(None),
    )
    return case((waits, literal_column(f"'{PARKED_AT}'", Text)), else_=next_attempt_at)


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


def boot_held(runs: Any = _RUNS) -> Any:
    """Twin of :func:`jobrun._core.model.predicates.boot_held`, for the claimer's boot
    clock ``boot_id`` at ``boot_ms``. Never NULL: each column is tested first (no
    lease: the id ends in ``@``, and no stored one does)."""
    owner = func.coalesce(runs.lease_owner, literal_column("''", Text))
    boot_id = bindparam("boot_id", type_=Text) + literal_column("'@'", Text) + owner
    return and_(
        runs.lease_boot_id.is_not(None),
        runs.lease_boot_expires_ms.is_not(None),
        runs.lease_boot_id == boot_id,
        runs.lease_boot_expires_ms > bindparam("boot_ms", type_=Integer),
    )


def slot_counts(now_at: Any, slots: Any, runs: Any = _RUNS, booted: bool = False) -> Any:
    """Twin of :func:`jobrun._core.model.predicates.slot_counts`, for the slot row ``slots``
    and its run ``runs``; ``booted``: with the claimer's boot clock (``boot_id``,
    ``boot_ms``), else none."""
    held = is_leased(now_at, runs)
    if booted:
        held = or_(held, and_(is_live(runs), boot_held(runs)))
    return and_(held, runs.lease_owner == slots.lease_token)


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
