"""Provision jobrun's tables in many scope databases: one SQLite file per tenant,
and a Postgres database (or one tenant schema in it) through plain Alembic.

    python examples/provision.py --sqlite-dir scopes --count 50
    python examples/provision.py --postgres-url postgresql+asyncpg://app@db/app
    python examples/provision.py --postgres-url postgresql://app@db/app --schema tenant_a

SQLite files go through ``jobrun.upgrade_many(urls, concurrency=8)``, which creates
missing files, upgrades eight at a time and returns one ``UpgradeResult`` per URL
instead of raising for one bad database (``jobrun db upgrade --urls-file FILE`` is
the same from a shell). Postgres goes through ``alembic upgrade head`` with the ini
that ``jobrun db alembic-ini`` prints, run from a directory of its own, the way a
deploy script would. Every database is then opened with ``SqlJobRunStore`` and read
once, which fails with ``SchemaOutdatedError`` if it is not at the newest revision.
Running it again is harmless: a database at the newest revision is left as it is.
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import tempfile
from pathlib import Path

from sqlalchemy.ext.asyncio import create_async_engine

import jobrun


async def provision_sqlite(paths: list[Path]) -> list[str]:
    urls = [f"sqlite+aiosqlite:///{path}" for path in paths]
    results = await jobrun.upgrade_many(urls, concurrency=8)
    failed = [result for result in results if result.error is not None]
    for result in failed:
        print(f"{result.url}: failed: {result.error}")
    upgraded = sum(
        1 for result in results if result.error is None and result.before != result.after
    )
    print(f"{len(results)} SQLite databases: {upgraded} upgraded, {len(failed)} failed")
    if failed:
        raise SystemExit(1)
    return urls


def provision_with_alembic(url: str, schema: str | None) -> None:
    """``jobrun db alembic-ini`` once, then ``alembic upgrade head`` as an operator types it."""
    jobrun_command = [sys.executable, "-m", "jobrun", "db", "alembic-ini"]
    ini = subprocess.run(jobrun_command, check=True, capture_output=True, text=True).stdout
    with tempfile.TemporaryDirectory() as directory:  # any directory: the ini is absolute
        Path(directory, "jobrun-alembic.ini").write_text(ini)
        alembic = [sys.executable, "-m", "alembic", "-c", "jobrun-alembic.ini", "-x", f"url={url}"]
        alembic += ["-x", f"schema={schema}"] if schema else []
        subprocess.run([*alembic, "upgrade", "head"], check=True, cwd=directory)
        current = subprocess.run(
            [*alembic, "current"], check=True, cwd=directory, capture_output=True, text=True
        )
    print(
        f"alembic upgraded the Postgres database (schema {schema or 'default'}): {current.stdout}"
    )


async def check(url: str, schema: str | None = None) -> None:
    """Read the database once through jobrun: proof that it is ready to use."""
    engine = create_async_engine(url.replace("postgresql://", "postgresql+asyncpg://", 1))
    try:
        await jobrun.job_run_health(jobrun.SqlJobRunStore(engine, schema=schema))
    finally:
        await engine.dispose()


async def main(
    sqlite_dir: Path | None, count: int, postgres_url: str | None, schema: str | None
) -> None:
    checked = 0
    if sqlite_dir is not None:
        await asyncio.to_thread(sqlite_dir.mkdir, parents=True, exist_ok=True)
        urls = await provision_sqlite(
            [sqlite_dir / f"scope-{number:03d}.db" for number in range(count)]
        )
        for url in urls:
            await check(url)
        checked += len(urls)
    if postgres_url is not None:
        await asyncio.to_thread(provision_with_alembic, postgres_url, schema)
        await check(postgres_url, schema)
        checked += 1
    print(f"checked {checked}: every one is at jobrun's newest revision")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sqlite-dir", type=Path, help="directory for the SQLite files")
    parser.add_argument("--count", type=int, default=50, help="SQLite files (default: 50)")
    parser.add_argument("--postgres-url", help="a Postgres database to upgrade with alembic")
    parser.add_argument("--schema", help="Postgres: the tenant schema to put jobrun's tables in")
    options = parser.parse_args()
    if options.sqlite_dir is None and options.postgres_url is None:
        parser.error("give --sqlite-dir, --postgres-url, or both")
    asyncio.run(main(options.sqlite_dir, options.count, options.postgres_url, options.schema))
