"""The pure part of the workers' rows (``jobrun._core.operator.worker_registry``): the stored jobs
text, the expiry a heartbeat writes, when a heartbeat sweeps, and which jobs are unserved."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta

from jobrun._core.model.formats import format_instant
from jobrun._core.model.run_views import job_run_of
from jobrun._core.model.worker_rows import WorkerRow, jobs_of, jobs_text
from jobrun._core.operator.worker_registry import (
    GONE_AFTER_BEATS,
    MAX_BEATS_PER_S,
    beat_row,
    heartbeat_for,
    served_jobs,
    sweep_due,
    unserved,
    waits_for_no_one,
    worker_is_live,
)
from tests.support import hand_made_row

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def _row(jobs: list[tuple[str, str]]) -> WorkerRow:
    return beat_row(WorkerRow("w", "n", "h", 1, jobs_text(jobs), "s", "", ""), NOW, 10.0)


def test_jobs_are_stored_as_pairs_sorted_and_once() -> None:
    text = jobs_text([("m/j", "x"), ("m", "j/x"), ("m/j", "x")])
    assert text == '[["m","j/x"],["m/j","x"]]'
    assert jobs_of(text) == [("m", "j/x"), ("m/j", "x")]


def test_a_jobs_text_written_by_hand_that_does_not_parse_has_no_jobs() -> None:
    for text in ("", "not json", '{"m": "j"}', '[["only one"], 3, ["m", "j"]]'):
        assert jobs_of(text) == ([("m", "j")] if text.startswith("[[") else [])


def test_a_heartbeat_counts_for_three_heartbeats() -> None:
    row = _row([])
    assert row.heartbeat_at == format_instant(NOW)
    gone = NOW + timedelta(seconds=10.0 * GONE_AFTER_BEATS)
    assert row.expires_at == format_instant(gone)
    assert worker_is_live(row, format_instant(gone - timedelta(milliseconds=1)))
    assert not worker_is_live(row, format_instant(gone))


def test_a_worker_over_many_databases_stretches_each_heartbeat_to_bound_its_writes() -> None:
    assert heartbeat_for(10.0, 1) == 10.0
    assert heartbeat_for(10.0, int(10 * MAX_BEATS_PER_S)) == 10.0
    for databases in (51, 300, 1050):
        stretched = heartbeat_for(10.0, databases)
        assert stretched > 10.0
        # Every database written once a heartbeat: at most MAX_BEATS_PER_S writes a second.
        assert databases / stretched == MAX_BEATS_PER_S


def test_the_first_heartbeat_and_every_tenth_sweep() -> None:
    assert [beat for beat in range(25) if sweep_due(beat)] == [0, 10, 20]


def test_unserved_jobs_are_the_due_ones_no_worker_registers() -> None:
    workers = [_row([("m", "a")]), _row([("m", "a"), ("m", "b")])]
    assert served_jobs(workers) == {("m", "a"): 2, ("m", "b"): 1}
    assert unserved({("m", "a"): 3, ("m", "c"): 2, ("m", "d"): 0}, workers) == {("m", "c"): 2}


def test_due_and_stranded_runs_of_an_unserved_job_wait_for_no_one() -> None:
    at = format_instant(NOW - timedelta(minutes=5))
    due = job_run_of(hand_made_row(1, module_id="m", job="c", at=at))
    stranded = job_run_of(
        dataclasses.replace(
            hand_made_row(2, module_id="m", job="c", at=at),
            lease_owner="t",
            lease_driver="gone",
            next_attempt_at=format_instant(NOW - timedelta(minutes=1)),
        )
    )
    later = job_run_of(
        dataclasses.replace(
            hand_made_row(3, module_id="m", job="c", at=at),
            next_attempt_at=format_instant(NOW + timedelta(minutes=1)),
        )
    )
    served = {("m", "a"): 1}
    assert [waits_for_no_one(run, NOW, served) for run in (due, stranded, later)] == [
        True,
        True,
        False,
    ]
    assert not waits_for_no_one(due, NOW, {("m", "c"): 1})
