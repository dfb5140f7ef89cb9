"""Fixtures for the tests that run processes (the shared ones are in ``tests/conftest.py``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import Fleet


@pytest.fixture
def fleet(database_url: str, tmp_path: Path) -> Iterator[Fleet]:
    created = Fleet(database_url, tmp_path)
    try:
        yield created
    finally:
        created.stop_all()
