"""The rules that say which runs are which, each written once.

Every store, the test kit, the claim and the console ask these; the SQL store
sends their twins, of the same names, from :mod:`jobrun.sql.statements` (a
parity test runs both over the same rows on every backend, and a guard test
fails when a rule is spelled anywhere else). The words mean one thing each
(see ``docs/design.md``, "Words"):

* **due**: running, and its due instant (:func:`due_at`) has passed. A run with
  no lease is due once its backoff ends; a leased run is due once its lease
  expires (the claim takes it over). What a claim may take now.
* **leased**: running, held by a lease, and the lease has not expired (a pass in
  flight, as far as anyone can tell). A running run is exactly one of due,
  leased, or backing off (no lease, next attempt still ahead).
* **stranded**: due, yet still carrying a lease: its holder stopped renewing
  and nobody has taken it over yet.
* **orphaned** (not a row rule: it needs proof, see :mod:`jobrun._core.leases.proof_of_death`):
  leased, but its holder is provably dead; the claim takes it first.
* **paused**: running, and an operator paused it (revision 0009). Never due, so
  never claimed; a pass in flight stops at its next step boundary. One that no
  lease holds waits at :data:`PARKED_AT` (:func:`parked`).
* **boot-held** (revision 0010, SQLite and memory): leased on this boot's clock,
  by the lease's present token, and that expiry is still ahead there, whatever
  the wall clock says (:func:`boot_held`). Never claimed as due.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace
from datetime import datetime

from jobrun._core.model.records import BootInstant, JobRun, JobRunStatus, RunRow, StepRow

RUNNING = JobRunStatus.RUNNING.value
FAILED = JobRunStatus.FAILED.value

Jobs = frozenset[tuple[str, str]]


def due_at(row: RunRow) -> str:
    """When a running run is due: its next attempt (a lease's expiry while leased),
    else its start."""
    return row.next_attempt_at or row.started_at


def waiting_since(row: RunRow) -> str:
    """Since when a due run has waited for a driver: its due instant when one is
    written (a backoff's end, a lease's expiry), else its last write (its start, or
    the pass commit or release that left it without a lease). Health measures waits
    from here; the claim keeps ordering by :func:`due_at`, so fair aging still
    counts from the start."""
    return row.next_attempt_at or row.updated_at


def stored_version(row: RunRow) -> int:
    """The version of the job's code that last committed the run; NULL (a run from
    before revision 0006, or not committed yet) is version 1."""
    return 1 if row.job_version is None else row.job_version


def runnable_by(row: RunRow, versions: Mapping[tuple[str, str], int]) -> bool:
    """Code of ``versions`` (per ``(module_id, job)``; a job not in it: version 1) may
    run the run: its stored version is not newer than the code's."""
    return stored_version(row) <= versions.get((row.module_id, row.job), 1)


def is_live(row: RunRow) -> bool:
    """Running: the one run its key may have at a time."""
    return row.status == RUNNING


PARKED_AT = "9999-12-31T23:59:59.999Z"
"""The due instant of a run that waits for an unpause (its own, or a limit's): later
than every instant a clock writes, so each read of due runs passes over it by its
index range, as it passes over a run backing off. Shown as no due instant."""


def is_paused(row: RunRow) -> bool:
    """Running, and paused by an operator (until unpaused): never claimed."""
    return is_live(row) and row.paused_at is not None


def is_due(row: RunRow, now_at: str) -> bool:
    """Running, not paused, and its due instant has passed by ``now_at`` (leased or not)."""
    return is_live(row) and due_at(row) <= now_at and row.paused_at is None


def parked(row: RunRow) -> RunRow:
    """``row`` as every write leaves it: a paused run that no lease holds waits at
    :data:`PARKED_AT` (a paused run's holder writes its own due instant at the
    pass's end, as ever; this puts the run out of every clock's reach instead)."""
    if is_paused(row) and row.lease_owner is None and row.next_attempt_at != PARKED_AT:
        return replace(row, next_attempt_at=PARKED_AT)
    return row


def is_leased(row: RunRow, now_at: str) -> bool:
    """Running and held by a lease that has not expired by ``now_at``."""
    return is_live(row) and row.lease_owner is not None and due_at(row) > now_at


