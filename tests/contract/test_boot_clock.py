"""Leases on the boot clock (revision 0010): a process started after a wall-clock step
takes no live lease.

On memory and SQLite every process of a store shares one host, and so one boot
clock (``CLOCK_BOOTTIME``), which no wall-clock step moves. A lease is written on
it too, and a claimer of the same boot judges it there: a lease whose wall expiry
only looks past is not taken, one expired there is; a lease of another boot (or
written without the boot clock) falls back to the wall rule. Postgres judges on its
own clock and leaves the columns empty.
"""

from __future__ import annotations

import asyncio
import dataclasses
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import update
from sqlalchemy.ext.asyncio import AsyncEngine

import jobrun
from jobrun._core.model.formats import add_milliseconds, format_instant
from jobrun._core.model.records import BootInstant, BootLease, ClaimRequest
from jobrun.sql.schema import job_runs
from jobrun.testing import FakeClock
from tests.contract.test_clock_steps import LEASE_MS, MODULE, _advance, _hold
from tests.support import SQL_BACKENDS, row_of, start_id

LEASE = 60_000
KEY = (MODULE, "boot")
ALL = pytest.mark.parametrize("backend", ["memory", *SQL_BACKENDS], indirect=True)


def _request(at: str, token: str, boot: BootInstant | None) -> ClaimRequest:
    expires = {KEY: add_milliseconds(at, LEASE)}
    if boot is None:
        return ClaimRequest(at, token, "me", expires)
    return ClaimRequest(at, token, "me", expires, boot=boot, boot_expires_ms={KEY: boot.ms + LEASE})


async def _leased(store: Any, clock: FakeClock) -> tuple[str, str]:
    """A run leased for a minute at ``clock``'s instant, on boot clock ``b`` at 1000 ms;
    its id and that instant."""
    run_id = await start_id(store, clock, module_id=KEY[0], job=KEY[1])
    at = format_instant(clock.now())
    assert await store.claim(_request(at, "HOLDER", BootInstant("b", 1000))) is not None
    return run_id, at


def _one_host(store: Any) -> bool:
    return not isinstance(store, jobrun.SqlJobRunStore) or store.engine.dialect.name == "sqlite"


@ALL
async def test_a_lease_of_this_boot_is_judged_on_the_boot_clock(store: Any) -> None:
    run_id, at = await _leased(store, FakeClock())
    row = await row_of(store, run_id)
    one_host = _one_host(store)
    # Written on both clocks (Postgres: its own clock only).
    boot_columns = (row.lease_boot_id, row.lease_boot_expires_ms)
    assert boot_columns == (("b@HOLDER", 1000 + LEASE) if one_host else (None, None))
    # The wall clock stepped 90 s ahead: the wall expiry looks past, the boot one is not.
    stepped = add_milliseconds(at, 90_000)
    taken = await store.claim(_request(stepped, "THIEF", BootInstant("b", 2000)))
    if not one_host:
        assert taken is not None, "Postgres judges by the time it is given"
        return
    assert taken is None, "a live lease of this boot was taken"
    # Expired on the boot clock: taken over.
    taken = await store.claim(_request(stepped, "NEXT", BootInstant("b", 1000 + LEASE)))
    assert taken is not None
    assert taken.taken_over
    assert (taken.row.lease_boot_id, taken.row.lease_boot_expires_ms) == (
        "b@NEXT",
        1000 + 2 * LEASE,
    )


@ALL
async def test_a_lease_held_on_the_boot_clock_counts_against_its_jobs_limit(store: Any) -> None:
    # max_concurrent 1: a second run of the job waits while the first is held, and a
    # forward wall-clock step (its wall expiry only looks past) must not free its slot.
    clock = FakeClock()
    _first, at = await _leased(store, clock)
    second = await start_id(store, clock, module_id=KEY[0], job=KEY[1], instance="second")
    stepped = add_milliseconds(at, 90_000)
    limited = dataclasses.replace(
        _request(stepped, "OTHER", BootInstant("b", 2000)),
        max_concurrent={KEY: 1},
        skip_ids=frozenset({_first}),
    )
    taken = await store.claim(limited)
    if not _one_host(store):
        # Postgres: the lease is judged on the time given, expired there.
        assert taken is not None
        return
    assert taken is None, "a run was leased beyond the job's limit"
    # The first lease expired on the boot clock as well: the slot is free.
    boot_ms = 1000 + LEASE
    limited = dataclasses.replace(
        limited,
        boot=BootInstant("b", boot_ms),
        boot_expires_ms={KEY: boot_ms + LEASE},
    )
    taken = await store.claim(limited)
    assert taken is not None
    assert taken.row.id == second


