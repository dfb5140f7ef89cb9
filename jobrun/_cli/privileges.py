"""Which of the grants an application role needs the connecting role lacks (Postgres).

The application role (the one workers and operators connect as, after an owner
ran the migrations) needs USAGE on the schema, SELECT, INSERT, UPDATE and
DELETE on the runs, the step ledger, the schedules table (a schedule removed
from a registry loses its row), the retention table and the two limit tables
(rate buckets, concurrency slots), the workers' table (revision 0007), the paused jobs'
and paused limit keys' tables (revision 0009), and SELECT on jobrun's
version table (every store reads it once to check the revision) and on its
compatibility record (revision 0006: read when the database is newer than the
code). SQLite has no grants.
"""

from __future__ import annotations

from sqlalchemy import bindparam, text
from sqlalchemy.ext.asyncio import AsyncEngine

from jobrun.sql.schema import (
    COMPAT_TABLE,
    VERSION_TABLE,
    concurrency_slots,
    job_pauses,
    job_retention,
    job_runs,
    job_schedules,
    job_steps,
    job_workers,
    limit_pauses,
    rate_buckets,
)

_DML = ("SELECT", "INSERT", "UPDATE", "DELETE")
NEEDED: dict[str, tuple[str, ...]] = {
    job_runs.name: _DML,
    job_steps.name: _DML,
    # Revision 0005: a schedule removed from its registry loses its row.
    job_schedules.name: _DML,
    job_retention.name: _DML,
    rate_buckets.name: _DML,
    concurrency_slots.name: _DML,
    # Revision 0007: each worker writes, refreshes and deletes its own row.
    job_workers.name: _DML,
    # Revision 0009: pausing and unpausing a job or a limit key writes and deletes them.
    job_pauses.name: _DML,
    limit_pauses.name: _DML,
    VERSION_TABLE: ("SELECT",),
    COMPAT_TABLE: ("SELECT",),
}
"""Each of jobrun's tables and the privileges an application role needs on it."""

# Looked up by oid, so that a missing USAGE on the schema does not hide the rest;
# without a schema, the tables the role's search_path finds.
_FOUND = text(
    """
    SELECT c.relname, c.oid, n.nspname, has_schema_privilege(n.oid, 'USAGE') AS usable
    FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
    WHERE c.relname IN :names AND c.relkind = 'r'
      AND CASE WHEN CAST(:schema AS text) IS NULL THEN pg_table_is_visible(c.oid)
               ELSE n.nspname = :schema END
    """
).bindparams(bindparam("names", expanding=True))


async def missing_privileges(engine: AsyncEngine, schema: str | None) -> list[str]:
    """One line per missing grant, each naming the GRANT statement that fixes it."""
    if engine.dialect.name != "postgresql":
        return []
    async with engine.connect() as connection:
        role = (await connection.execute(text("SELECT current_user"))).scalar_one()
        result = await connection.execute(_FOUND, {"names": list(NEEDED), "schema": schema})
        order = list(NEEDED)
        found = sorted(result.all(), key=lambda row: (row[2], order.index(row[0])))
        missing: list[str] = []
        schemas_told: set[str] = set()
        for name, oid, namespace, usable in found:
            if not usable and namespace not in schemas_told:
                schemas_told.add(namespace)
                missing.append(
                    f"USAGE on schema {namespace} for role {role} "
                    f'(GRANT USAGE ON SCHEMA "{namespace}" TO "{role}")'
                )
            for privilege in NEEDED[name]:
                granted = await connection.execute(
                    text("SELECT has_table_privilege(CAST(:oid AS oid), :privilege)"),
                    {"oid": oid, "privilege": privilege},
                )
                if not granted.scalar_one():
                    missing.append(
                        f"{privilege} on {namespace}.{name} for role {role} "
                        f'(GRANT {privilege} ON "{namespace}"."{name}" TO "{role}")'
                    )
    return missing