def boot_held(row: RunRow, boot: BootInstant | None) -> bool:
    """Held on ``boot``'s clock: leased, its boot expiry counted on that clock under
    the lease's present token, and not reached by ``boot``. A wall-clock step moves
    no such lease's expiry; ``None`` (no boot clock): nothing is."""
    return (
        boot is not None
        and row.lease_owner is not None
        and row.lease_boot_expires_ms is not None
        and row.lease_boot_id == boot.lease_id(row.lease_owner)
        and row.lease_boot_expires_ms > boot.ms
    )


def slot_counts(
    row: RunRow | None, token: str, now_at: str, boot: BootInstant | None = None
) -> bool:
    """A concurrency slot taken under lease ``token`` of run ``row`` counts: the token
    is still the run's lease and that lease has not expired by ``now_at``, or is
    still held on ``boot``'s clock (:func:`boot_held`: a forward wall-clock step
    frees no slot of a pass still running)."""
    if row is None or row.lease_owner != token:
        return False
    return is_leased(row, now_at) or (is_live(row) and boot_held(row, boot))


def is_stranded(row: RunRow, now_at: str) -> bool:
    """Due, yet still carrying the lease that expired (its holder stopped renewing)."""
    return is_due(row, now_at) and row.lease_owner is not None


def has_ended_since(row: RunRow, since_at: str) -> bool:
    """Ended (done or failed) at or after ``since_at``."""
    return row.ended_at is not None and row.ended_at >= since_at


def is_failed_since(row: RunRow, since_at: str) -> bool:
    """Ended ``failed`` at or after ``since_at``."""
    return row.status == FAILED and has_ended_since(row, since_at)


CANCELLED = "cancelled"
"""How a run ended by an operator's cancel is shown and filtered: its status stays
``failed`` (a cancelled run resumes like any failed one); the stored marker
(``cancelled``, revision 0006) tells the two apart."""

STRANDED = "stranded"
"""The filter word (CLI and console) for running runs whose lease expired untaken
(:func:`is_stranded`); not a stored status."""


def is_cancelled(row: RunRow) -> bool:
    """Ended ``failed`` because an operator cancelled it."""
    return row.status == FAILED and row.cancelled == 1


PAUSED = "paused"
"""How a paused run is shown and filtered: its status stays ``running`` (a paused run
is live, and a start of its key joins it); :func:`is_paused` tells it apart."""


def outcome_of(row: RunRow) -> str:
    """How a run stands, for people: ``running``, ``paused``, ``done``, ``failed`` or
    ``cancelled``."""
    if is_cancelled(row):
        return CANCELLED
    return PAUSED if is_paused(row) else row.status


def live_run_of(rows: Iterable[RunRow], row: RunRow) -> RunRow | None:
    """The live run among ``rows`` with ``row``'s key (module id, job, instance), if any:
    a key has one live run at most."""
    key = (row.module_id, row.job, row.instance)
    return next(
        (
            other
            for other in rows
            if is_live(other) and (other.module_id, other.job, other.instance) == key
        ),
        None,
    )


def is_prunable(
    row: RunRow,
    ended_before: str,
    statuses: tuple[str, ...],
    only_jobs: Jobs | None = None,
    except_jobs: Jobs = frozenset(),
) -> bool:
    """Whether a prune deletes ``row``: finished with one of ``statuses`` (never a
    live run) before ``ended_before``, of ``only_jobs`` (``None``: any job) and
    none of ``except_jobs``."""
    job = (row.module_id, row.job)
    return (
        row.status in statuses
        and not is_live(row)
        and row.ended_at is not None
        and row.ended_at < ended_before
        and (only_jobs is None or job in only_jobs)
        and job not in except_jobs
    )


def refill_on_resume(step: StepRow) -> StepRow:
    """A ledger row as a resume leaves it: a step that never completed gets its
    attempts back; a completed one keeps its memo as it is."""
    return replace(step, attempts=0) if step.result is None else step


def starts_later_at(run: JobRun) -> datetime | None:
    """When a run started later (``start_at``, ``delay_s``) is due: a running run no
    pass has touched (no lease, attempt, deferral or commit) with a due instant;
    ``None`` for any other run. What "starts at ..." in the CLI and console shows."""
    untouched = not (run.attempts or run.deferrals or run.passes_committed or run.lease_epoch)
    if run.status != "running" or run.lease_driver is not None or not untouched:
        return None
    return run.next_attempt_at
