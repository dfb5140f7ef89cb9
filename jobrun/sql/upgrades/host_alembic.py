"""jobrun's migrations inside a host's own Alembic environment.

A host with its own ``env.py`` calls :func:`migrate_on_connection` with the
connection its migrations run on (after its own ``context.run_migrations()``,
inside the same transaction), and passes :func:`skip_jobrun_tables` as its
``include_object`` so that its autogenerate neither drops nor alters jobrun's
tables. jobrun's revisions keep their own history in ``jobrun_alembic_version``;
the host's ``alembic_version`` is never read or written by them.

Only the host's ``alembic upgrade`` migrates jobrun's tables: ``current``,
``check``, ``revision --autogenerate``, ``stamp``, ``downgrade`` and the others
run the host's ``env.py`` too, and there jobrun writes nothing. Under ``alembic
upgrade --sql`` jobrun's statements are written into the host's SQL output, in
revision order, from the revision the database is at.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from types import ModuleType
from typing import TextIO

from sqlalchemy import text
from sqlalchemy.engine import Connection

from jobrun._core import refuse
from jobrun.sql.postgres.tenancy import checked_schema
from jobrun.sql.schema import COMPAT_TABLE, VERSION_TABLE, metadata
from jobrun.sql.upgrades.migrate import _POSTGRES_MIGRATION_LOCK, alembic_config, current_revision


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


@dataclass(frozen=True, slots=True)
class _HostCommand:
    """What the host's Alembic command does, as far as jobrun's tables are concerned."""

    migrates: bool
    output: TextIO | None = None  # where an ``--sql`` upgrade writes its SQL


def _host_command() -> _HostCommand:
    """Read from the host's running Alembic environment: only ``upgrade`` migrates.

    Each Alembic command runs ``env.py`` with its own migration function (``current``
    shows the version, ``revision --autogenerate`` compares, ``stamp`` writes the
    host's version only); ``upgrade``'s is named so. Called outside any Alembic
    command (the host's own code), it migrates, as it always did.
    """
    import alembic.context

    environment = getattr(alembic.context, "_proxy", None)
    if environment is None:
        return _HostCommand(migrates=True)
    options = environment.context_opts
    migrates = getattr(options.get("fn"), "__name__", None) == "upgrade"
    if not (migrates and options.get("as_sql")):
        return _HostCommand(migrates=migrates)
    return _HostCommand(migrates=True, output=environment.get_context().output_buffer)


def migrate_on_connection(
    connection: Connection, revision: str = "head", *, schema: str | None = None
) -> None:
    """Bring jobrun's tables up to ``revision`` on a host's synchronous connection.

    Meant for a host's Alembic ``env.py``: runs in the transaction the host has
    open (nothing is committed here) and leaves the host's Alembic context as it
    was. On Postgres it waits for any other jobrun migration of the database
    first; ``schema`` puts jobrun's tables in a tenant's schema.

    Only under the host's ``alembic upgrade`` (or outside any Alembic command):
    the host's read-only commands (``current``, ``check``, ``revision
    --autogenerate``, ``history``), ``stamp`` and ``downgrade`` leave jobrun's
    tables as they are. Under ``alembic upgrade --sql`` jobrun's statements from
    the revision the database is at are added to the host's output, none run.
    """
    schema = checked_schema(connection, schema)
    host = _host_command()
    if not host.migrates:
        return
    if host.output is not None:
        _write_sql(connection, revision, schema, host.output)
        return
    if connection.dialect.name == "postgresql":
        connection.execute(
            text("SELECT pg_advisory_xact_lock(:key)"), {"key": _POSTGRES_MIGRATION_LOCK}
        )
    with _host_proxies_kept(), _search_path(connection, schema):
        # Imported here, so that `import jobrun` does not import Alembic.
        from alembic import command

        command.upgrade(alembic_config(connection, schema), revision)


def _write_sql(connection: Connection, revision: str, schema: str | None, output: TextIO) -> None:
    """jobrun's upgrade as SQL text into the host's ``--sql`` output (only reads run)."""
    if schema is not None:
        raise refuse(
            "schema",
            "cannot be given to an offline (--sql) upgrade",
            message="an offline (--sql) upgrade cannot put jobrun's tables in a schema: "
            "run the upgrade online, or without schema=",
        )
    start = current_revision(connection)
    with _host_proxies_kept():
        from alembic import command

        config = alembic_config(connection, None)
        config.output_buffer = output
        # The statements join the host's transaction block: no BEGIN/COMMIT of their own.
        config.attributes["offline"] = True
        command.upgrade(config, revision if start is None else f"{start}:{revision}", sql=True)


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
