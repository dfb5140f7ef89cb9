"""A wall-clock step steals no lease (issue 31 item 3).

The fake clock's wall time is stepped while its monotonic clock stays put, as an
NTP step or a resumed VM does:

* memory and SQLite (every driver of a store on one host, so one clock): the
  whole host +90 s and -90 s while a pass holds the lease: another driver takes
  nothing, and the holder's run goes on to the end;
* a renewal whose expiry would already be past is refused (the holder fences);
* Postgres, drivers on real time (the database's clock decides): the claimer's
  clock +90 s takes nothing; the holder's clock -90 s renews to an expiry that is
  still ahead on the database's clock.
"""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

import jobrun
from jobrun._core.model.formats import add_milliseconds, format_instant
from jobrun._core.model.records import ClaimRequest
from jobrun.testing import FakeClock
from tests.support import row_of, start_id

MODULE, JOB = "steps", "walk"
LEASE_MS = 1000
ON_POSTGRES = pytest.mark.parametrize(
    "backend", [pytest.param("postgres", marks=pytest.mark.postgres)]
)
ONE_HOST = pytest.mark.parametrize("backend", ["memory", "sqlite"])


class Bodies:
    """Step bodies of one run: the first waits for ``release``; any other that
    starts while one runs is an overlap, and returns at once."""

    def __init__(self) -> None:
        self.running = 0
        self.started = 0
        self.overlaps = 0
        self.first_started = asyncio.Event()
        self.release = asyncio.Event()

    async def body(self) -> str:
        self.started += 1
        self.running += 1
        try:
            if self.running > 1:
                self.overlaps += 1
                return "overlap"
            self.first_started.set()
            await self.release.wait()
            return "done"
        finally:
            self.running -= 1


def _registry(bodies: Bodies) -> jobrun.JobRegistry:
    registry = jobrun.JobRegistry()

    @registry.job(MODULE, JOB, lease_ms=LEASE_MS)
    async def walk(p: jobrun.JobPass) -> jobrun.PassResult:
        await p.step("long", bodies.body)
        return jobrun.PassResult(done=True)

    return registry


RENEWING = "_renewals_in_flight"


def _count_renewals(store: Any) -> None:
    """Count ``store``'s renewals in flight. A renewal runs under a deadline on the
    holder's clock, a sleeper too: the sleeper count is back before its round trip
    has landed, and advancing the clock then would expire that deadline mid-trip."""
    extend_lease = store.extend_lease
    setattr(store, RENEWING, 0)

    async def counted(*args: Any) -> bool:
        setattr(store, RENEWING, getattr(store, RENEWING) + 1)
        try:
            return bool(await extend_lease(*args))
        finally:
            setattr(store, RENEWING, getattr(store, RENEWING) - 1)

    store.extend_lease = counted


async def _advance(clock: FakeClock, seconds: float, store: Any) -> None:
    """Move the fake clock in small steps; after each, wait until every sleeper it woke
    (the lease keeper, whose renewal is a store round trip) has gone back to sleep on
    it and no renewal is in flight, so the renewal has landed before time moves on,
    however loaded the machine."""
    for _ in range(round(seconds / 0.05)):
        sleeping = clock.sleepers
        clock.advance(seconds=0.05)
        deadline = time.monotonic() + 30
        while clock.sleepers < sleeping or getattr(store, RENEWING, 0):
            assert time.monotonic() < deadline, "a woken sleeper never slept again"
            await asyncio.sleep(0.001)  # poll: the woken renewer's round trip


async def _hold(
    store: Any, holder_clock: FakeClock
) -> tuple[str, Bodies, jobrun.JobRegistry, asyncio.Task[jobrun.JobDriveReport]]:
    """A run started and driven by ``holder``, its first body in flight (holding the lease)."""
    run_id = await start_id(store, holder_clock, module_id=MODULE, job=JOB)
    _count_renewals(store)
    bodies = Bodies()
    registry = _registry(bodies)
    holding = asyncio.create_task(
        jobrun.run_due_jobs(store, registry, clock=holder_clock, driver_name="holder")
    )
    async with asyncio.timeout(30):  # bounds a hang only
        await bodies.first_started.wait()
    return run_id, bodies, registry, holding


async def _step_under_a_held_lease(
    store: Any, holder_clock: FakeClock, claimer_clock: FakeClock, step_s: float, *, holder: bool
) -> tuple[Bodies, str]:
    run_id, bodies, registry, holding = await _hold(store, holder_clock)
    # Let a renewal see the clock before the step (the watch learns its basis).
    await _advance(holder_clock, LEASE_MS / 4000 + 0.1, store)
    (holder_clock if holder else claimer_clock).step_wall(seconds=step_s)
    for _ in range(6):
        report = await jobrun.run_due_jobs(
            store, registry, clock=claimer_clock, driver_name="claimer"
        )
        assert report.attempted == 0, "the claimer took a live lease"
        # Past several renewals of the holder, on its clock.
        await _advance(holder_clock, LEASE_MS / 4000, store)
    assert bodies.overlaps == 0
    bodies.release.set()
    async with asyncio.timeout(30):  # bounds a hang only
        report = await holding
    assert report.completed == 1
    return bodies, run_id


