"""The limits facet of the SQL store: rate-limit buckets and concurrency slots (the
core's ``limits`` wing), with their statements in :mod:`jobrun.sql.statements.limits`.

Round trips: a token is one statement on both engines (an upsert that refills on
the database's clock and takes, returning what is left). A slot is one statement
on SQLite (one writer at a time makes the count and the insert one decision); on
Postgres a transaction of four round trips (``BEGIN``, the key's advisory lock,
the counted insert, ``COMMIT``), so that two takers cannot both count one below
the limit under READ COMMITTED. Letting go of a slot is one statement on both.
Cooling a limit down (a 429 for everyone) is one statement on both, paid only
when an API refused.
"""

from __future__ import annotations

import hashlib
import json
import math

from jobrun._core import (
    MILLI,
    BootInstant,
    LimitUsage,
    bucket_cap_milli,
    bucket_state,
    wait_for_token_s,
)
from jobrun.sql.statements.limits import (
    acquire_slot_statement,
    buckets_statement,
    cool_limit_statement,
    give_back_token_statement,
    limit_locks,
    release_slot_statement,
    slots_held_statement,
    take_token_statement,
)
from jobrun.sql.store.base import SqlStoreBase


def slot_lock_key(schema: str | None, key: str) -> int:
    """Postgres: the advisory lock (a signed 64-bit key) that orders one concurrency
    key's takers; per schema, so tenants never wait on each other."""
    digest = hashlib.blake2b(
        json.dumps(["jobrun.concurrency_limit", schema, key]).encode("utf-8"), digest_size=8
    ).digest()
    return int.from_bytes(digest, "big", signed=True)


class SqlLimits(SqlStoreBase):
    """The limit operations of ``SqlJobRunStore``: the pass engine's (tokens and slots)
    and the operator's (cooling a limit down, the limits' usage)."""

    async def take_token(self, key: str, per_second: float, burst: int) -> float:
        values = {
            "bucket_key": key,
            "bucket_per_second": repr(float(per_second)),
            "bucket_burst": burst,
            "bucket_first_milli": bucket_cap_milli(burst) - MILLI,
            "bucket_rate": float(per_second),
            "bucket_burst_milli": bucket_cap_milli(burst),
        }
        statement = self._shapes.of(take_token_statement, self._is_postgres)
        async with self._operation("take_token"):
            found = await self._executor.fetch("take_token", statement, values)
        tokens, ahead_ms, paused = found[0]
        if paused:
            return math.inf  # revision 0009: no token comes until the key is unpaused
        return wait_for_token_s(int(tokens), per_second) + float(ahead_ms) / 1000

    async def give_back_token(self, key: str, burst: int) -> None:
        statement = self._shapes.of(give_back_token_statement, self._is_postgres)
        values = {"bucket_key": key, "bucket_burst_milli": bucket_cap_milli(burst)}
        async with self._operation("give_back_token"):
            await self._executor.fetch("give_back_token", statement, values)

    async def acquire_slot(
        self,
        key: str,
        most: int,
        run_id: str,
        step: str,
        token: str,
        now_at: str,
        boot: BootInstant | None = None,
    ) -> bool:
        values: dict[str, object] = {
            "slot_key": key,
            "slot_most": most,
            "slot_run_id": run_id,
            "slot_step": step,
            "slot_token": token,
            "now_at": now_at,
        }
        shape = self._slot_clock(token, boot, values)
        statement = self._shapes.of(acquire_slot_statement, self._is_postgres, *shape)
        async with self._operation("acquire_slot"):
            if not self._is_postgres:
                return bool(await self._executor.fetch("acquire_slot", statement, values))
            lock = self._shapes.of(limit_locks, 1)
            async with self._executor.transaction("acquire_slot") as transaction:
                await transaction.fetch(lock, {"lock_0": slot_lock_key(self._schema, key)})
                return bool(await transaction.fetch(statement, values))

    async def release_slot(
        self,
        key: str,
        run_id: str,
        step: str,
        token: str,
        now_at: str,
        boot: BootInstant | None = None,
    ) -> None:
        values: dict[str, object] = {
            "slot_key": key,
            "slot_step": step,
            "slot_token": token,
            "now_at": now_at,
        }
        del run_id  # the token and step name the row; the run is its lease's
        statement = self._shapes.of(release_slot_statement, *self._slot_clock(token, boot, values))
        async with self._operation("release_slot"):
            await self._executor.fetch("release_slot", statement, values)

    def _slot_clock(
        self, token: str, boot: BootInstant | None, values: dict[str, object]
    ) -> tuple[bool, bool]:
        """How a slot's lease is judged: (on the boot clock too, on the database's
        clock). Postgres: on its own clock when the taker's lease was written there
        (a driver on real time), as its renewals are; SQLite: with the taker's boot
        clock, its parameters added to ``values``."""
        if self._is_postgres:
            return False, token in self._database_clock_leases
        if boot is None:
            return False, False
        values |= {"boot_id": boot.boot_id, "boot_ms": boot.ms}
        return True, False

    async def cool_limit(
        self, key: str, per_second: float, burst: int, seconds: float, reason: str
    ) -> None:
        values: dict[str, object] = {
            "bucket_key": key,
            "bucket_per_second": repr(float(per_second)),
            "bucket_burst": burst,
            "cooling_reason": reason,
        }
        if self._is_postgres:
            values["later_s"] = float(seconds)
        else:
            values["later_modifier"] = f"+{float(seconds):.3f} seconds"
        statement = self._shapes.of(cool_limit_statement, self._is_postgres)
        async with self._operation("cool_limit"):
            await self._executor.fetch("cool_limit", statement, values)

    async def limit_usage(self, now_at: str) -> LimitUsage:
        buckets_read = self._shapes.of(buckets_statement, self._is_postgres)
        slots_read = self._shapes.of(slots_held_statement)
        async with self._operation("limit_usage"):
            buckets = await self._executor.fetch("limit_usage", buckets_read, {})
            slots = await self._executor.fetch("limit_usage", slots_read, {"now_at": now_at})
        return LimitUsage(
            tuple(
                bucket_state(key, float(rate), int(burst), int(tokens), float(since_ms), until, why)
                for key, rate, burst, tokens, since_ms, until, why in buckets
            ),
            {key: int(count) for key, count in slots},
        )
