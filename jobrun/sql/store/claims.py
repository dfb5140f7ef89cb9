"""The claims facet of the SQL store: which runs a driver leases, in as few round trips
as can be (``JobRunStore.claim`` and ``claim_batch``; statements in
:mod:`jobrun.sql.statements.claims`).

Postgres takes up to k runs in one statement (``statements.claims.claim_batch``): the
candidate rows are locked ``FOR UPDATE SKIP LOCKED``, so a claimer never waits on
a row another claimer (or a holder's step write) holds, and the rows it writes are
the rows it read. The lists a claim carries per call (runs to pass over, dead
holders, the tokens) are array parameters, so the statement's text depends only
on the driver's jobs and the claim's kind, and asyncpg's prepared statement is
reused. Jobs under a ``max_concurrent`` limit first take their advisory locks,
in the same transaction, so two claimers count a limit one after the other.

SQLite has one writer at a time by design: a claim there reads the run the rules
choose, asks the core for its new state and writes it fenced on what it read
(``_choose_and_lease``), one run after another for a batch.
"""

from __future__ import annotations

import builtins
import hashlib
import json
from collections.abc import Sequence
from dataclasses import replace
from functools import partial
from typing import Any

from jobrun._core import (
    CLAIM_FIELDS,
    Claimed,
    ClaimRequest,
    PreviousHolder,
    RunRow,
    claim_transition,
    is_orphan,
)
from jobrun.sql.statements.claims import claim_batch, claim_read, claim_write
from jobrun.sql.statements.limits import limit_locks
from jobrun.sql.statements.runs import RUN_COLUMNS
from jobrun.sql.store.base import Fetch, SqlStoreBase, numbered, pairs

Limited = builtins.list[tuple[tuple[str, str], int]]
_WIDTH = len(RUN_COLUMNS)


def limit_lock_key(schema: str | None, module_id: str, job: str) -> int:
    """Postgres: the advisory lock (a signed 64-bit key) that orders one job's limited
    claims; per schema, so tenants never wait on each other."""
    digest = hashlib.blake2b(
        json.dumps(["jobrun.max_concurrent", schema, module_id, job]).encode("utf-8"),
        digest_size=8,
    ).digest()
    return int.from_bytes(digest, "big", signed=True)


