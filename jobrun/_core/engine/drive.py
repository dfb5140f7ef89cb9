"""The bounded driver: lease due runs one at a time and give each up to ``max_passes`` passes."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import replace
from typing import Any, TypeAlias, TypeVar

from jobrun._core.engine.observe import LOG_PASSES, PassProbe, PassStart, start_watch
from jobrun._core.engine.options import DriveOptions
from jobrun._core.engine.outcomes import PassOutcome, fail_for_takeovers, hand_back
from jobrun._core.engine.passes import OpenScope, PassSettings, run_job_pass
from jobrun._core.engine.registry import JobRegistry, RegisteredJob
from jobrun._core.leases import proof_of_death as orphans
from jobrun._core.leases.claims import Claimed
from jobrun._core.leases.renewal import CALL_FLOOR_S, MIN_LEASE_MS, Lease
from jobrun._core.model.formats import format_instant, parse_instant
from jobrun._core.model.predicates import is_live
from jobrun._core.model.records import (
    ClaimRequest,
    DriveError,
    JobDriveReport,
    RunKey,
    RunRow,
)
from jobrun._core.port import JobRunStore
from jobrun._core.rules.fair_turns import ClaimTurns
from jobrun._core.sources import Sources
from jobrun._core.time.aligned import aligned_clock
from jobrun._core.time.clock import Clock
from jobrun._core.time.wall_steps import boot_instant, lease_instants
from jobrun.errors import StoreError

UserExitHandler: TypeAlias = Callable[[RunKey, "KeyboardInterrupt | SystemExit"], None]


def _count(report: JobDriveReport, run_id: str, outcome: PassOutcome) -> None:
    # Each outcome has its own count, of the same name. A deferred or paused pass is
    # no failure (no error, its lease already given back); a lost lease (superseded)
    # is the new holder's business: counted here, nowhere else.
    setattr(report, outcome.status, getattr(report, outcome.status) + 1)
    if outcome.error is not None and outcome.status in ("retrying", "failed"):
        report.errors.append(DriveError(run_id, outcome.error))


async def _claim(
    store: JobRunStore,
    registry: JobRegistry,
    clock: Clock,
    driver: str,
    skip_ids: frozenset[str],
    sources: Sources,
    by_age: bool,
) -> tuple[Claimed, RegisteredJob, Lease, float] | None:
    jobs = list(registry)
    wanted = frozenset((job.module_id, job.name) for job in jobs)
    # Who we are, precisely enough for another claimer to prove our death.
    presence = await store.presence()
    identity = replace(sources.host.identity(), presence=presence)
    holder = identity.describe(driver)
    # Where the lease's self-fence starts: its expiry is counted from ``written_at``.
    leased_at_s = clock.monotonic()
    # Expiries judged and written on instants a wall-clock step cannot fool (wallsteps).
    judged, written = lease_instants(clock, max((job.lease_ms for job in jobs), default=0) / 500)
    now_at = format_instant(judged)
    dead = await orphans.dead_owners(
        store, now_at, wanted, now_s=clock.monotonic(), host=sources.host
    )
    # A fresh token per claim: the fence that makes a stale holder's writes miss.
    token = sources.mint_id()
    request = _claim_request(
        jobs, now_at, format_instant(written), token, holder, skip_ids, dead, by_age
    )
    request = replace(request, database_clock=getattr(clock, "real_time", False))
    # Read after ``leased_at_s``: the lease's boot expiry ends no sooner than its fence.
    boot = boot_instant(clock)
    if boot is not None:
        expiries = {(job.module_id, job.name): boot.ms + job.lease_ms for job in jobs}
        request = replace(request, boot=boot, boot_expires_ms=expiries)
    # A claim unanswered for a whole lease is abandoned (its connection discarded):
    # whatever it took has expired by then, and a silent connection must not hold
    # the driver (issue 31).
    claiming = within(drive_call_bound_s(registry), "claim", store.claim(request))
    claimed = await _shielded_claim(store, request, claiming)
    if claimed is None:
        return None
    row = claimed.row
    orphans.claimed(store, wanted, row.id)
    registered = registry.get(row.module_id, row.job)
    assert registered is not None, "the store returned a run of a job that was not asked for"
    lease = Lease(token, holder, registered.lease_ms, presence, store.presence_fd(presence))
    return claimed, registered, lease, leased_at_s


def _claim_request(
    jobs: list[RegisteredJob],
    now_at: str,
    written_at: str,
    token: str,
    holder: str,
    skip_ids: frozenset[str],
    dead: frozenset[str],
    by_age: bool,
) -> ClaimRequest:
    """What a claim asks of the store: the jobs, each with its lease's expiry and limit,
    and whether this claim goes by age (see :mod:`jobrun._core.rules.fair_turns`). Expiries are
    judged at ``now_at`` and counted from ``written_at`` (later only after a step)."""
    expires_at = {
        (job.module_id, job.name): Lease(token, holder, job.lease_ms).expiry_after(written_at)
        for job in jobs
    }
    limits = {
        (job.module_id, job.name): job.max_concurrent
        for job in jobs
        if job.max_concurrent is not None
    }
    return ClaimRequest(
        now_at,
        token,
        holder,
        expires_at,
        skip_ids,
        max_concurrent=limits,
        dead_owners=dead,
        by_age=by_age,
        # Runs a newer version of a job committed are not this code's to run.
        versions={(job.module_id, job.name): job.version for job in jobs},
    )


async def _shielded_claim(
    store: JobRunStore, request: ClaimRequest, claim: Awaitable[Claimed | None]
) -> Claimed | None:
    """The claim, shielded: one interrupted in flight may land anyway, so its answer
    is still awaited and the lease it took handed back before the interruption goes
    on (``claim`` is bounded, see ``within``)."""
    claiming = asyncio.ensure_future(claim)
    try:
        return await asyncio.shield(claiming)
    except Exception:
        raise
    except BaseException:
        with contextlib.suppress(BaseException):
            taken = await asyncio.shield(claiming)
            if taken is not None:
                lease = Lease(request.token, request.driver, MIN_LEASE_MS)
                await hand_back(store, taken.row, lease)
        raise


T = TypeVar("T")


def drive_call_bound_s(registry: JobRegistry) -> float:
    """How long a call of the drive (outside a pass) may go unanswered: the longest
    lease of the jobs it claims (what it would take has run out by then), at least
    ``CALL_FLOOR_S``."""
    longest_s = max((job.lease_ms for job in registry), default=MIN_LEASE_MS) / 1000
    return max(longest_s, CALL_FLOOR_S)


async def within(bound_s: float, operation: str, work: Awaitable[T]) -> T:
    """``work``, abandoned as a store error if it has not answered in ``bound_s`` real
    seconds (a network's time, whatever the drive's clock): a silent connection must
    not hold the driver for ever (issue 31)."""
    deadline = asyncio.timeout(bound_s)
    try:
        async with deadline:
            return await work
    except TimeoutError as error:
        if not deadline.expired():
            raise
        raise StoreError(operation, TimeoutError(f"no answer in {bound_s:g} s")) from error


def _key_of(row: RunRow) -> RunKey:
    return RunKey(row.id, row.module_id, row.job, row.instance)


async def _observed(
    probe: PassProbe | None, running: Coroutine[Any, Any, PassOutcome]
) -> PassOutcome:
    """Await a pass, telling its probe (if watched) how it ended."""
    if probe is None:
        return await running
    try:
        outcome = await running
    except BaseException:
        probe.end("interrupted")
        raise
    again = outcome.next_attempt_at
    probe.end(outcome.status, outcome.error, None if again is None else parse_instant(again))
    return outcome


async def drive_due_jobs(
    store: JobRunStore,
    registry: JobRegistry,
    chosen: DriveOptions,
    sources: Sources,
    *,
    stop: asyncio.Event | None = None,
    on_user_exit: UserExitHandler | None = None,
    turns: ClaimTurns | None = None,
) -> JobDriveReport:
    """:func:`jobrun.run_due_jobs` with its options judged and its sources chosen.

    A ``KeyboardInterrupt`` or ``SystemExit`` raised by a handler or a step body
    is recorded as that run's failed attempt, which releases its lease. Without
    ``on_user_exit`` it is then raised again, as a program embedding
    :func:`run_due_jobs` expects of ``sys.exit()`` or Ctrl-C; with it, it goes to
    ``on_user_exit(run, exception)`` and the drive goes on with other runs, as a
    worker must when one job's code calls ``sys.exit()``.

    ``turns`` counts this driver's claims, one in ``FAIR_EVERY`` going by age
    (see :mod:`jobrun._core.rules.fair_turns`); without it, the store's ``claim_turns``.
    """
    drive = _Drive(
        store,
        registry,
        chosen,
        sources,
        clock=await aligned_clock(store, chosen.clock, sources.clock),
        stop=stop,
        on_user_exit=on_user_exit,
    )
    driven: set[str] = set()
    turns = store.claim_turns if turns is None else turns
    # The drive's own calls (owed releases, the presence, the dead-holder scan, the
    # claim) are bounded: see ``within``.
    bound_s = drive_call_bound_s(registry)
    while drive.report.attempted < chosen.limit and not drive.stopping():
        # Releases the store failed earlier go first: their runs are due again now.
        await within(bound_s, "settle", store.owed_releases.settle(store))
        by_age = turns.next_by_age()
        claiming = _claim(
            store, registry, drive.clock, drive.driver, frozenset(driven), sources, by_age
        )
        claimed = await within(2 * bound_s, "claim", claiming)
        if claimed is None:
            break
        taken, registered, lease, leased_at_s = claimed
        driven.add(taken.row.id)
        drive.report.attempted += 1
        await drive.run(taken, registered, lease, leased_at_s)
    return drive.report


class _Drive:
    """One call of :func:`run_due_jobs`: its settings, and the report it fills in."""

    def __init__(
        self,
        store: JobRunStore,
        registry: JobRegistry,
        options: DriveOptions,
        sources: Sources,
        *,
        clock: Clock,
        stop: asyncio.Event | None,
        on_user_exit: UserExitHandler | None = None,
    ) -> None:
        self.on_user_exit = on_user_exit
        self.store = store
        self.registry = registry
        self.options = options
        self.driver = options.driver_name or sources.driver_name()
        self.clock = clock
        self.stop = stop
        open_scope: OpenScope = options.open_scope or (lambda _run: store.default_scope)
        self.observer = LOG_PASSES if options.observer is None else options.observer
        self.settings = PassSettings(
            store=store,
            clock=clock,
            random=sources.random if options.random is None else options.random,
            mint_id=sources.mint_id,
            open_scope=open_scope,
            timeout_s=options.pass_timeout_s,
            # On only when asked: run_worker asks unless told not to (see DriveOptions).
            guard=sources.guard(clock) if options.watchdog is True else None,
            limits=registry.limits,
        )
        self.report = JobDriveReport()

    def stopping(self) -> bool:
        return self.stop is not None and self.stop.is_set()

    async def run(
        self, claimed: Claimed, registered: RegisteredJob, lease: Lease, leased_at_s: float
    ) -> None:
        """Give one claimed run its passes, up to ``max_passes``, while they advance it."""
        row = claimed.row
        if row.lease_takeovers > registered.max_takeovers:
            outcome = await fail_for_takeovers(
                self.store, row, registered.max_takeovers, lease, self.clock
            )
            _count(self.report, row.id, outcome)
            return
        passes = self.options.max_passes
        current = row
        # Only the first pass of a claim can begin with a takeover.
        taken_over = claimed.taken_over
        for number in range(passes):
            if number > 0 and self.stopping():
                # Asked to stop between passes: the lease kept for this pass goes back.
                await hand_back(self.store, current, lease)
                return
            last = number + 1 >= passes
            start = PassStart(
                _key_of(current), self.driver, number + 1, current.attempts, taken_over
            )
            probe = start_watch(self.observer, start, self.clock.monotonic)
            outcome = await _observed(
                probe,
                run_job_pass(
                    self.settings,
                    registered,
                    current,
                    lease,
                    leased_at_s=leased_at_s,
                    # After this driver's own commit the ledger is known to be empty;
                    # before the first pass, when the claim found it so.
                    ledger_known_empty=number > 0 or claimed.ledger_empty,
                    keep_lease=not last,
                    probe=probe,
                ),
            )
            taken_over = False
            _count(self.report, row.id, outcome)
            if outcome.raised is not None:
                # Recorded, and the lease released by that record: now raised or reported.
                if self.on_user_exit is None:
                    raise outcome.raised
                self.on_user_exit(_key_of(current), outcome.raised)
                return
            if outcome.status != "advanced" or last or outcome.row is None:
                return
            if not is_live(outcome.row):
                return
            current = outcome.row
            if current.lease_owner is not None and outcome.leased_at_s is not None:
                # The commit handed the lease on under a fresh token.
                lease = replace(lease, token=current.lease_owner)
                leased_at_s = outcome.leased_at_s
