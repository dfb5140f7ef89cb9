"""jobrun's migrations inside a host's own Alembic environment.

A host with its own ``env.py`` calls :func:`migrate_on_connection` with the
connection its migrations run on (after its own ``context.run_migrations()``,
inside the same transaction), and passes :func:`skip_jobrun_tables` as its
``include_object`` so that its autogenerate neither drops nor alters jobrun's
tables. jobrun's revisions keep their own history in ``jobrun_alembic_version``;
the host's ``alembic_version`` is never read or written by them.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType

from sqlalchemy import text
from sqlalchemy.engine import Connection

from jobrun.sql.migrate import _POSTGRES_MIGRATION_LOCK, alembic_config
from jobrun.sql.schema import COMPAT_TABLE, VERSION_TABLE, metadata
from jobrun.sql.tenancy import checked_schema


@contextmanager
def _host_proxies_kept() -> Iterator[None]:
    """Alembic keeps the running environment in ``alembic.context`` and ``alembic.op``;
    a nested run replaces and then removes them. Put the host's back afterwards."""
    import alembic.context
    import alembic.op

    modules: tuple[ModuleType, ...] = (alembic.context, alembic.op)
    saved = [getattr(module, "_proxy", None) for module in modules]
    try:
        yield
    finally:
        for proxy in saved:
            if proxy is not None:
                proxy._install_proxy()


@contextmanager
def _search_path(connection: Connection, schema: str | None) -> Iterator[None]:
    """With a schema: the schema (created if missing) as the only search path, then
    the host's search path back for the rest of its transaction."""
    if schema is None:
        yield
        return
    found = connection.execute(
        text("SELECT 1 FROM pg_namespace WHERE nspname = :name"), {"name": schema}
    ).first()
    if found is None:
        connection.exec_driver_sql(f'CREATE SCHEMA "{schema}"')
    previous = connection.execute(text("SELECT current_setting('search_path')")).scalar_one()
    connection.exec_driver_sql(f'SET LOCAL search_path TO "{schema}"')
    try:
        yield
    finally:
        connection.execute(
            text("SELECT set_config('search_path', :path, true)"), {"path": previous}
        )


def migrate_on_connection(
    connection: Connection, revision: str = "head", *, schema: str | None = None
) -> None:
    """Bring jobrun's tables up to ``revision`` on a host's synchronous connection.

    Meant for a host's Alembic ``env.py``: runs in the transaction the host has
    open (nothing is committed here) and leaves the host's Alembic context as it
    was. On Postgres it waits for any other jobrun migration of the database
    first; ``schema`` puts jobrun's tables in a tenant's schema.
    """
    schema = checked_schema(connection, schema)
    if connection.dialect.name == "postgresql":
        connection.execute(
            text("SELECT pg_advisory_xact_lock(:key)"), {"key": _POSTGRES_MIGRATION_LOCK}
        )
    with _host_proxies_kept(), _search_path(connection, schema):
        # Imported here, so that `import jobrun` does not import Alembic.
        from alembic import command

        command.upgrade(alembic_config(connection, schema), revision)


# jobrun's tables outside its metadata: Alembic's version table, and (revision 0006)
# the oldest code revision the schema accepts.
_BOOKKEEPING = (VERSION_TABLE, COMPAT_TABLE)


def skip_jobrun_tables(
    obj: object, name: str | None, type_: str, reflected: bool, compare_to: object
) -> bool:
    """An ``include_object`` for a host's autogenerate: everything but jobrun's tables
    (and their indexes and columns), jobrun's version table and its compatibility
    record."""
    if type_ == "table":
        return name not in metadata.tables and name not in _BOOKKEEPING
    table = getattr(obj, "table", None)
    table_name = getattr(table, "name", None)
    return table_name not in metadata.tables and table_name not in _BOOKKEEPING