@ONE_HOST
@pytest.mark.parametrize("step_s", [90.0, -90.0])
async def test_a_step_of_the_whole_hosts_clock_steals_no_lease(store: Any, step_s: float) -> None:
    clock = FakeClock()
    bodies, run_id = await _step_under_a_held_lease(store, clock, clock, step_s, holder=True)
    assert bodies.started == 1
    assert (await row_of(store, run_id)).status == "done"


@pytest.mark.parametrize("backend", ["memory", "sqlite", "postgres"])
async def test_a_renewal_to_an_expiry_already_past_is_refused(store: Any, backend: str) -> None:
    clock = FakeClock()
    run_id = await start_id(store, clock, module_id=MODULE, job=JOB)
    now_at = format_instant(clock.now())
    request = ClaimRequest(now_at, "TOKEN", "me", {(MODULE, JOB): add_milliseconds(now_at, 60_000)})
    assert await store.claim(request) is not None
    expires_at = (await row_of(store, run_id)).next_attempt_at
    past_at = add_milliseconds(now_at, -1)
    assert not await store.extend_lease(run_id, "TOKEN", past_at, now_at)
    assert (await row_of(store, run_id)).next_attempt_at == expires_at, "nothing written"


class RealTimeFakeClock(FakeClock):
    """A fake clock that says it runs on real time (so Postgres's clock decides the
    leases, as for a driver on the system clock), started at this instant."""

    real_time = True

    def __init__(self) -> None:
        super().__init__(datetime.now(UTC))


@ON_POSTGRES
async def test_one_clients_clock_ahead_takes_no_lease_on_postgres(store: Any) -> None:
    holder_clock, claimer_clock = RealTimeFakeClock(), RealTimeFakeClock()
    bodies, run_id = await _step_under_a_held_lease(
        store, holder_clock, claimer_clock, 90.0, holder=False
    )
    assert bodies.started == 1
    assert (await row_of(store, run_id)).status == "done"


@ON_POSTGRES
async def test_the_holders_clock_behind_renews_ahead_on_postgres(
    store: Any, engine: AsyncEngine
) -> None:
    holder_clock, claimer_clock = RealTimeFakeClock(), RealTimeFakeClock()
    run_id, bodies, registry, holding = await _hold(store, holder_clock)
    holder_clock.step_wall(seconds=-90)
    # Past a renewal on the holder's clock.
    await _advance(holder_clock, LEASE_MS / 4000 + 0.1, store)
    async with engine.connect() as connection:
        database_now = (await connection.execute(text("SELECT clock_timestamp()"))).scalar_one()
    expires_at = (await row_of(store, run_id)).next_attempt_at
    assert expires_at is not None
    assert expires_at > format_instant(database_now), "the renewal wrote an expiry already past"
    report = await jobrun.run_due_jobs(store, registry, clock=claimer_clock, driver_name="claimer")
    assert report.attempted == 0, "the claimer took a live lease"
    assert bodies.overlaps == 0
    bodies.release.set()
    async with asyncio.timeout(30):  # bounds a hang only
        assert (await holding).completed == 1


@ONE_HOST
async def test_a_lease_handed_on_after_a_backward_step_stays_live_for_a_driver_not_stepped(
    store: Any,
) -> None:
    # The holder's wall clock steps back during its first pass; a driver whose clock
    # has not stepped yet (the moment between two processes' readings) must still see
    # the lease the commit hands to the second pass as live.
    holder_clock, claimer_clock = FakeClock(), FakeClock()
    run_id = await start_id(store, holder_clock, module_id=MODULE, job=JOB)
    thefts: list[bool] = []
    registry = jobrun.JobRegistry()

    @registry.job(MODULE, JOB, lease_ms=LEASE_MS)
    async def walk(p: jobrun.JobPass) -> jobrun.PassResult:
        if p.cursor is None:
            holder_clock.step_wall(seconds=-90)
            return jobrun.PassResult(cursor="handed on")
        now_at = format_instant(claimer_clock.now())
        request = ClaimRequest(
            now_at, "THIEF", "claimer", {(MODULE, JOB): add_milliseconds(now_at, 60_000)}
        )
        thefts.append(await store.claim(request) is not None)
        return jobrun.PassResult(done=True)

    report = await jobrun.run_due_jobs(
        store, registry, clock=holder_clock, driver_name="holder", max_passes=2
    )
    assert thefts == [False], "a driver not stepped took the lease handed on"
    assert report.completed == 1
    assert (await row_of(store, run_id)).status == "done"


