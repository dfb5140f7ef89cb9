"""Running jobrun's Alembic revisions on a host's engine."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncEngine

from jobrun.sql.schema import VERSION_TABLE


def migrations_directory() -> Path:
    """Where the Alembic environment is: inside the wheel, or at the checkout's root."""
    packaged = Path(str(resources.files("jobrun"))) / "_migrations"
    if (packaged / "env.py").is_file():
        return packaged
    checkout = Path(__file__).resolve().parents[2] / "migrations"
    if (checkout / "env.py").is_file():
        return checkout
    raise FileNotFoundError("jobrun's migrations are missing from this installation")


def alembic_config(connection: Connection | None = None) -> Config:
    """An Alembic config for jobrun's revisions, optionally bound to a live connection."""
    config = Config()
    config.set_main_option("script_location", str(migrations_directory()))
    config.set_main_option("version_table", VERSION_TABLE)
    if connection is not None:
        config.attributes["connection"] = connection
    return config


def head_revision() -> str | None:
    return ScriptDirectory.from_config(alembic_config()).get_current_head()


def current_revision(connection: Connection) -> str | None:
    context = MigrationContext.configure(connection, opts={"version_table": VERSION_TABLE})
    return context.get_current_revision()


async def upgrade(engine: AsyncEngine, revision: str = "head") -> None:
    """Bring jobrun's tables on ``engine`` up to ``revision`` (default: the newest).

    Runs on one of the engine's own connections, in one transaction; only
    jobrun's tables and its version table are touched.
    """
    async with engine.begin() as connection:
        await connection.run_sync(lambda sync: command.upgrade(alembic_config(sync), revision))


async def downgrade(engine: AsyncEngine, revision: str = "base") -> None:
    """Take jobrun's tables back to ``revision`` (default: none at all)."""
    async with engine.begin() as connection:
        await connection.run_sync(lambda sync: command.downgrade(alembic_config(sync), revision))
