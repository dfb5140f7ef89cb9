"""Every revision, up and down, on a database that holds rows: one test for all of them.

A new revision needs no new test file here: the walk reads the revision chain
from the migrations, and at each revision writes one row into every jobrun
table with a value for each column the table has then. After each step up or
down, every row written so far must still be there with the values of the
columns that still exist. At head, the tables must match the metadata (what
``jobrun db check`` compares) on both dialects. What a revision means for the
rows (e.g. 0002's lease columns start empty) is tested next to the feature.
"""

from __future__ import annotations

from typing import Any

import pytest
from alembic.script import ScriptDirectory
from sqlalchemy import Integer, MetaData, Table, insert, inspect, select
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncEngine

import jobrun
from jobrun._cli.schema_check import check
from jobrun.sql.schema import COMPAT_TABLE, SCHEMA_REVISION, VERSION_TABLE, metadata
from jobrun.sql.upgrades.migrate import alembic_config, downgrade
from tests.support import SQL_BACKENDS, revision_of

JOBRUN_TABLES = sorted(metadata.tables)


def chain() -> list[str]:
    """The revisions from the first to the head."""
    scripts = ScriptDirectory.from_config(alembic_config())
    return [script.revision for script in scripts.walk_revisions()][::-1]


def _reflect(connection: Connection) -> dict[str, Table]:
    found = MetaData()
    names = set(inspect(connection).get_table_names())
    found.reflect(connection, only=[name for name in JOBRUN_TABLES if name in names])
    return dict(found.tables)


def _row_for(table: Table, revision: str) -> dict[str, Any]:
    """A value in every column: text that names the revision, or a number from it."""
    return {
        column.name: int(revision)
        if isinstance(column.type, Integer)
        else f"{column.name}@{revision}"
        for column in table.columns
    }


async def _write_rows(engine: AsyncEngine, revision: str) -> dict[str, dict[str, Any]]:
    async with engine.begin() as connection:
        tables = await connection.run_sync(_reflect)
        written = {name: _row_for(table, revision) for name, table in tables.items()}
        for name, row in written.items():
            await connection.execute(insert(tables[name]).values(row))
    return written


async def _stored(engine: AsyncEngine) -> dict[str, list[dict[str, Any]]]:
    async with engine.connect() as connection:
        tables = await connection.run_sync(_reflect)
        stored = {}
        for name, table in tables.items():
            rows = await connection.execute(select(table).order_by(*table.primary_key.columns))
            stored[name] = [dict(row) for row in rows.mappings()]
        return stored


def _assert_kept(written: list[dict[str, dict[str, Any]]], stored: dict[str, list[dict]]) -> None:
    """Each row written so far is stored, with its value in every column still there."""
    for rows in written:
        for table, row in rows.items():
            if table not in stored:
                continue  # the table itself went away (below its first revision)
            matches = [
                found
                for found in stored[table]
                if all(found[name] == value for name, value in row.items() if name in found)
            ]
            assert len(matches) == 1, (table, row, stored[table])


def test_the_chain_is_linear_and_ends_at_the_schema_revision() -> None:
    revisions = chain()
    assert revisions[-1] == SCHEMA_REVISION
    assert revisions == sorted(revisions)  # zero-padded numbers, one after another
    assert len(set(revisions)) == len(revisions)


# SQLite cannot reflect the claim's expression index; the rows are what this test reads.
@pytest.mark.filterwarnings(
    "ignore:Skipped unsupported reflection of expression-based index:sqlalchemy.exc.SAWarning"
)
@pytest.mark.parametrize("blank_url", SQL_BACKENDS, indirect=True)
async def test_every_revision_up_and_down_keeps_the_rows(blank: AsyncEngine) -> None:
    written: list[dict[str, dict[str, Any]]] = []
    for revision in chain():
        await jobrun.upgrade(blank, revision)
        assert await revision_of(blank) == revision
        _assert_kept(written, await _stored(blank))
        written.append(await _write_rows(blank, revision))
    state = await check(blank)
    assert (state.current, state.differences) == (SCHEMA_REVISION, [])
    stored = await _stored(blank)
    # One row per revision since the table first appeared.
    assert {name: len(rows) for name, rows in stored.items()} == {
        name: sum(name in rows for rows in written) for name in JOBRUN_TABLES
    }

    below = [None, *chain()[:-1]]
    for revision in reversed(below):
        await downgrade(blank, revision or "base")
        assert await revision_of(blank) == revision
        _assert_kept(written, await _stored(blank))
    assert set(await _stored(blank)) == set()

    # And up again to head: the same tables as the metadata, the version table kept.
    await jobrun.upgrade(blank)
    state = await check(blank)
    assert (state.current, state.differences) == (SCHEMA_REVISION, [])
    async with blank.connect() as connection:
        names = await connection.run_sync(lambda sync: set(inspect(sync).get_table_names()))
    assert names == set(JOBRUN_TABLES) | {VERSION_TABLE, COMPAT_TABLE}
