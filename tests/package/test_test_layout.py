"""The test tree itself.

Test modules are collected by basename (no packages under ``tests/``), so two files
of one name in different groups stop the whole run at collection: checked here,
where a new file's name clash shows as one failure.

``tests/unit/`` mirrors ``jobrun/``: ``tests/unit/<folders>/test_<module>.py`` tests
``jobrun/<folders>/<module>.py``, the core's wings standing for ``jobrun/_core/<wing>/``
(``tests/unit/leases/test_renewal.py`` tests ``jobrun/_core/leases/renewal.py``). A
module that moves takes its test module along; this check says where to.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from tests.support import REPO

TESTS = REPO / "tests"
UNIT = TESTS / "unit"
PACKAGE = REPO / "jobrun"


def test_no_two_test_modules_share_a_name() -> None:
    names = Counter(path.name for path in TESTS.rglob("test_*.py"))
    shared = sorted(name for name, count in names.items() if count > 1)
    assert shared == [], f"rename one of each: {shared}"


def mirrored(module: Path) -> Path:
    """Where the unit tests of ``module`` (a file under ``jobrun/``) live."""
    parts = module.relative_to(PACKAGE).with_suffix("").parts
    if parts[-1] == "__init__":
        parts = parts[:-1]
    if parts[:1] == ("_core",) and len(parts) > 1:
        parts = parts[1:]
    return UNIT.joinpath(*parts[:-1], f"test_{parts[-1]}.py")


def test_every_unit_test_module_mirrors_a_module_of_jobrun() -> None:
    modules = [module for module in PACKAGE.rglob("*.py") if module != PACKAGE / "__init__.py"]
    homes = {mirrored(module): module for module in modules}
    astray: dict[str, list[str] | str] = {}
    for test in sorted(UNIT.rglob("test_*.py")):
        if test not in homes:
            namesakes = [module for home, module in homes.items() if home.name == test.name]
            astray[str(test.relative_to(REPO))] = [
                f"{module.relative_to(REPO)} is tested in {mirrored(module).relative_to(REPO)}"
                for module in namesakes
            ] or "no module of that name"
    assert astray == {}, f"move each test module where its module is mirrored: {astray}"


def test_the_mirror_reads_the_core_s_wings_and_the_package_s_rooms() -> None:
    assert mirrored(PACKAGE / "_core/leases/renewal.py") == UNIT / "leases/test_renewal.py"
    assert mirrored(PACKAGE / "_core/port.py") == UNIT / "test_port.py"
    assert mirrored(PACKAGE / "errors.py") == UNIT / "test_errors.py"
    assert mirrored(PACKAGE / "sql/postgres/presence.py") == UNIT / "sql/postgres/test_presence.py"
    assert mirrored(PACKAGE / "ui/__init__.py") == UNIT / "test_ui.py"
    assert mirrored(PACKAGE / "_core/__init__.py") == UNIT / "test__core.py"
