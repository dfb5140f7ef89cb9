"""The one rule for names (``jobrun/_core/model/names.py``): a str of valid Unicode without
NUL, of at most ``MAX_NAME_BYTES`` bytes of UTF-8 (bytes, not characters); free text has
no length limit but the same two refusals."""

from __future__ import annotations

import pytest

import jobrun
from jobrun._core.model.names import (
    MAX_NAME_BYTES,
    name_problem,
    require_name,
    require_text,
    shown_name,
    text_problem,
)


@pytest.mark.parametrize(
    ("character", "size"),
    [("a", 1), ("é", 2), ("€", 3), ("𝄞", 4)],
    ids=["one-byte", "two-byte", "three-byte", "four-byte"],  # ASCII ids (tests/README.md)
)
def test_the_limit_counts_bytes_of_utf8_not_characters(character: str, size: int) -> None:
    most = MAX_NAME_BYTES // size
    assert name_problem(character * most) is None
    over = character * (most + 1)
    over_by = (most + 1) * size
    assert name_problem(over) == (
        f"is {over_by} bytes of UTF-8, over the {MAX_NAME_BYTES}-byte limit for names"
    )


def test_empty_nul_and_lone_surrogates_are_refused_and_say_where() -> None:
    assert name_problem("") == "is empty"
    assert name_problem("", allow_empty=True) is None
    assert name_problem("a\x00b") == "contains a NUL character (Postgres cannot store it)"
    problem = name_problem("job\udcff")
    assert problem is not None
    assert problem.startswith("is not valid Unicode: a lone surrogate at character 3")


def test_free_text_has_no_length_limit_but_the_same_refusals() -> None:
    assert text_problem("x" * (10 * MAX_NAME_BYTES)) is None
    assert text_problem("") is None
    assert text_problem("a\x00") == "contains a NUL character (Postgres cannot store it)"
    assert text_problem("\ud800") == "is not valid Unicode: a lone surrogate at character 0"


def test_a_refused_name_names_its_argument_and_shows_a_short_printable_value() -> None:
    assert require_name("nightly", "job") == "nightly"
    with pytest.raises(jobrun.JobValidationError) as refused:
        require_name("x" * 600, "instance")
    assert refused.value.errors == [
        {"path": "instance", "message": name_problem("x" * 600)},
    ]
    assert str(refused.value).startswith(f"instance {shown_name('x' * 600)} is 600 bytes")
    with pytest.raises(jobrun.ArgumentTypeError) as wrong_type:
        require_name(7, "job")
    assert str(wrong_type.value) == "job must be a str, got int"
    with pytest.raises(jobrun.JobValidationError) as unstorable:
        require_text("a\x00", "reason")
    assert str(unstorable.value) == (
        "reason 'a\\x00' contains a NUL character (Postgres cannot store it)"
    )


def test_a_shown_name_is_cut_at_40_characters_and_escaped() -> None:
    assert shown_name("nightly") == "'nightly'"
    assert shown_name("a\x00\udcff") == "'a\\x00\\udcff'"
    long = shown_name("y" * 41)
    assert long == "'" + "y" * 40 + "...'"
    assert shown_name("y" * 40) == "'" + "y" * 40 + "'"
