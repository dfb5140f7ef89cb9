"""What a handler hands back: ``PassResult`` keeps the committed cursor unless told."""

from __future__ import annotations

import dataclasses

import jobrun


def test_pass_result_keeps_the_cursor_unless_told() -> None:
    assert {field.name for field in dataclasses.fields(jobrun.PassResult)} == {"cursor", "done"}
    result = jobrun.PassResult()
    assert result.cursor is jobrun.KEEP_CURSOR
    assert result.done is False
    assert jobrun.PassResult(cursor=None).cursor is None
