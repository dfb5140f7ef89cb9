"""Fixtures for the migration tests (the shared ones are in ``tests/conftest.py``)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine


@pytest.fixture
async def blank(blank_url: str) -> AsyncIterator[AsyncEngine]:
    """An engine on an empty database (no schema) of the indirect ``blank_url`` backend."""
    engine = create_async_engine(blank_url)
    try:
        yield engine
    finally:
        await engine.dispose()
