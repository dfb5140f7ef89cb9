"""The test tree itself: test modules are collected by basename (no packages under
``tests/``), so two files of one name in different groups stop the whole run at
collection. Checked here, where a new file's name clash shows as one failure."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def test_no_two_test_modules_share_a_name() -> None:
    names = Counter(path.name for path in TESTS.rglob("test_*.py"))
    shared = sorted(name for name, count in names.items() if count > 1)
    assert shared == [], f"rename one of each: {shared}"
