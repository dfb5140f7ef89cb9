"""``MemoryJobRunStore``, public as ``jobrun.testing.MemoryJobRunStore`` (whose module
says what it promises). Methods are grouped as the port's protocols are
(:mod:`jobrun._core.port`).
"""

from __future__ import annotations

import builtins
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any, cast

from jobrun._core import (
    MILLI,
    ActivityQuery,
    Claimed,
    ClaimRequest,
    ClaimTurns,
    Clock,
    Counts,
    HealthCounts,
    HeldLease,
    JobLoad,
    JobRunStatus,
    LimitUsage,
    OrphanScans,
    OwedReleases,
    PresenceSeen,
    RunChange,
    RunFilter,
    RunPatch,
    RunQuery,
    RunRow,
    ScheduleRow,
    StepRow,
    StoreLimits,
    WorkerRow,
    bucket_cap_milli,
    bucket_state,
    claim_candidate,
    claim_transition,
    count_activity,
    deprecated_scans,
    format_instant,
    is_cancelled,
    is_due,
    is_failed_since,
    is_leased,
    is_live,
    is_prunable,
    is_stranded,
    live_run_of,
    not_watching,
    refill_on_resume,
    refuse,
    run_matches,
    slot_counts,
    stored_version,
    take,
    waiting_since,
    worker_is_live,
)
from jobrun._system import SYSTEM_CLOCK
from jobrun.errors import JobConflictError

__all__ = ["MemoryJobRunStore"]


