"""Never twice at once (issue 21): a holder that can no longer vouch for its lease
stops its bodies before anyone may take the run over, and a lost presence is not
taken for death until the grace period has passed.

* an expired lease is never renewed back to life (memory, SQLite, Postgres);
* a holder whose renewals keep failing cancels its pass at its self-fence
  instant, before the lease could be seen expired, and starts no body after;
* Postgres: the presence session terminated by the server (``pg_terminate_backend``)
  stops the holder's pass within the detection bound, and the run is not taken
  over by another driver before the grace period;
* Postgres: ``idle_session_timeout`` on the role does not end the presence.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import asyncpg
import pytest
from sqlalchemy import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

import jobrun
from jobrun._core.leases import proof_of_death as orphans
from jobrun._core.leases.renewal import Lease, LeaseKeeper
from jobrun._core.model.formats import add_milliseconds, format_instant, parse_instant
from jobrun._core.model.records import ClaimRequest
from jobrun._host.system import system_clock
from jobrun.testing import FakeClock
from tests.support import row_of, start_id

MODULE, JOB = "fence", "walk"
ON_POSTGRES = pytest.mark.parametrize(
    "backend", [pytest.param("postgres", marks=pytest.mark.postgres)]
)


def _request(clock: FakeClock, token: str, lease_ms: int) -> ClaimRequest:
    now_at = format_instant(clock.now())
    return ClaimRequest(now_at, token, "me", {(MODULE, JOB): add_milliseconds(now_at, lease_ms)})


async def test_an_expired_lease_is_never_renewed(store: Any, clock: FakeClock) -> None:
    run_id = await start_id(store, clock, module_id=MODULE, job=JOB)
    claimed = await store.claim(_request(clock, "TOKEN", 1000))
    assert claimed is not None
    assert claimed.row.id == run_id
    clock.advance(milliseconds=500)
    now_at = format_instant(clock.now())
    assert await store.extend_lease(run_id, "TOKEN", add_milliseconds(now_at, 1000), now_at)
    expires_at = (await row_of(store, run_id)).next_attempt_at
    clock.advance(milliseconds=1000)  # exactly at the expiry: expired
    now_at = format_instant(clock.now())
    assert now_at == expires_at
    assert not await store.extend_lease(run_id, "TOKEN", add_milliseconds(now_at, 1000), now_at)
    assert (await row_of(store, run_id)).next_attempt_at == expires_at, "nothing written"


async def test_a_holder_that_cannot_renew_stops_before_its_lease_can_expire(
    store: Any, clock: FakeClock
) -> None:
    """The store answers the steps but every renewal fails: the pass is cancelled at the
    self-fence instant, which comes before the lease's expiry less the clock skew."""
    started: list[float] = []
    cancelled: list[float] = []

    async def handler(p: jobrun.JobPass) -> jobrun.PassResult:
        try:
            for number in range(100):
                await p.step(f"s{number}", lambda: started.append(clock.monotonic()))
                await clock.sleep(0.1)
        except asyncio.CancelledError:
            cancelled.append(clock.monotonic())
            raise
        return jobrun.PassResult(done=True)

    class Unrenewable:
        def __init__(self, inner: Any) -> None:
            self.inner = inner

        def __getattr__(self, name: str) -> Any:
            return getattr(self.inner, name)

        async def extend_lease(self, *_: Any) -> bool:
            raise OSError("the database does not answer renewals")

        async def claim(self, request: ClaimRequest) -> Any:
            # The claim's instant on the clock's monotonic scale (the fence starts there).
            origin = clock.now() - timedelta(seconds=clock.monotonic())
            claimed_at.append((parse_instant(request.now_at) - origin).total_seconds())
            return await self.inner.claim(request)

    registry = jobrun.JobRegistry()
    registry.register(MODULE, JOB, handler, lease_ms=4000)
    run_id = await start_id(store, clock, module_id=MODULE, job=JOB)
    claimed_at: list[float] = []
    driving = asyncio.create_task(jobrun.run_due_jobs(Unrenewable(store), registry, clock=clock))
    while not driving.done():
        await asyncio.sleep(0.001)  # real time for the store's I/O between clock moves
        clock.advance(milliseconds=50)
    report = driving.result()
    assert report.superseded == 1
    lease = Lease("T", "d", 4000)
    takeover_s = claimed_at[0] + 4.0 - lease.skew_margin_s()
    assert cancelled, "the pass was cancelled where it waited"
    # The clock moves on while the store answers, so the instant the cancellation
    # lands says little; that no body started past the fence says what matters.
    assert max(started) < takeover_s - lease.stop_margin_s(), "no body after the self-fence"
    # Until then: the last body came within one step's spacing of the fence (a loaded
    # machine spaces steps wider on this clock, which moves on while the store answers).
    spacing_s = max(later - earlier for earlier, later in itertools.pairwise(started))
    floor_s = takeover_s - lease.stop_margin_s() - max(0.2, spacing_s)
    assert max(started) >= floor_s, "bodies ran until then"
    # Handed back: another driver may take the run at once, nothing charged.
    row = await row_of(store, run_id)
    assert (row.lease_owner, row.attempts, row.lease_takeovers) == (None, 0, 0)