@ALL
async def test_a_slot_whose_lease_is_held_on_the_boot_clock_still_counts(store: Any) -> None:
    # A concurrency slot counts while its run's lease holds: after a forward wall-clock
    # step the lease's wall expiry only looks past, and the slot must not look free.
    clock = FakeClock()
    first, at = await _leased(store, clock)
    assert await store.acquire_slot("tenant", 1, first, "s", "HOLDER", at, BootInstant("b", 1000))
    stepped = add_milliseconds(at, 90_000)
    second = await start_id(store, clock, module_id=KEY[0], job=KEY[1], instance="second")
    taken = await store.acquire_slot(
        "tenant", 1, second, "s", "OTHER", stepped, BootInstant("b", 2000)
    )
    if not _one_host(store):
        assert taken, "Postgres: judged on the time given (no boot clock there)"
        return
    assert not taken, "a slot held on the boot clock looked free"
    # Letting go of another slot of the key cleans stale rows: not this one.
    await store.release_slot("tenant", second, "s", "OTHER", stepped, BootInstant("b", 2000))
    assert (await store.limit_usage(at)).slots == {"tenant": 1}
    # Its boot expiry reached too: the slot is free.
    after = BootInstant("b", 1000 + LEASE)
    assert await store.acquire_slot("tenant", 1, second, "s", "OTHER", stepped, after)


@ALL
async def test_a_lease_of_another_boot_falls_back_to_the_wall_clock(store: Any) -> None:
    run_id, at = await _leased(store, FakeClock())
    # A reboot: every holder of boot "b" is dead, and the wall rule judges.
    assert (
        await store.claim(_request(add_milliseconds(at, 1000), "EARLY", BootInstant("c", 5)))
        is None
    )
    taken = await store.claim(_request(add_milliseconds(at, LEASE), "NEXT", BootInstant("c", 5)))
    assert taken is not None
    assert taken.row.id == run_id


@pytest.mark.parametrize("backend", ["memory", "sqlite"], indirect=True)
async def test_boot_columns_left_beside_another_token_are_not_believed(
    store: Any, engine: AsyncEngine | None
) -> None:
    # Code that knows no boot clock (revision 0009's) took the run over and left the
    # old holder's boot columns behind: they name another token, so the wall rule holds.
    run_id, at = await _leased(store, FakeClock())
    if engine is None:
        store.runs[run_id] = dataclasses.replace(store.runs[run_id], lease_owner="OLD-CODE")
    else:
        async with engine.begin() as connection:
            where = job_runs.c.id == run_id
            await connection.execute(update(job_runs).where(where).values(lease_owner="OLD-CODE"))
    later = add_milliseconds(at, LEASE)
    taken = await store.claim(_request(later, "NEXT", BootInstant("b", 2000)))
    assert taken is not None
    assert taken.row.id == run_id


@ALL
async def test_renewals_and_releases_write_both_clocks(store: Any) -> None:
    run_id, at = await _leased(store, FakeClock())
    renewed = BootLease("b@HOLDER", 9000 + LEASE)
    expires_at = add_milliseconds(at, LEASE + 8000)
    assert await store.extend_lease(run_id, "HOLDER", expires_at, at, renewed)
    row = await row_of(store, run_id)
    assert row.next_attempt_at == expires_at
    wanted = (renewed.boot_id, renewed.expires_ms) if _one_host(store) else (None, None)
    assert (row.lease_boot_id, row.lease_boot_expires_ms) == wanted
    assert await jobrun.release_job_lease(store, run_id)
    row = await row_of(store, run_id)
    assert (row.lease_owner, row.lease_boot_id, row.lease_boot_expires_ms) == (None, None, None)


@pytest.mark.parametrize("backend", ["memory", "sqlite"], indirect=True)
async def test_a_driver_started_after_a_forward_step_takes_no_live_lease(store: Any) -> None:
    holder_clock = FakeClock(boot_id="b")
    run_id, bodies, registry, holding = await _hold(store, holder_clock)
    # Past a renewal: the lease, and the lease it renews, are on the boot clock.
    await _advance(holder_clock, LEASE_MS / 4000 + 0.1, store)
    assert (await row_of(store, run_id)).lease_boot_id is not None
    for _ in range(6):
        # A process started now, after the whole host stepped 90 s ahead: its first
        # reading is its only one, and no earlier basis tells it of the step.
        started = FakeClock(
            holder_clock.now() + timedelta(seconds=90),
            boot_id="b",
            boot_offset_s=holder_clock.monotonic(),
        )
        report = await jobrun.run_due_jobs(store, registry, clock=started, driver_name="fresh")
        assert report.attempted == 0, "a driver started after the step took a live lease"
        await _advance(holder_clock, LEASE_MS / 4000, store)
    assert bodies.overlaps == 0
    bodies.release.set()
    async with asyncio.timeout(30):  # bounds a hang only
        assert (await holding).completed == 1
    assert (await row_of(store, run_id)).status == "done"
