"""Which asyncio driver a database URL that names only its kind gets."""

from __future__ import annotations

from sqlalchemy import URL, make_url

ASYNCIO_DRIVERS = {
    "sqlite": "sqlite+aiosqlite",
    "postgresql": "postgresql+asyncpg",
    "postgres": "postgresql+asyncpg",
}
"""``sqlite://`` and ``postgresql://`` mean jobrun's drivers, wherever a URL is typed."""


def with_asyncio_driver(url: str | URL) -> URL:
    """``url`` parsed, with jobrun's asyncio driver if it named only the database kind."""
    parsed = make_url(url)
    return parsed.set(drivername=ASYNCIO_DRIVERS.get(parsed.drivername, parsed.drivername))