class SqlClaims(SqlStoreBase):
    """The claim, for SQLite and Postgres; the leases it takes on the database's clock
    are remembered for their renewals (:mod:`jobrun.sql.store.leases`)."""

    async def claim(self, request: ClaimRequest) -> Claimed | None:
        claimed = await self.claim_batch(request, [request.token])
        return claimed[0] if claimed else None

    async def claim_batch(
        self, request: ClaimRequest, tokens: Sequence[str]
    ) -> builtins.list[Claimed]:
        if not request.expires_at or not tokens:
            return []
        if self._is_postgres:
            # Postgres judges leases on its own clock (or the caller's): no boot clock.
            request = replace(request, boot=None, boot_expires_ms={})
        # Postgres judges expiries on its own clock, at the statement.
        database_clock = self._is_postgres and request.database_clock
        async with self._operation("claim"):
            claimed = await self._claim_runs(request, tokens, database_clock)
        if database_clock:
            for taken in claimed:
                self._database_clock_leases.remember(taken.row.lease_owner or "")
        return claimed

    async def _claim_runs(
        self, request: ClaimRequest, tokens: Sequence[str], database_clock: bool
    ) -> builtins.list[Claimed]:
        """Up to ``len(tokens)`` runs, in claim order, the i-th leased under ``tokens[i]``."""
        limited = sorted(
            (key, most) for key, most in request.max_concurrent.items() if key in request.expires_at
        )
        fetch: Fetch = partial(self._executor.fetch, "claim")
        if not self._is_postgres:
            return await self._one_by_one(fetch, request, tokens, limited)
        if not limited:
            return await self._batch(fetch, request, tokens, limited, database_clock)
        # Always in the same (sorted) order, so two claimers cannot deadlock.
        keys = sorted(limit_lock_key(self._schema, *key) for key, _ in limited)
        locks = self._shapes.of(limit_locks, len(keys))
        async with self._executor.transaction("claim") as transaction:
            await transaction.fetch(locks, numbered("lock", keys))
            return await self._batch(transaction.fetch, request, tokens, limited, database_clock)

    async def _batch(
        self,
        fetch: Fetch,
        request: ClaimRequest,
        tokens: Sequence[str],
        limited: Limited,
        database_clock: bool,
    ) -> builtins.list[Claimed]:
        """Postgres: the whole batch in one statement (see ``statements.claims.claim_batch``)."""
        jobs = builtins.list(request.expires_at)
        versioned = _versioned(request)
        dead = sorted(request.dead_owners)
        shape = (len(jobs), len(limited), request.by_age, len(versioned), bool(dead))
        statement = self._shapes.of(claim_batch, *shape, database_clock)
        values: dict[str, Any] = {
            "now_at": request.now_at,
            "began_at": request.now_at,
            "driver": request.driver,
            "tokens": builtins.list(tokens),
            "skip_ids": sorted(request.skip_ids),
            "dead": dead,
        }
        if len(jobs) > 1:
            # The jobs again, as arrays: several jobs' due runs are read job by job.
            values["claim_modules"] = [module for module, _ in jobs]
            values["claim_jobs"] = [job for _, job in jobs]
        values |= pairs("", jobs) | numbered("expires", [request.expires_at[job] for job in jobs])
        values |= _versioned_values(versioned) | _limited_values(limited)
        rows = await fetch(statement, values)
        return [_claimed(row, request.dead_owners) for row in sorted(rows, key=_place)]

    async def _one_by_one(
        self, fetch: Fetch, request: ClaimRequest, tokens: Sequence[str], limited: Limited
    ) -> builtins.list[Claimed]:
        """SQLite: one run after another; each leased run is no longer due, so the
        next read passes over it, and the limits count it."""
        claimed: builtins.list[Claimed] = []
        for token in tokens:
            one = await self._choose_and_lease(fetch, replace(request, token=token), limited)
            if one is None:
                break
            claimed.append(one)
        return claimed

    async def _choose_and_lease(
        self, fetch: Fetch, request: ClaimRequest, limited: Limited
    ) -> Claimed | None:
        """Read the run the claim would get, let the core decide its new state, and
        write that fenced on what was read. A run that changed in between (or whose
        job reached its limit) is passed over and the next one read: each miss
        leaves one run fewer to read, so this ends."""
        missed: builtins.list[str] = []
        while True:
            read, values = self._claim_read(request, limited, missed)
            found = await fetch(read, values)
            if not found:
                return None
            row = RunRow(*found[0])
            claimed = claim_transition(row, request)
            write, values = self._claim_write(request, row, claimed.row)
            written = await fetch(write, values)
            if written:
                return Claimed(RunRow(*written[0]), claimed.previous)
            missed.append(row.id)

    def _claim_read(
        self, request: ClaimRequest, limited: Limited, missed: builtins.list[str]
    ) -> tuple[Any, dict[str, Any]]:
        jobs = builtins.list(request.expires_at)
        skipped = sorted(request.skip_ids) + missed
        dead = sorted(request.dead_owners)
        versioned = _versioned(request)
        boot = request.boot
        shape = (len(jobs), int(bool(skipped)), len(limited), len(dead), request.by_age)
        read = self._shapes.of(claim_read, *shape, len(versioned), boot is not None)
        values: dict[str, Any] = {"now_at": request.now_at}
        if boot is not None:
            values |= {"boot_id": boot.boot_id, "boot_ms": boot.ms}
        if skipped:
            values["skip_ids"] = json.dumps(skipped)
        values |= pairs("", jobs) | numbered("dead", dead)
        values |= _versioned_values(versioned) | _limited_values(limited)
        return read, values

    def _claim_write(
        self, request: ClaimRequest, row: RunRow, claimed: RunRow
    ) -> tuple[Any, dict[str, Any]]:
        job = (row.module_id, row.job)
        # Taking over a dead holder's unexpired lease adds no pass in flight.
        most = None if is_orphan(row, request) else request.max_concurrent.get(job)
        boot = request.boot if most is not None else None
        write = self._shapes.of(claim_write, most is not None, boot is not None)
        values: dict[str, Any] = {"fence_id": row.id, "now_at": request.now_at}
        if boot is not None:
            values |= {"boot_id": boot.boot_id, "boot_ms": boot.ms}
        for name in CLAIM_FIELDS:
            values[f"was_{name}"] = getattr(row, name)
            values[f"new_{name}"] = getattr(claimed, name)
        if most is not None:
            values |= {"check_module": row.module_id, "check_job": row.job, "check_most": most}
        return write, values


def _versioned(request: ClaimRequest) -> builtins.list[tuple[tuple[str, str], int]]:
    # Only jobs of a version above 1 are named: every other job's code is version 1.
    return sorted(
        (job, version)
        for job, version in request.versions.items()
        if version != 1 and job in request.expires_at
    )


def _versioned_values(versioned: builtins.list[tuple[tuple[str, str], int]]) -> dict[str, Any]:
    values = pairs("versioned_", [job for job, _ in versioned])
    return values | numbered("versioned_version", [version for _, version in versioned])


def _limited_values(limited: Limited) -> dict[str, Any]:
    return pairs("limited_", [key for key, _ in limited]) | numbered(
        "limited_most", [most for _, most in limited]
    )


def _place(row: Any) -> int:
    return int(row[_WIDTH])


def _claimed(row: Any, dead_owners: frozenset[str]) -> Claimed:
    """A row of ``claim_batch``: the run as written, then its place and its previous holder."""
    run = RunRow(*row[:_WIDTH])
    owner, driver, began_at, ledger_empty = row[_WIDTH + 1 : _WIDTH + 5]
    if owner is None:
        return Claimed(run, ledger_empty=bool(ledger_empty))
    return Claimed(run, PreviousHolder(owner, driver, began_at, died=owner in dead_owners))