class MemoryJobRunStore:
    """The store port in a dict, for tests: pass it wherever a store is asked for.

    It keeps the same contract as ``SqlJobRunStore`` (one live run per key,
    fenced writes, the ledger dropped with the pass commit). Every operation
    completes without yielding, so each is atomic with respect to other tasks on
    the loop. ``default_scope`` is what ``await p.scope()`` returns in passes
    driven without an ``open_scope``. ``clock`` is what this "database" refills
    rate-limit buckets by (default: the system clock; a ``FakeClock`` in tests).
    """

    def __init__(
        self,
        limits: StoreLimits | None = None,
        default_scope: object = None,
        *,
        clock: Clock | None = None,
    ) -> None:
        self._limits = limits or StoreLimits()
        self._default_scope = default_scope
        self._clock = SYSTEM_CLOCK if clock is None else clock
        # key: [milli-tokens, refilled at, per_second, burst]
        self.buckets: dict[str, builtins.list[Any]] = {}
        # key: (cooling down until, why), from RetryAfter(rate_limit=key)
        self.cooling: dict[str, tuple[datetime, str]] = {}
        # (key, run id, step, lease token)
        self.slots: set[tuple[str, str, str, str]] = set()
        self.runs: dict[str, RunRow] = {}
        self.ledgers: dict[str, dict[str, tuple[StepRow, str]]] = {}
        self.schedules: dict[tuple[str, str, str], ScheduleRow] = {}
        self.retention: dict[tuple[str, str], int] = {}
        self.workers: dict[str, WorkerRow] = {}
        self._owed_releases = OwedReleases()
        self._claim_turns = ClaimTurns()
        self._orphan_scans = OrphanScans()

    # -- JobRunStore: runs, the claim, leases, the pass's writes ------------------------------

    @property
    def limits(self) -> StoreLimits:
        return self._limits

    @property
    def default_scope(self) -> object:
        return self._default_scope

    @property
    def owed_releases(self) -> OwedReleases:
        return self._owed_releases

    @property
    def claim_turns(self) -> ClaimTurns:
        return self._claim_turns

    @property
    def orphan_scans(self) -> OrphanScans:
        return self._orphan_scans

    @property
    def stranded_scans(self) -> OrphanScans:
        """Deprecated alias of :attr:`orphan_scans` (removed in the next release)."""
        return deprecated_scans(self)

    async def start_or_join(self, row: RunRow) -> tuple[RunRow, bool]:
        existing = live_run_of(self.runs.values(), row)
        if existing is not None:
            return existing, False
        self.runs[row.id] = row
        return row, True

    async def start_many(
        self, rows: Sequence[RunRow], *, connection: object | None = None
    ) -> builtins.list[tuple[RunRow, bool]]:
        if connection is not None:
            raise refuse(
                "connection",
                "is for a SQL store's database transaction",
                message="connection= is for a SqlJobRunStore: a MemoryJobRunStore has no "
                "transaction to start a run in",
            )
        return [await self.start_or_join(row) for row in rows]

    async def get(self, run_id: str) -> RunRow | None:
        return self.runs.get(run_id)

    async def claim(self, request: ClaimRequest) -> Claimed | None:
        row = claim_candidate(builtins.list(self.runs.values()), request)
        if row is None:
            return None
        claimed = claim_transition(row, request)
        self.runs[row.id] = claimed.row
        return claimed

    async def claim_batch(self, request: ClaimRequest, tokens: Sequence[str]) -> list[Claimed]:
        claimed: list[Claimed] = []
        for token in tokens:
            one = await self.claim(replace(request, token=token))
            if one is None:
                break
            claimed.append(one)
        return claimed

    async def held_leases(
        self, now_at: str, jobs: frozenset[tuple[str, str]] | None
    ) -> list[HeldLease]:
        return [
            HeldLease(
                row.id,
                row.module_id,
                row.job,
                cast(str, row.lease_owner),  # leased: never None
                row.lease_driver,
                row.lease_began_at,
            )
            for row in self.runs.values()
            if is_leased(row, now_at) and (jobs is None or (row.module_id, row.job) in jobs)
        ]

    async def presence(self) -> int | None:
        return None

    def watch_presence(self, key: int | None, lost: Callable[[], None]) -> Callable[[], None]:
        return not_watching

    def presence_fd(self, key: int | None) -> int | None:
        return None

    async def clock_offset_s(self) -> float:
        return 0.0

    async def list(self, run_filter: RunFilter) -> list[RunRow]:
        wanted = {
            name: value
            for name in ("module_id", "job", "instance", "status")
            if (value := getattr(run_filter, name)) is not None
        }
        cancelled = run_filter.cancelled
        rows = [
            row
            for row in self.runs.values()
            if all(getattr(row, name) == value for name, value in wanted.items())
            and (cancelled is None or is_cancelled(row) == cancelled)
        ]
        rows.sort(key=lambda row: row.id, reverse=True)
        return rows[: run_filter.limit]

    def _held(self, run_id: str, token: str) -> bool:
        row = self.runs.get(run_id)
        return row is not None and is_live(row) and row.lease_owner == token

    async def patch(self, run_id: str, patch: RunPatch, token: str) -> bool:
        if not self._held(run_id, token):
            return False
        self.runs[run_id] = replace(
            self.runs[run_id],
            **{name: getattr(patch, name) for name in RunPatch.__dataclass_fields__},
        )
        return True

    async def commit_pass(self, run_id: str, patch: RunPatch, token: str) -> bool:
        if not await self.patch(run_id, patch, token):
            return False
        self.ledgers.pop(run_id, None)
        return True

    async def steps(self, run_id: str) -> dict[str, StepRow]:
        return {name: row for name, (row, _at) in self.ledgers.get(run_id, {}).items()}

    async def record_step(self, run_id: str, row: StepRow, recorded_at: str, token: str) -> bool:
        if not self._held(run_id, token):
            return False
        self.ledgers.setdefault(run_id, {})[row.step] = (row, recorded_at)
        return True

    async def extend_lease(self, run_id: str, token: str, expires_at: str, now_at: str) -> bool:
        if not self._held(run_id, token) or not is_leased(self.runs[run_id], now_at):
            return False
        if expires_at <= now_at:
            # A renewal to an expiry already past would hand the run to the next claimer.
            return False
        self.runs[run_id] = replace(self.runs[run_id], next_attempt_at=expires_at)
        return True

    # -- limits: rate-limit buckets and concurrency slots ----------------------------------

    def _refill(self, key: str, per_second: float, burst: int) -> builtins.list[Any]:
        now = self._clock.now()
        bucket = self.buckets.setdefault(key, [bucket_cap_milli(burst), now, per_second, burst])
        bucket[2:] = [per_second, burst]
        return bucket

    async def take_token(self, key: str, per_second: float, burst: int) -> float:
        bucket = self._refill(key, per_second, burst)
        now = self._clock.now()
        elapsed_ms = (now - bucket[1]).total_seconds() * 1000
        bucket[0], wait_s = take(bucket[0], elapsed_ms, per_second, burst)
        bucket[1] = max(bucket[1], now)
        # A bucket cooling down refills from a later instant.
        return float(wait_s + max(0.0, (bucket[1] - now).total_seconds()))

    async def cool_limit(
        self, key: str, per_second: float, burst: int, seconds: float, reason: str
    ) -> None:
        bucket = self._refill(key, per_second, burst)
        until = self._clock.now() + timedelta(seconds=seconds)
        if bucket[1] < until:
            bucket[0], bucket[1] = MILLI, until
            self.cooling[key] = (until, reason)

    async def give_back_token(self, key: str, burst: int) -> None:
        bucket = self.buckets.get(key)
        if bucket is not None:
            bucket[0] = min(bucket_cap_milli(burst), bucket[0] + MILLI)

    def _cooling_of(self, key: str, now: datetime) -> tuple[str | None, str | None]:
        found = self.cooling.get(key)
        if found is None or found[0] <= now:
            return None, None
        return format_instant(found[0]), found[1]

    def _counting(self, key: str, now_at: str) -> builtins.list[tuple[str, str, str, str]]:
        return [
            slot
            for slot in self.slots
            if slot[0] == key and slot_counts(self.runs.get(slot[1]), slot[3], now_at)
        ]

    async def acquire_slot(
        self, key: str, most: int, run_id: str, step: str, token: str, now_at: str
    ) -> bool:
        if len(self._counting(key, now_at)) >= most:
            return False
        self.slots.add((key, run_id, step, token))
        return True

    async def release_slot(self, key: str, run_id: str, step: str, token: str, now_at: str) -> None:
        counting = set(self._counting(key, now_at))
        self.slots = {
            slot
            for slot in self.slots
            if slot[0] != key or (slot in counting and slot != (key, run_id, step, token))
        }

    async def limit_usage(self, now_at: str) -> LimitUsage:
        now = self._clock.now()
        buckets = tuple(
            bucket_state(
                key,
                rate,
                burst,
                tokens,
                (now - refilled_at).total_seconds() * 1000,
                *self._cooling_of(key, now),
            )
            for key, (tokens, refilled_at, rate, burst) in sorted(self.buckets.items())
        )
        held: dict[str, int] = {}
        for key in sorted({slot[0] for slot in self.slots}):
            if counted := len(self._counting(key, now_at)):
                held[key] = counted
        return LimitUsage(buckets, held)

    # -- OperatorStore: what operators do by hand ---------------------------------------------

    async def health(self, now_at: str) -> HealthCounts:
        rows = self.runs.values()
        waiting = [waiting_since(row) for row in rows if is_due(row, now_at)]
        return HealthCounts(
            running=sum(1 for row in rows if is_live(row)),
            due=len(waiting),
            leased=sum(1 for row in rows if is_leased(row, now_at)),
            failed=sum(1 for row in self.runs.values() if row.status == JobRunStatus.FAILED),
            oldest_due_at=min(waiting, default=None),
            cancelled=sum(1 for row in self.runs.values() if is_cancelled(row)),
        )

    async def due_by_job(self, now_at: str) -> dict[tuple[str, str], int]:
        counts: dict[tuple[str, str], int] = {}
        for row in self.runs.values():
            if is_due(row, now_at):
                key = (row.module_id, row.job)
                counts[key] = counts.get(key, 0) + 1
        return counts

    async def versions_by_job(self) -> dict[tuple[str, str], dict[int, int]]:
        counts: dict[tuple[str, str], dict[int, int]] = {}
        for row in self.runs.values():
            if is_live(row):
                versions = counts.setdefault((row.module_id, row.job), {})
                version = stored_version(row)
                versions[version] = versions.get(version, 0) + 1
        return counts

    def _change(self, run_id: str, change: RunChange) -> bool:
        row = self.runs.get(run_id)
        if row is None or not change.applies_to(row):
            return False
        self.runs[run_id] = change.applied(row)
        return True

    async def cancel(self, run_id: str, change: RunChange) -> bool:
        return self._change(run_id, change)

    async def resume(self, run_id: str, change: RunChange) -> bool:
        row = self.runs.get(run_id)
        if row is None or not change.applies_to(row):
            return False
        if live_run_of(self.runs.values(), row) is not None:
            raise JobConflictError(
                f"run {run_id} cannot resume: another run of its key is live", "job_run_key_live"
            )
        self._change(run_id, change)
        ledger = self.ledgers.get(run_id, {})
        for name, (step, recorded_at) in builtins.list(ledger.items()):
            ledger[name] = (refill_on_resume(step), recorded_at)
        return True

    async def release(self, run_id: str, change: RunChange) -> bool:
        return self._change(run_id, change)

    async def prune(
        self,
        ended_before: str,
        statuses: tuple[str, ...],
        batch_size: int,
        *,
        only_jobs: frozenset[tuple[str, str]] | None = None,
        except_jobs: frozenset[tuple[str, str]] = frozenset(),
    ) -> int:
        doomed = [
            run_id
            for run_id, row in self.runs.items()
            if is_prunable(row, ended_before, statuses, only_jobs, except_jobs)
        ]
        for run_id in doomed:
            del self.runs[run_id]
            self.ledgers.pop(run_id, None)
        return len(doomed)

    # -- OperatorStore: each job's own keep_for -------------------------------------------

    async def record_retention(
        self, keep_for_s: Mapping[tuple[str, str], int | None], at: str
    ) -> None:
        for key, seconds in keep_for_s.items():
            if seconds is None:
                self.retention.pop(key, None)
            else:
                self.retention[key] = seconds

    async def recorded_retention(self) -> dict[tuple[str, str], int]:
        return dict(sorted(self.retention.items()))

    # -- ScheduleStore: each schedule's progress --------------------------------------------

    async def schedule_rows(self) -> builtins.list[ScheduleRow]:
        return [self.schedules[key] for key in sorted(self.schedules)]

    async def add_schedules(self, rows: Sequence[ScheduleRow]) -> None:
        for row in rows:
            self.schedules.setdefault((row.module_id, row.job, row.schedule), row)

    async def reset_schedule(self, schedule: ScheduleRow, stored_cron: str | None) -> bool:
        key = (schedule.module_id, schedule.job, schedule.schedule)
        stored = self.schedules.get(key)
        if stored is None or stored.cron != stored_cron:
            return False
        self.schedules[key] = schedule
        return True

    async def remove_schedules(self, keys: Sequence[tuple[str, str, str]]) -> None:
        for key in keys:
            self.schedules.pop(key, None)

    async def start_slot(self, schedule: ScheduleRow, row: RunRow) -> tuple[RunRow, bool] | None:
        key = (schedule.module_id, schedule.job, schedule.schedule)
        stored = self.schedules.get(key)
        if (
            stored is None
            or stored.cron != schedule.cron
            or not stored.last_slot_at < schedule.last_slot_at
        ):
            return None
        run, inserted = await self.start_or_join(row)
        self.schedules[key] = replace(schedule, last_run_id=run.id)
        return run, inserted

    # -- the console's reads (jobrun._core.operator.browse.BrowsableStore) -------------------------

    async def find(self, query: RunQuery) -> builtins.list[RunRow]:
        rows = sorted(
            (row for row in self.runs.values() if run_matches(row, query)),
            key=lambda row: row.id,
            reverse=True,
        )
        return rows[: query.limit]

    async def count(self, query: RunQuery, cap: int) -> int:
        return min(cap, sum(1 for row in self.runs.values() if run_matches(row, query)))

    async def job_loads(self, now_at: str, failed_since_at: str) -> builtins.list[JobLoad]:
        loads: dict[tuple[str, str], JobLoad] = {}
        for row in self.runs.values():
            running = is_live(row)
            failed = is_failed_since(row, failed_since_at)
            if not (running or failed):
                continue
            due = is_due(row, now_at)
            key = (row.module_id, row.job)
            load = loads.get(key) or JobLoad(row.module_id, row.job, 0, 0, None, 0, 0)
            oldest = load.oldest_due_at
            if due:
                oldest = min(oldest or waiting_since(row), waiting_since(row))
            loads[key] = replace(
                load,
                running=load.running + running,
                due=load.due + due,
                oldest_due_at=oldest,
                stranded=load.stranded + is_stranded(row, now_at),
                failed_recently=load.failed_recently + failed,
            )
        return [loads[key] for key in sorted(loads)]

    async def activity(self, query: ActivityQuery) -> dict[str, Counts]:
        return count_activity(self.runs.values(), query)

    async def live_presences(self) -> builtins.list[PresenceSeen]:
        return []

    # -- OperatorStore: the workers that said they are alive ----------------------------------

    async def beat_worker(self, row: WorkerRow, sweep_at: str | None = None) -> None:
        found = self.workers.get(row.id)
        if found is not None:
            row = replace(
                found, jobs=row.jobs, heartbeat_at=row.heartbeat_at, expires_at=row.expires_at
            )
        self.workers[row.id] = row
        if sweep_at is not None:
            for worker in list(self.workers.values()):
                if not worker_is_live(worker, sweep_at):
                    del self.workers[worker.id]

    async def forget_worker(self, worker_id: str) -> None:
        self.workers.pop(worker_id, None)

    async def live_workers(self, now_at: str) -> builtins.list[WorkerRow]:
        live = [row for row in self.workers.values() if worker_is_live(row, now_at)]
        return sorted(live, key=lambda row: (row.started_at, row.id))