async def test_the_self_fence_moves_with_each_successful_renewal() -> None:
    clock = FakeClock()
    renewals: list[str] = []

    async def extend(expires_at: str, now_at: str) -> bool:
        renewals.append(now_at)
        return True

    keeper = LeaseKeeper(Lease("T", "d", 1000), clock, extend, "run", leased_at_s=0.0)
    first = keeper.stop_at_s()
    async with keeper:
        for _ in range(40):  # 2 s of 50 ms moves: eight renewals
            await asyncio.sleep(0)
            clock.advance(milliseconds=50)
        await asyncio.sleep(0)
    assert not keeper.lost
    assert len(renewals) >= 7
    assert keeper.stop_at_s() > first + 1.5


# --- Postgres: the presence ----------------------------------------------------------


@pytest.fixture
async def admin(database_url: str) -> AsyncIterator[Any]:
    connection = await asyncpg.connect(
        make_url(database_url).set(drivername="postgresql").render_as_string(False)
    )
    try:
        yield connection
    finally:
        await connection.close()


async def _presence_pid(admin: Any, key: int) -> int:
    found = await admin.fetchval(
        "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted AND objsubid = 1 "
        "AND ((classid::bigint << 32) | objid::bigint) = $1",
        key,
    )
    assert found is not None, "the presence lock is held"
    return int(found)


class LongStep:
    """A pass in a 30 s step body, driven by ``run_due_jobs`` in a task (the loop's own
    presence check under test: the watchdog, which would end this very process if
    the loop were slow, has a process test of its own)."""

    def __init__(self) -> None:
        self.in_body = asyncio.Event()
        self.ended: list[str] = []
        self.registry = jobrun.JobRegistry()
        self.registry.register(MODULE, JOB, self.handler)

    async def handler(self, p: jobrun.JobPass) -> jobrun.PassResult:
        async def body() -> int:
            self.in_body.set()
            try:
                await asyncio.sleep(30)
            finally:
                self.ended.append("body")
            return 1

        await p.step("long", body)
        return jobrun.PassResult(done=True)

    async def start(self, holder: Any) -> tuple[str, asyncio.Task[Any]]:
        """Start a run and drive it until its body runs: the run's id and the drive."""
        run_id = await start_id(holder, None, module_id=MODULE, job=JOB)
        driving = asyncio.create_task(
            jobrun.run_due_jobs(holder, self.registry, driver_name="holder", watchdog=False)
        )
        await asyncio.wait_for(self.in_body.wait(), 30)
        return run_id, driving


@ON_POSTGRES
async def test_a_terminated_presence_stops_the_pass_and_is_not_taken_for_death(
    backend: str, engine: AsyncEngine, admin: Any
) -> None:
    long_step = LongStep()
    holder = jobrun.SqlJobRunStore(engine)
    run_id, driving = await long_step.start(holder)
    row = await row_of(holder, run_id)
    assert row.lease_driver is not None
    assert " presence=" in row.lease_driver
    key = int(row.lease_driver.rsplit("presence=", 1)[1].rstrip("]"))
    killed_s = time.monotonic()
    await admin.execute("SELECT pg_terminate_backend($1)", await _presence_pid(admin, key))
    report = await asyncio.wait_for(driving, 30)
    stopped_s = time.monotonic() - killed_s
    assert long_step.ended == ["body"]
    assert report.superseded == 1
    assert stopped_s < orphans.PRESENCE_GRACE_S, f"stopped {stopped_s:.2f} s after the kill"
    # Another driver, in another engine (another process to the database), may not
    # take the run over on a free presence alone... but the holder handed it back.
    row = await row_of(holder, run_id)
    assert (row.lease_owner, row.attempts, row.lease_takeovers) == (None, 0, 0)


