"""Provision jobrun's tables in many scope databases: one SQLite file per tenant,
and a shared Postgres database through the Alembic command line.

    python examples/provision.py --sqlite-dir scopes --count 50
    python examples/provision.py --postgres-url postgresql+asyncpg://app@db/app

SQLite files are created by ``jobrun.upgrade(engine)``, which is safe to run again
(a database already at the newest revision is left as it is) and safe to run from
many processes at once. Postgres goes through ``alembic upgrade head`` with the
``alembic.ini`` at the root of a jobrun checkout, the way a deploy script would;
``jobrun db upgrade --url URL`` does the same from an installed jobrun. Every
database is then opened with ``SqlJobRunStore`` and read once, which fails with
``SchemaOutdatedError`` if it is not at the newest revision.
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
from pathlib import Path

from sqlalchemy.ext.asyncio import create_async_engine

import jobrun

ALEMBIC_INI = Path(__file__).resolve().parents[1] / "alembic.ini"


async def provision_sqlite(path: Path) -> None:
    engine = create_async_engine(f"sqlite+aiosqlite:///{path}")
    try:
        await jobrun.upgrade(engine)
    finally:
        await engine.dispose()


def provision_with_alembic(url: str) -> None:
    """``alembic -c alembic.ini -x url=URL upgrade head``, as an operator types it."""
    command = [sys.executable, "-m", "alembic", "-c", str(ALEMBIC_INI)]
    subprocess.run([*command, "-x", f"url={url}", "upgrade", "head"], check=True)


async def check(url: str) -> None:
    """Read the database once through jobrun: proof that it is ready to use."""
    engine = create_async_engine(url)
    try:
        await jobrun.job_run_health(jobrun.SqlJobRunStore(engine))
    finally:
        await engine.dispose()


async def main(sqlite_dir: Path | None, count: int, postgres_url: str | None) -> None:
    urls = []
    if sqlite_dir is not None:
        await asyncio.to_thread(sqlite_dir.mkdir, parents=True, exist_ok=True)
        paths = [sqlite_dir / f"scope-{number:03d}.db" for number in range(count)]
        # One file at a time: Alembic migrates one database per process at a time anyway.
        for path in paths:
            await provision_sqlite(path)
        urls += [f"sqlite+aiosqlite:///{path}" for path in paths]
        print(f"upgraded {len(paths)} SQLite scope databases in {sqlite_dir}")
    if postgres_url is not None:
        await asyncio.to_thread(provision_with_alembic, postgres_url)
        urls.append(postgres_url)
        print("upgraded the Postgres database with alembic")
    for url in urls:
        await check(url)
    print(f"checked {len(urls)}: every one is at jobrun's newest revision")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sqlite-dir", type=Path, help="directory for the SQLite files")
    parser.add_argument("--count", type=int, default=50, help="SQLite files (default: 50)")
    parser.add_argument("--postgres-url", help="a Postgres database to upgrade with alembic")
    options = parser.parse_args()
    if options.sqlite_dir is None and options.postgres_url is None:
        parser.error("give --sqlite-dir, --postgres-url, or both")
    asyncio.run(main(options.sqlite_dir, options.count, options.postgres_url))
