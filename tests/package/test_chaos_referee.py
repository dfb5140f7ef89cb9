"""The chaos referee (``tests/chaos/referee.py``) counts what its log shows, no more.

Times in these logs are in milliseconds written as nanoseconds (``ms(...)``).
"""

from __future__ import annotations

from pathlib import Path

from tests.chaos.referee import Verdict, judge


def ms(value: float) -> int:
    return int(value * 1_000_000)


def write_log(path: Path, *bodies: tuple[str, str, int, float, float | None, str]) -> Path:
    lines = []
    for run, step, pid, start, end, outcome in bodies:
        lines.append(f"B {run} {step} {pid} {ms(start)}")
        if end is not None:
            lines.append(f"E {run} {step} {pid} {ms(start)} {ms(end)} {outcome}")
    path.write_text("\n".join(lines) + "\n")
    return path


def plain(
    log: Path,
    *,
    pauses: dict[int, list[tuple[int, int]]] | None = None,
    deaths: dict[int, int] | None = None,
    resume_from_ns: int | None = None,
    affected_runs: set[str] | None = None,
) -> Verdict:
    return judge(
        log,
        pauses=pauses or {},
        deaths=deaths or {},
        now_ns=ms(10_000),
        resume_from_ns=resume_from_ns,
        affected_runs=affected_runs,
    )


def test_bodies_of_one_run_that_share_time_overlap_and_other_runs_do_not(tmp_path: Path) -> None:
    log = write_log(
        tmp_path / "bodies.log",
        ("r1", "p1.s1", 1, 0, 100, "ok"),
        ("r1", "p1.s2", 2, 60, 200, "ok"),  # 40 ms inside the first
        ("r2", "p1.s1", 3, 0, 300, "ok"),  # another run: never an overlap
        ("r1", "p1.s3", 1, 200, 300, "ok"),  # starts as the second ends
    )
    verdict = plain(log)
    assert verdict.overlaps == 1
    assert round(verdict.longest_overlap_ms) == 40
    assert verdict.repeated == 0


def test_a_killed_body_ends_at_its_death(tmp_path: Path) -> None:
    log = write_log(
        tmp_path / "bodies.log",
        ("r1", "p2.s1", 1, 0, None, ""),  # killed at 50 ms: no end line
        ("r1", "p2.s1", 2, 80, 180, "ok"),
    )
    assert plain(log, deaths={1: ms(50)}).overlaps == 0
    assert plain(log, deaths={1: ms(100)}).overlaps == 1


def test_a_paused_body_executes_nothing_while_stopped_and_its_remainder_is_a_tail(
    tmp_path: Path,
) -> None:
    log = write_log(
        tmp_path / "bodies.log",
        ("r1", "p2.s1", 1, 0, 5_002, "ok"),  # stopped at 50, continued at 5,000
        ("r1", "p2.s1", 2, 3_000, 3_100, "ok"),
        ("r1", "p2.s2", 2, 3_100, 5_200, "ok"),
    )
    verdict = plain(log, pauses={1: [(ms(50), ms(5_000))]})
    assert verdict.overlaps == 0
    assert verdict.resumed_tails == 1
    assert round(verdict.longest_tail_ms) == 2


def test_a_body_started_after_its_step_had_finished_is_repeated(tmp_path: Path) -> None:
    log = write_log(
        tmp_path / "bodies.log",
        ("r1", "p1.s1", 1, 0, 100, "ok"),
        ("r1", "p1.s1", 2, 500, 600, "ok"),  # finished work done again
        ("r1", "p1.s2", 1, 700, 750, "cancelled"),
        ("r1", "p1.s2", 2, 800, 900, "ok"),  # the first never finished: not repeated
    )
    assert plain(log).repeated == 1


def test_resume_is_the_slowest_affected_runs_first_body_after_the_fault(tmp_path: Path) -> None:
    log = write_log(
        tmp_path / "bodies.log",
        ("r1", "p1.s1", 1, 0, 100, "ok"),
        ("r2", "p1.s1", 2, 0, 100, "ok"),
        ("r1", "p1.s2", 1, 1_500, 1_600, "ok"),
        ("r2", "p1.s2", 2, 3_000, 3_100, "ok"),
    )
    assert plain(log, resume_from_ns=ms(1_000)).resume_s == 2.0
    only_r1 = plain(log, resume_from_ns=ms(1_000), affected_runs={"r1"})
    assert only_r1.resume_s == 0.5


def test_an_acknowledged_step_run_again_is_counted_apart_from_an_unacknowledged_one(
    tmp_path: Path,
) -> None:
    log = write_log(
        tmp_path / "bodies.log",
        ("r1", "p1.s1", 1, 0, 100, "ok"),  # recorded at 110 (below), run again at 500
        ("r1", "p1.s2", 1, 120, 200, "ok"),  # finished, never recorded: run again at 600
        ("r1", "p1.s1", 2, 500, 600, "ok"),
        ("r1", "p1.s2", 2, 600, 700, "ok"),
        ("r2", "p1.s1", 3, 0, 100, "ok"),  # recorded, never run again
    )
    with log.open("a") as lines:
        lines.write(f"A r1 p1.s1 1 {ms(0)} {ms(110)}\n")
        lines.write(f"A r2 p1.s1 3 {ms(0)} {ms(105)}\n")
    verdict = plain(log)
    assert verdict.bodies == 5  # an A line is no body of its own
    assert verdict.repeated == 2
    assert verdict.acknowledged_repeats == 1