@ON_POSTGRES
async def test_a_free_presence_is_taken_over_only_after_the_grace_period(
    backend: str, engine: AsyncEngine, admin: Any, database_url: str
) -> None:
    holder = jobrun.SqlJobRunStore(engine)
    run_id = await start_id(holder, None, module_id=MODULE, job=JOB)
    key = await holder.presence()
    assert key is not None
    # A lease held under that presence, as a claim would write it, then the session ends.
    now_at = format_instant(system_clock())
    driver = f"holder [jobrun host=elsewhere presence={key}]"
    request = ClaimRequest(
        now_at, "HELD", driver, {(MODULE, JOB): add_milliseconds(now_at, 600_000)}
    )
    assert await holder.claim(request) is not None
    await admin.execute("SELECT pg_terminate_backend($1)", await _presence_pid(admin, key))
    other_engine = create_async_engine(database_url)
    try:
        claimer = jobrun.SqlJobRunStore(other_engine)
        seen: list[tuple[float, int]] = []
        first_s = time.monotonic()
        registry = jobrun.JobRegistry()
        registry.register(MODULE, JOB, lambda p: jobrun.PassResult(done=True))
        while time.monotonic() - first_s < 3 * orphans.PRESENCE_GRACE_S:
            report = await jobrun.run_due_jobs(claimer, registry, driver_name="claimer")
            seen.append((time.monotonic() - first_s, report.attempted))
            if report.attempted:
                break
            await asyncio.sleep(0.2)  # a poll interval
        taken = [elapsed for elapsed, attempted in seen if attempted]
        assert taken, f"never taken over: {seen}"
        assert taken[0] >= orphans.PRESENCE_GRACE_S, f"taken over after {taken[0]:.2f} s"
        done = await row_of(claimer, run_id)
        assert done.status == "done"
    finally:
        await other_engine.dispose()


@ON_POSTGRES
async def test_idle_session_timeout_does_not_end_the_presence(
    backend: str, engine: AsyncEngine, admin: Any, database_url: str
) -> None:
    database = make_url(database_url).database
    await admin.execute(f'ALTER DATABASE "{database}" SET idle_session_timeout = 1000')
    try:
        short = create_async_engine(database_url)
        try:
            store = jobrun.SqlJobRunStore(short)
            key = await store.presence()
            lost = asyncio.Event()
            store.watch_presence(key, lost.set)
            # asyncio.sleep: three times the server's idle timeout, the thing under test.
            await asyncio.sleep(3)
            assert not lost.is_set()
            assert await store.presence() == key
            await _presence_pid(admin, key)  # still held by its session
        finally:
            await short.dispose()
    finally:
        await admin.execute(f'ALTER DATABASE "{database}" RESET idle_session_timeout')


@ON_POSTGRES
async def test_the_presence_is_checked_only_while_it_vouches_for_a_pass(
    backend: str, engine: AsyncEngine, admin: Any
) -> None:
    """An idle host sends no query; a watched presence is checked twice a second."""
    store = jobrun.SqlJobRunStore(engine)
    key = await store.presence()
    pid = await _presence_pid(admin, key)

    async def last_query() -> tuple[str, Any]:
        found = await admin.fetchrow(
            "SELECT query, query_start FROM pg_stat_activity WHERE pid = $1", pid
        )
        return str(found["query"]), found["query_start"]

    opened = await last_query()
    # asyncio.sleep: three check intervals, in which an idle presence must stay silent.
    await asyncio.sleep(3 * orphans.PRESENCE_CHECK_INTERVAL_S)
    assert await last_query() == opened
    stop = store.watch_presence(key, lambda: None)
    try:
        # asyncio.sleep: three check intervals, in which a watched one is checked.
        await asyncio.sleep(3 * orphans.PRESENCE_CHECK_INTERVAL_S)
        query, started_at = await last_query()
        assert started_at > opened[1]
        # The check proves the lock, held by this very session, not just a connection.
        assert "pg_locks" in query
        assert "pg_backend_pid()" in query
    finally:
        stop()


@ON_POSTGRES
async def test_a_session_that_no_longer_holds_the_lock_stops_the_pass(
    backend: str, engine: AsyncEngine, admin: Any
) -> None:
    """What a pooler in transaction mode does (PgBouncer: the lock stays on a server
    session the client no longer talks to): the connection answers, the lock is not
    its own. The holder must stop before a claimer's grace ends, as for a lost session."""
    long_step = LongStep()
    holder = jobrun.SqlJobRunStore(engine)
    run_id, driving = await long_step.start(holder)
    key = await holder.presence()
    assert key is not None
    let_go_s = time.monotonic()
    released = await holder.on_presence_connection(
        lambda raw: raw.fetchval("SELECT pg_advisory_unlock($1)", key)
    )
    assert released is True
    report = await asyncio.wait_for(driving, 30)
    stopped_s = time.monotonic() - let_go_s
    assert long_step.ended == ["body"]
    assert report.superseded == 1
    assert stopped_s < orphans.PRESENCE_GRACE_S, f"stopped {stopped_s:.2f} s after"
    row = await row_of(holder, run_id)
    assert (row.lease_owner, row.attempts) == (None, 0)
