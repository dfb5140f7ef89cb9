"""Failures grouped by what went wrong (``jobrun/_core/model/error_groups.py``): the type and
the message with its particulars taken out, the largest group first."""

from __future__ import annotations

import dataclasses

from jobrun._core.model.error_groups import MESSAGE_CHARS, error_signature, group_errors
from jobrun._core.model.records import RunRow
from tests.support import hand_made_row


def test_error_signatures_take_the_particulars_out() -> None:
    assert error_signature("KeyError: order 4411 not found") == ("KeyError", "order <n> not found")
    assert error_signature(
        "HTTPError: 503 for 01J9ZQ3V4W5X6Y7Z8A9B0C1D2E at /v1/items/9f86d081884c7d65"
    ) == ("HTTPError", "<n> for <id> at /v<n>/items/<hex>")
    assert error_signature("no type here 12") == ("?", "no type here <n>")
    assert error_signature(None) == ("?", "")
    rows = [
        dataclasses.replace(hand_made_row(index), last_error=f"E: id {index}", ended_at="x")
        for index in range(5)
    ]
    (group,) = group_errors(rows, keep_ids=2)
    assert (group.count, group.run_ids) == (5, [rows[4].id, rows[3].id])


def test_only_the_first_line_counts_and_a_long_message_is_cut() -> None:
    traced = "ValueError: bad row 7\nTraceback (most recent call last):\n  line 12"
    assert error_signature(traced) == ("ValueError", "bad row <n>")
    assert error_signature("  spaced:   out   12  ") == ("spaced", "out <n>")
    long = error_signature("E: " + "word " * 200)[1]
    assert len(long) == MESSAGE_CHARS
    # A dotted type is a type; a first word with a space before the colon is not.
    assert error_signature("httpx.ReadTimeout: late")[0] == "httpx.ReadTimeout"
    assert error_signature("not a type: x")[0] == "?"


def test_groups_come_largest_first_then_by_their_latest_failure() -> None:
    def failed(index: int, error: str, ended_at: str, job: str = "j") -> RunRow:
        row = hand_made_row(index, module_id="m", job=job)
        return dataclasses.replace(row, status="failed", last_error=error, ended_at=ended_at)

    rows = [
        failed(1, "KeyError: order 1", "2026-01-01T00:00:01.000Z"),
        failed(2, "OSError: disk 1", "2026-01-01T00:00:09.000Z"),
        failed(3, "KeyError: order 2", "2026-01-01T00:00:02.000Z", job="k"),
        failed(4, "TimeoutError: after 5 s", "2026-01-01T00:00:05.000Z"),
    ]
    groups = group_errors(rows, keep_ids=5)
    assert [(group.error_type, group.count) for group in groups] == [
        ("KeyError", 2),
        ("OSError", 1),  # ties: the latest failure first
        ("TimeoutError", 1),
    ]
    keys = groups[0]
    assert keys.run_ids == [rows[2].id, rows[0].id], "newest id first"
    assert keys.jobs == {("m", "j"), ("m", "k")}
    assert keys.last_ended_at == "2026-01-01T00:00:02.000Z"
    assert keys.example == "KeyError: order 2", "the newest run's own text"