@ON_POSTGRES
async def test_a_slot_is_judged_on_the_database_clock_on_postgres(store: Any) -> None:
    # Drivers on real time hold leases on the database's clock; a taker whose own
    # clock is 90 s ahead must not see the holder's slot as free.
    clock = RealTimeFakeClock()
    now_at = format_instant(clock.now())
    expires = {(MODULE, JOB): add_milliseconds(now_at, 60_000)}
    holder = await start_id(store, clock, module_id=MODULE, job=JOB, instance="holder")
    taker = await start_id(store, clock, module_id=MODULE, job=JOB, instance="taker")
    for token, run_id, other in (("HOLDER", holder, taker), ("TAKER", taker, holder)):
        request = ClaimRequest(
            now_at, token, "me", expires, skip_ids=frozenset({other}), database_clock=True
        )
        claimed = await store.claim(request)
        assert claimed is not None
        assert claimed.row.id == run_id
    assert await store.acquire_slot("tenant", 1, holder, "s", "HOLDER", now_at)
    ahead_at = add_milliseconds(now_at, 90_000)
    assert not await store.acquire_slot("tenant", 1, taker, "s", "TAKER", ahead_at)
    await store.release_slot("tenant", holder, "s", "HOLDER", now_at)
    assert await store.acquire_slot("tenant", 1, taker, "s", "TAKER", ahead_at)


@pytest.mark.parametrize(
    "backend", ["memory", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)
async def test_a_forward_step_frees_no_concurrency_slot_of_a_running_body(
    store: Any, backend: str
) -> None:
    # Two runs share a concurrency key of one. The first's body holds the slot; a clock
    # steps 90 s ahead (memory, SQLite: the whole host's; Postgres: the second driver's
    # alone, drivers on real time); the second run's step, tried before the holder
    # renews again (its lease's wall expiry then only looks past), must wait.
    one_host = backend != "postgres"
    clock = FakeClock() if one_host else RealTimeFakeClock()
    taker_clock = clock if one_host else RealTimeFakeClock()
    _count_renewals(store)
    running: list[str] = []
    overlaps = 0
    release = asyncio.Event()
    started = asyncio.Event()
    tried: asyncio.Queue[bool] = asyncio.Queue()
    acquire_slot = store.acquire_slot

    async def noted(*args: Any) -> bool:
        taken = bool(await acquire_slot(*args))
        tried.put_nowait(taken)
        return taken

    store.acquire_slot = noted

    async def body(p: jobrun.JobPass) -> str:
        nonlocal overlaps
        overlaps += bool(running)
        running.append(p.run.instance)
        started.set()
        try:
            if p.run.instance == "first":
                await release.wait()
            return p.run.instance
        finally:
            running.remove(p.run.instance)

    registry = jobrun.JobRegistry()
    registry.concurrency_limit("tenant", 1)

    @registry.job(MODULE, JOB, lease_ms=LEASE_MS)
    async def walk(p: jobrun.JobPass) -> jobrun.PassResult:
        await p.step("call", lambda: body(p), concurrency_limit="tenant")
        return jobrun.PassResult(done=True)

    await start_id(store, clock, module_id=MODULE, job=JOB, instance="first")
    holding = asyncio.create_task(
        jobrun.run_due_jobs(store, registry, clock=clock, driver_name="holder", limit=1)
    )
    async with asyncio.timeout(30):  # bounds a hang only
        await started.wait()
        assert await tried.get(), "the first body took the slot"
    if not one_host:
        # The second driver reads its offset to the database's clock before its step.
        idle = await jobrun.run_due_jobs(store, registry, clock=taker_clock, driver_name="second")
        assert idle.attempted == 0
    await start_id(store, clock, module_id=MODULE, job=JOB, instance="second")
    # A renewal sees the clock before the step (the watch learns its basis).
    await _advance(clock, LEASE_MS / 4000 + 0.1, store)
    taker_clock.step_wall(seconds=90)
    second = asyncio.create_task(
        jobrun.run_due_jobs(store, registry, clock=taker_clock, driver_name="second", limit=1)
    )
    async with asyncio.timeout(30):  # bounds a hang only
        assert not await tried.get(), "a stepped clock freed the running body's slot"
    # Past several renewals of the holder and polls of the waiting slot.
    await _advance(clock, LEASE_MS / 1000, store)
    assert overlaps == 0
    assert running == ["first"]
    release.set()
    async with asyncio.timeout(30):  # bounds a hang only
        reports = [await holding, await second]
    assert [report.completed for report in reports] == [1, 1]
    assert overlaps == 0
