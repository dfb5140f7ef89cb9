"""Every public name has a docstring, read the way the reference site reads it.

The API reference (``docs/reference/``) is generated from docstrings by
mkdocstrings, which reads the source with griffe; griffe also sees attribute
docstrings (a string right after ``NAME = ...``), which ``__doc__`` cannot. So
this test loads the package with griffe too, and checks:

* every name in ``jobrun.__all__`` and ``jobrun.testing.__all__``;
* every public method and property of those classes, except a store's own
  implementations of the store protocol (their contract is documented once, on
  ``JobRunStore`` and ``OperatorStore``);
* that each name in ``jobrun.__all__`` is on a reference page.
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import griffe
import pytest

import jobrun
import jobrun.testing
from tests.support import REPO

# Store protocols, by griffe path (the console's is not public, but the stores implement it).
PROTOCOLS = {
    "JobRunStore": "jobrun.JobRunStore",
    "OperatorStore": "jobrun.OperatorStore",
    "ScheduleStore": "jobrun.ScheduleStore",
    "BrowsableStore": "jobrun._core.operator.browse.BrowsableStore",
}
STORES = {"SqlJobRunStore", "MemoryJobRunStore"}


# The griffe extensions the reference site loads (mkdocs.yml); system_bound makes the
# operations jobrun._api binds to the real sources read as the functions they are.
SITE_EXTENSIONS = (
    "docs/_extensions/rst_roles.py:RestRoles",
    "docs/_extensions/system_bound.py:SystemBound",
)


@pytest.fixture(scope="module")
def package() -> griffe.Module:
    extensions = griffe.load_extensions(*(str(REPO / name) for name in SITE_EXTENSIONS))
    loaded = griffe.load(
        "jobrun", search_paths=[str(REPO)], resolve_aliases=True, extensions=extensions
    )
    assert isinstance(loaded, griffe.Module)
    return loaded


def public_names() -> list[str]:
    return [f"jobrun.{name}" for name in jobrun.__all__] + [
        f"jobrun.testing.{name}" for name in jobrun.testing.__all__
    ]


def documented(obj: griffe.Object | griffe.Alias) -> bool:
    return obj.docstring is not None and bool(obj.docstring.value.strip())


def lookup(package: griffe.Module, dotted: str) -> griffe.Object | griffe.Alias:
    return package[dotted.removeprefix("jobrun.")]


def protocol_method_names(package: griffe.Module) -> set[str]:
    names: set[str] = set()
    for path in PROTOCOLS.values():
        names |= set(lookup(package, path).members)
    return names


def test_every_public_name_has_a_docstring(package: griffe.Module) -> None:
    missing = [name for name in public_names() if not documented(lookup(package, name))]
    assert missing == [], f"public names without a docstring: {missing}"


def test_every_public_method_has_a_docstring(package: griffe.Module) -> None:
    from_protocol = protocol_method_names(package)
    missing = []
    for dotted in public_names():
        obj = lookup(package, dotted)
        if not obj.is_class:
            continue
        short = dotted.rsplit(".", 1)[1]
        for member_name, member in obj.members.items():
            if member_name.startswith("_") or not (
                member.is_function or "property" in member.labels
            ):
                continue
            if short in STORES and member_name in from_protocol:
                continue
            if not documented(member):
                missing.append(f"{dotted}.{member_name}")
    assert missing == [], f"public methods without a docstring: {missing}"


def test_the_store_methods_skipped_above_are_documented_on_the_protocols(
    package: griffe.Module,
) -> None:
    missing = [
        f"{protocol}.{name}"
        for protocol, path in PROTOCOLS.items()
        for name, member in lookup(package, path).members.items()
        if not name.startswith("_") and not documented(member)
    ]
    assert missing == []


def test_the_site_loads_the_extensions_checked_here() -> None:
    site = (REPO / "mkdocs.yml").read_text()
    assert [name for name in SITE_EXTENSIONS if f"- {name}" not in site] == []


def test_the_site_shows_each_public_function_with_its_run_time_parameters(
    package: griffe.Module,
) -> None:
    """The operations bound to the real sources included: ``sources`` is not shown."""
    for name in jobrun.__all__:
        function = getattr(jobrun, name)
        if not inspect.isfunction(function):
            continue
        shown = lookup(package, f"jobrun.{name}")
        assert shown.is_function, name
        assert [parameter.name for parameter in shown.parameters] == list(
            inspect.signature(function).parameters
        ), name


def test_every_public_name_is_on_a_reference_page() -> None:
    shown: set[str] = set()
    for page in (REPO / "docs" / "reference").glob("*.md"):
        shown |= set(re.findall(r"^::: jobrun\.(\w+)\s*$", page.read_text(), re.MULTILINE))
    assert set(jobrun.__all__) - shown == set()


def test_the_check_can_fail(tmp_path: Path) -> None:
    (tmp_path / "sample.py").write_text(
        '"""A module."""\n\ndef good() -> None:\n    """Has one."""\n\n'
        "def bad() -> None:\n    pass\n"
    )
    sample = griffe.load("sample", search_paths=[str(tmp_path)])
    assert documented(sample["good"])
    assert not documented(sample["bad"])
