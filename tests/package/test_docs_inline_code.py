"""The code the docs show is the code the tests run, written out in the page itself.

A page shows a file (or a region of one) as an ordinary fenced block right
after a comment that names it, so the repository's web view shows the code
too (an include directive would show there as a bare line)::

    <!-- code: examples/tutorial.py:job -->
    ```python
    ...the lines between "--8<-- [start:job]" and "--8<-- [end:job]"...
    ```

Without ``:region`` the block is the whole file (less any region marker lines).
The test fails when a block and its file differ; to rewrite every block from
its file after editing an example::

    python tests/package/test_docs_inline_code.py --write
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PAGES = sorted((REPO / "docs").rglob("*.md"))
MARKER = re.compile(r"^<!-- code: (?P<path>[^\s:]+)(?::(?P<region>[\w-]+))? -->$")
FENCE = re.compile(r"^```[\w+-]*$")
REGION_LINE = re.compile(r"--8<-- \[(start|end):[\w-]+\]")


def region(path: str, name: str | None) -> str:
    """The lines a marker names, without surrounding blank lines."""
    lines = (REPO / path).read_text().splitlines()
    if name is not None:
        start = next(i for i, line in enumerate(lines) if f"--8<-- [start:{name}]" in line)
        end = next(i for i, line in enumerate(lines) if f"--8<-- [end:{name}]" in line)
        lines = lines[start + 1 : end]
    kept = [line for line in lines if not REGION_LINE.search(line)]
    return "\n".join(kept).strip("\n")


def blocks(text: str) -> list[tuple[int, str, str | None, int, int]]:
    """Each marked block: (marker line, path, region, first and end line of its body)."""
    lines = text.splitlines()
    found = []
    for number, line in enumerate(lines):
        marker = MARKER.match(line)
        if marker is None:
            continue
        assert FENCE.match(lines[number + 1]), f"line {number + 2}: a code fence must follow"
        end = next(i for i in range(number + 2, len(lines)) if lines[i] == "```")
        found.append((number, marker["path"], marker["region"], number + 2, end))
    return found


def written(text: str) -> str:
    """``text`` with every marked block rewritten from its file."""
    lines = text.splitlines()
    for _marker, path, name, first, end in reversed(blocks(text)):
        lines[first:end] = region(path, name).splitlines()
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(REPO)))
def test_shown_code_is_the_file(page: Path) -> None:
    text = page.read_text()
    for marker, path, name, first, end in blocks(text):
        shown = "\n".join(text.splitlines()[first:end])
        where = f"{page.relative_to(REPO)} line {marker + 1}"
        assert shown == region(path, name), (
            f"{where} differs from {path}{':' + name if name else ''}; "
            "run: python tests/package/test_docs_inline_code.py --write"
        )


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(REPO)))
def test_no_include_directives(page: Path) -> None:
    """An include shows as a bare line on the repository's web view."""
    lines = page.read_text().splitlines()
    raw = [n + 1 for n, line in enumerate(lines) if line.startswith("--8<--")]
    assert raw == [], f"{page.relative_to(REPO)}: include lines {raw}; show the code instead"


def test_the_tutorial_shows_its_program() -> None:
    shown = {
        (path, name) for _m, path, name, _f, _e in blocks((REPO / "docs/tutorial.md").read_text())
    }
    assert shown == {("examples/tutorial.py", "job"), ("examples/tutorial.py", "main")}


if __name__ == "__main__" and sys.argv[1:] == ["--write"]:
    for page in PAGES:
        before = page.read_text()
        after = written(before)
        if after != before:
            page.write_text(after)
            print(f"rewrote {page.relative_to(REPO)}")
