"""What holds and what is lost when jobrun's store goes through PgBouncer in transaction mode.

Not a speed benchmark: an on-demand check, run against a PgBouncer of its own
(``benchmarks/processes/pgbouncer.py``: Debian's ``pgbouncer``, an ini in a temporary
directory, ``pool_mode = transaction``, ``--port`` 6432 by default,
``--pool-size`` server connections per database). Each check runs on a fresh
database, directly and through PgBouncer, and prints one table row:

* **migrate**: ``jobrun.upgrade`` (Alembic through SQLAlchemy) on an empty database;
* **start, join, a pass**: a start, the same key again (joined), a pass of three steps;
* **prepared statements**: two engines, eight drivers, 24 runs of five steps, the
  server connections shared; with asyncpg's defaults and with
  ``statement_cache_size=0`` (and SQLAlchemy's ``prepared_statement_cache_size=0``
  with random statement names, see ``SAFE_CONNECT_ARGS``);
* **fencing**: a lease released by an operator in the middle of a pass: the
  pass's next step write is refused and the pass ends superseded;
* **NOTIFY wake-up**: ``run_worker`` idle for a while, then a start: how long
  until the run's first step (a NOTIFY within milliseconds; else the next poll);
* **kill -9 takeover**: a driver process killed inside a step body: how long
  until another driver takes the run over (at once with proof of death; at the
  lease's expiry otherwise), and whether its presence lock outlived it;
* **live holder taken for dead**: the session holding a live driver's presence
  lock ends (``pg_terminate_backend``; PgBouncer's ``RECONNECT``,
  ``server_lifetime`` or ``server_idle_timeout`` do the same): does the holder
  notice and stop, or do two step bodies of one run overlap;
* **limits**: ``concurrency_limit`` 2 and ``rate_limit`` 20/s across three
  drivers (``pg_advisory_xact_lock`` is transaction-scoped);
* **session settings**: whether the presence's ``SET`` commands stay behind on
  pooled server connections that other clients then use.

Through PgBouncer every engine uses ``SAFE_CONNECT_ARGS`` unless a row says
"asyncpg defaults". The table and the details go to the results file.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg
from sqlalchemy import make_url, text

import jobrun
from benchmarks import harness
from benchmarks.processes.pgbouncer import PgBouncer, Target, engine_for, stores
from benchmarks.scenarios._pgbouncer_takeovers import kill_takeover, live_holder

Check = Callable[[Target], Awaitable[tuple[bool, str]]]


async def check_migrate(target: Target) -> tuple[bool, str]:
    engine = engine_for(target)
    try:
        await jobrun.upgrade(engine)
        health = await jobrun.job_run_health(jobrun.SqlJobRunStore(engine))
        return True, f"at head, {health.running} running"
    finally:
        await engine.dispose()


async def check_start_and_pass(target: Target) -> tuple[bool, str]:
    registry = jobrun.JobRegistry()

    async def three_steps(p: jobrun.JobPass) -> jobrun.PassResult:
        for index in range(3):
            p.count("total", await p.step(f"s{index}", lambda index=index: index + 1))
        return jobrun.PassResult(done=True)

    registry.register("check", "pass", three_steps)
    async with stores(target) as [store]:
        first = await jobrun.start_job_run(store, module_id="check", job="pass", instance="k")
        again = await jobrun.start_job_run(store, module_id="check", job="pass", instance="k")
        report = await jobrun.run_due_jobs(store, registry, limit=1)
        done = await jobrun.get_job_run(store, first.id)
    joined = again.id == first.id
    ok = joined and done.status == "done" and done.counters.get("total") == 6
    return ok, f"joined: {joined}; {report.completed} pass done, counters {done.counters}"


async def check_named_statements(target: Target) -> tuple[bool, str]:
    """Four clients at once, 50 statements each: through SQLAlchemy (which prepares a
    named statement, then runs it) and through asyncpg's ``fetch`` (jobrun's path)."""
    errors = {"SQLAlchemy": [], "asyncpg fetch": []}

    async def through_sqlalchemy() -> None:
        engine = engine_for(target, isolation_level="AUTOCOMMIT")
        try:
            async with engine.connect() as connection:
                for number in range(50):
                    # Five texts, each run ten times: a statement cache is used again.
                    await connection.execute(text(f"SELECT {number % 5}"))
        except Exception as error:  # what the pooler does to the client is the finding
            errors["SQLAlchemy"].append(f"{type(error).__name__}: {error}".split("\n")[0])
        finally:
            await engine.dispose()

    async def through_fetch() -> None:
        arguments = {"statement_cache_size": 0} if target.safe else {}
        connection = await asyncpg.connect(harness.plain_url(target.url), **arguments)
        try:
            for number in range(50):
                try:
                    await connection.fetchval(f"SELECT {number % 5} + $1::int", 0)
                except Exception as error:  # as above
                    errors["asyncpg fetch"].append(f"{type(error).__name__}: {error}")
        finally:
            await connection.close()

    await asyncio.gather(*(through_sqlalchemy() for _ in range(4)))
    await asyncio.gather(*(through_fetch() for _ in range(4)))
    counts = ", ".join(
        f"{way}: {len(found)} of 4 clients failed"
        if way == "SQLAlchemy"
        else f"{way}: {len(found)} of 200 statements failed"
        for way, found in errors.items()
    )
    first = next((found[0] for found in errors.values() if found), "")
    return not any(errors.values()), counts + (f"; first: {first[:140]}" if first else "")


async def check_prepared_statements(target: Target) -> tuple[bool, str]:
    """Two engines (pool 4 each), eight drivers, 24 runs of five steps."""
    registry = jobrun.JobRegistry()

    async def five_steps(p: jobrun.JobPass) -> jobrun.PassResult:
        for index in range(5):
            await p.step(f"s{index}", lambda index=index: index)
        return jobrun.PassResult(done=True)

    registry.register("check", "stress", five_steps)
    errors: list[str] = []
    passes = 0
    async with stores(target, 2, pool_size=4, max_overflow=0) as pair:
        for number in range(24):
            await jobrun.start_job_run(
                pair[0], module_id="check", job="stress", instance=str(number)
            )

        async def driver(store: jobrun.SqlJobRunStore) -> None:
            nonlocal passes
            for _ in range(30):
                try:
                    report = await jobrun.run_due_jobs(store, registry, limit=1)
                except Exception as error:  # what the pooler did to the driver is the finding
                    errors.append(f"{type(error).__name__}: {error}")
                    continue
                passes += report.completed
                errors.extend(failure.error for failure in report.errors)

        await asyncio.gather(*(driver(pair[index % 2]) for index in range(8)))
        left = await jobrun.job_runs(pair[0], module_id="check", status="running")
    first = f"; first error: {errors[0][:160]}" if errors else ""
    return not errors and not left, f"{passes} of 24 runs done, {len(errors)} errors{first}"


async def check_fencing(target: Target) -> tuple[bool, str]:
    registry = jobrun.JobRegistry()
    inside, go_on = asyncio.Event(), asyncio.Event()

    async def released_midway(p: jobrun.JobPass) -> jobrun.PassResult:
        await p.step("before", lambda: 1)
        inside.set()
        await go_on.wait()
        await p.step("after", lambda: 2)
        return jobrun.PassResult(done=True)

    registry.register("check", "fence", released_midway)
    async with stores(target, 2) as (holder, operator):
        run = await jobrun.start_job_run(holder, module_id="check", job="fence")
        driving = asyncio.ensure_future(jobrun.run_due_jobs(holder, registry, limit=1))
        await inside.wait()
        await jobrun.release_job_lease(operator, run.id)
        go_on.set()
        report = await driving
        after = await jobrun.get_job_run(operator, run.id)
    ok = report.superseded == 1 and after.status == "running"
    return ok, f"superseded passes: {report.superseded}; run {after.status}, not committed"


async def check_wake_up(target: Target, idle_s: float = 5.0) -> tuple[bool, str]:
    """``run_worker`` (interval 4 s) idle ``idle_s``, then a start: seconds to its first step."""
    registry = jobrun.JobRegistry()
    stepped = asyncio.Event()

    async def one_step(p: jobrun.JobPass) -> jobrun.PassResult:
        await p.step("first", stepped.set)
        return jobrun.PassResult(done=True)

    registry.register("check", "wake", one_step)
    stop = asyncio.Event()
    async with stores(target, 2) as (worker_store, starter):
        working = asyncio.ensure_future(
            jobrun.run_worker([worker_store], registry, stop=stop, interval_s=4.0)
        )
        await asyncio.sleep(idle_s)  # idle long enough for the polls to back off to the interval
        started_at = asyncio.get_running_loop().time()
        await jobrun.start_job_run(starter, module_id="check", job="wake")
        await asyncio.wait_for(stepped.wait(), timeout=30)
        picked_s = asyncio.get_running_loop().time() - started_at
        stop.set()
        await working
    # A NOTIFY answers in milliseconds; a poll takes up to the interval.
    return picked_s < 0.5, f"first step {picked_s:.3f} s after the start"


async def check_limits(target: Target) -> tuple[bool, str]:
    """Three drivers; a concurrency limit of 2 and a rate of 20/s shared by all."""
    registry = jobrun.JobRegistry()
    registry.concurrency_limit("slot-", 2)
    registry.rate_limit("api", per_second=20, burst=1)
    slots = {"now": 0, "most": 0}
    rated: list[float] = []

    async def slotted(item: int) -> int:
        slots["now"] += 1
        slots["most"] = max(slots["most"], slots["now"])
        await asyncio.sleep(0.02)  # simulated work, so bodies overlap where allowed to
        slots["now"] -= 1
        return item

    def metered(item: int) -> int:
        rated.append(time.monotonic())
        return item

    async def limited(p: jobrun.JobPass) -> jobrun.PassResult:
        await p.map(slotted, range(8), name=lambda i: f"slot{i}", concurrency_limit="slot-x")
        await p.map(metered, range(10), name=lambda i: f"rate{i}", rate_limit="api")
        return jobrun.PassResult(done=True)

    registry.register("check", "limits", limited)
    errors: list[str] = []
    async with stores(target, 3) as trio:
        for number in range(3):
            await jobrun.start_job_run(
                trio[0], module_id="check", job="limits", instance=str(number)
            )
        await asyncio.gather(*(drive_retrying(store, registry, errors) for store in trio))
    rated.sort()
    rate = (len(rated) - 1) / (rated[-1] - rated[0]) if len(rated) == 30 else float("nan")
    # A token bucket of 20/s, burst 1: 30 takes span at least 29/20 s.
    ok = slots["most"] <= 2 and rate <= 20 * 1.05
    detail = f"at most {slots['most']} bodies at once under a limit of 2; "
    detail += f"{len(rated)} rate-limited bodies at {rate:.1f}/s under 20/s"
    if errors:
        detail += f" ({len(errors)} passes failed and were retried; first: {errors[0][:120]})"
    return ok, detail


async def drive_retrying(
    store: jobrun.SqlJobRunStore, registry: jobrun.JobRegistry, errors: list[str]
) -> None:
    """Drive until one pass completes, counting the failures on the way (so that a
    pooler's statement errors do not hide whether the limits held)."""
    for _ in range(20):
        try:
            report = await jobrun.run_due_jobs(store, registry, limit=1)
        except Exception as error:  # the pooler's doing: counted, and driven again
            errors.append(f"{type(error).__name__}: {error}")
            continue
        errors.extend(failure.error for failure in report.errors)
        if report.completed:
            return
        await asyncio.sleep(0.2)  # a failed pass backs off before it is due again


async def check_session_settings(target: Target, pool_size: int) -> tuple[bool, str]:
    """After a presence was opened, how many server connections carry its settings."""
    async with stores(target) as [store]:
        await store.presence()  # opens the presence session (SET tcp_keepalives_idle = 5, ...)
        clients = [
            await asyncpg.connect(harness.plain_url(target.url), statement_cache_size=0)
            for _ in range(pool_size)
        ]
        try:
            for client in clients:
                await client.execute("BEGIN")  # each holds a server connection of its own
            values = [await client.fetchval("SHOW tcp_keepalives_idle") for client in clients]
        finally:
            for client in clients:
                await client.close()
    carrying = sum(1 for value in values if value == "5")
    detail = f"{carrying} of {len(values)} server connections show tcp_keepalives_idle=5"
    return carrying == 0, detail


class Places:
    """Fresh databases (the run's throwaways), each reachable directly and through PgBouncer."""

    def __init__(self, databases: harness.Databases, bouncer: PgBouncer) -> None:
        self.databases = databases
        self.bouncer = bouncer

    async def target(self, place: str, safe: bool, migrated: bool = True) -> Target:
        direct = await self.databases.postgres_url()
        if migrated:
            # Migrated directly, so that a check fails for its own reason only.
            await check_migrate(Target(direct, False, direct))
        url = direct if place == "direct" else self.bouncer.url(str(make_url(direct).database))
        return Target(url, safe, direct)


VARIANTS = [("direct", False), ("PgBouncer", True), ("PgBouncer", False)]
HEADER = ["check", "direct", "PgBouncer (transaction mode)", "PgBouncer, asyncpg defaults"]


def checks(args: Any) -> list[tuple[str, Check, bool]]:
    """(row label, check, whether to run it with asyncpg's defaults through PgBouncer too)."""

    async def settings(target: Target) -> tuple[bool, str]:
        return await check_session_settings(target, args.pool_size)

    return [
        ("SQLAlchemy's named statements vs asyncpg fetch", check_named_statements, True),
        ("start, join, a pass", check_start_and_pass, True),
        ("prepared statements, shared server connections", check_prepared_statements, True),
        ("fencing", check_fencing, False),
        ("NOTIFY wake-up of an idle worker", check_wake_up, False),
        ("kill -9: another driver takes over", kill_takeover(args.lease_ms), False),
        ("live holder whose lock session ended", live_holder, False),
        ("rate and concurrency limits", check_limits, False),
        ("presence's SET commands", settings, False),
    ]


async def verdict(check: Check, target: Target) -> str:
    started = time.monotonic()
    try:
        ok, detail = await asyncio.wait_for(check(target), timeout=120)
    except Exception as error:  # a check that breaks on the pooler is a finding, not a crash
        ok, detail = False, f"{type(error).__name__}: {str(error)[:200]}"
    place = "direct" if target.url == target.direct else "PgBouncer"
    print(f"  {check.__name__} ({place}): {time.monotonic() - started:.1f} s", flush=True)
    return f"{'holds' if ok else 'LOST'}: {detail}"


async def all_rows(args: Any, places: Places) -> list[list[str]]:
    rows = [["migrate (jobrun.upgrade)"]]
    for place, safe in VARIANTS:
        target = await places.target(place, safe, migrated=False)
        rows[0].append(await verdict(check_migrate, target))
    print(" | ".join(rows[0]), flush=True)
    for label, check, with_defaults in checks(args):
        row = [label]
        for place, safe in VARIANTS if with_defaults else VARIANTS[:2]:
            row.append(await verdict(check, await places.target(place, safe)))
        rows.append(row + ["not run"] * (len(HEADER) - len(row)))
        print(" | ".join(rows[-1]), flush=True)
    return rows


async def scenario(args: Any) -> None:
    with PgBouncer(args.postgres_url, args.port, args.pool_size) as bouncer:
        rows = await all_rows(args, Places(args.databases, bouncer))
        log = bouncer.log().splitlines()
        version = bouncer.version()
    title = (
        f"jobrun through PgBouncer {version} (pool_mode=transaction, "
        f"default_pool_size={args.pool_size}), lease {args.lease_ms} ms where one is waited for"
    )
    harness.table(title, HEADER, rows)
    routine = ("client close request", "login attempt", "registered new auto-database", "stats:")
    noted = [line for line in log if not any(text in line for text in routine)]
    harness.save(args, {"rows": rows, "pgbouncer_log": noted[-400:]})


if __name__ == "__main__":
    harness.run(scenario, port=6432, pool_size=4, lease_ms=10000)
