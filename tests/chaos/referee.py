"""The referee: what the step bodies' shared log says about one chaos scenario.

The drivers cannot be trusted to say whether they misbehaved, so each body
writes its own start and end to a file (see ``tests/processes/chaos_child.py``)
and the referee reads it afterwards, with what the runner knows about the
processes: when one was paused (SIGSTOP to SIGCONT: it executes nothing then)
and when one died (a body without an end line ends there).

* overlaps: pairs of bodies of one run that executed at the same time. A body
  paused mid-flight and resumed finishes its ``await`` on waking, whatever the
  lease says: that remainder is a *resumed tail*, reported apart, because
  nothing a lease does can stop a process that is not running;
* repeated: a body that started after a body of the same step of the same run
  had finished (``ok``): finished work done again;
* acknowledged repeats: steps recorded (``p.step`` returned: an ``A`` line) whose
  body started again afterwards: acknowledged work lost (a failover to a
  replica that had not received it);
* resume: from a reference moment (the fault's end, or the kill) to the first
  body of each affected run that started after it; the slowest run counts.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

Segment = tuple[int, int]


@dataclass
class Body:
    run: str
    step: str
    pid: int
    start_ns: int
    end_ns: int | None = None
    outcome: str = "open"
    segments: list[Segment] = field(default_factory=list)
    tails: list[Segment] = field(default_factory=list)


@dataclass
class Verdict:
    bodies: int = 0
    overlaps: int = 0
    longest_overlap_ms: float = 0.0
    resumed_tails: int = 0
    longest_tail_ms: float = 0.0
    repeated: int = 0
    acknowledged_repeats: int = 0
    resume_s: float | None = None
    overlapping: list[str] = field(default_factory=list)


def read_bodies(log: Path) -> list[Body]:
    bodies: dict[tuple[str, str, int, int], Body] = {}
    for line in log.read_text().splitlines():
        parts = line.split()
        key = (parts[1], parts[2], int(parts[3]), int(parts[4]))
        body = bodies.setdefault(key, Body(*key))
        if parts[0] == "E":
            body.end_ns, body.outcome = int(parts[5]), parts[6]
    return sorted(bodies.values(), key=lambda body: body.start_ns)


def _executed(
    body: Body, pauses: list[Segment], died_ns: int | None, now_ns: int
) -> tuple[list[Segment], list[Segment]]:
    """The body's executed time, and the part of it after a pause that began inside it."""
    end_ns = body.end_ns if body.end_ns is not None else (died_ns or now_ns)
    segments, tails, cursor, resumed = [], [], body.start_ns, False
    for stop_ns, cont_ns in sorted(pauses):
        if cont_ns <= cursor or stop_ns >= end_ns:
            continue
        if stop_ns > cursor:
            (tails if resumed else segments).append((cursor, stop_ns))
        cursor, resumed = max(cursor, cont_ns), True
    if cursor < end_ns:
        (tails if resumed else segments).append((cursor, end_ns))
    return segments, tails


def _shared_ns(first: list[Segment], second: list[Segment]) -> int:
    return sum(
        max(0, min(a_end, b_end) - max(a_start, b_start))
        for a_start, a_end in first
        for b_start, b_end in second
    )


def _count_overlaps(verdict: Verdict, bodies: list[Body]) -> None:
    by_run: dict[str, list[Body]] = defaultdict(list)
    for body in bodies:
        by_run[body.run].append(body)
    for run_bodies in by_run.values():
        for index, first in enumerate(run_bodies):
            for second in run_bodies[index + 1 :]:
                plain_ns = _shared_ns(first.segments, second.segments)
                tail_ns = _shared_ns(first.tails, second.segments + second.tails)
                tail_ns += _shared_ns(first.segments, second.tails)
                if plain_ns:
                    verdict.overlaps += 1
                    verdict.longest_overlap_ms = max(verdict.longest_overlap_ms, plain_ns / 1e6)
                    verdict.overlapping.append(
                        f"{first.run[-6:]} {first.step}@{first.pid} ~ {second.step}@{second.pid}"
                        f" {plain_ns / 1e6:.1f} ms"
                    )
                elif tail_ns:
                    verdict.resumed_tails += 1
                    verdict.longest_tail_ms = max(verdict.longest_tail_ms, tail_ns / 1e6)


def _count_repeated(bodies: list[Body]) -> int:
    finished: dict[tuple[str, str], int] = {}
    repeated = 0
    for body in bodies:  # in order of start
        key = (body.run, body.step)
        if key in finished and finished[key] <= body.start_ns:
            repeated += 1
        if body.outcome == "ok" and body.end_ns is not None:
            finished[key] = min(finished.get(key, body.end_ns), body.end_ns)
    return repeated


def acknowledged_repeats(lines: list[str]) -> int:
    """Steps recorded (an ``A`` line) whose body started again after the recording."""
    acknowledged: dict[tuple[str, str], int] = {}
    started: list[tuple[tuple[str, str], int]] = []
    for line in lines:
        kind, run, step, _pid, start_ns, *rest = line.split()
        if kind == "A":
            ack_ns = int(rest[0])
            acknowledged[run, step] = min(ack_ns, acknowledged.get((run, step), ack_ns))
        elif kind == "B":
            started.append(((run, step), int(start_ns)))
    # Whatever order the drivers' lines landed in: the times decide.
    repeated = {key for key, start_ns in started if start_ns > acknowledged.get(key, start_ns)}
    return len(repeated)


def resume_seconds(bodies: list[Body], since_ns: int, runs: set[str] | None) -> float | None:
    """From ``since_ns`` to the first body after it, for the slowest of the affected runs.

    ``runs`` None: every run with bodies both before and after the moment.
    """
    before = {body.run for body in bodies if body.start_ns < since_ns}
    first_after: dict[str, int] = {}
    for body in bodies:
        if body.start_ns >= since_ns:
            first_after.setdefault(body.run, body.start_ns)
    affected = runs if runs is not None else before & set(first_after)
    waits = [(first_after[run] - since_ns) / 1e9 for run in affected if run in first_after]
    return max(waits) if waits else None


def judge(
    log: Path,
    *,
    pauses: dict[int, list[Segment]],
    deaths: dict[int, int],
    now_ns: int,
    resume_from_ns: int | None,
    affected_runs: set[str] | None,
) -> Verdict:
    bodies = read_bodies(log) if log.exists() else []
    for body in bodies:
        body.segments, body.tails = _executed(
            body, pauses.get(body.pid, []), deaths.get(body.pid), now_ns
        )
    verdict = Verdict(bodies=len(bodies), repeated=_count_repeated(bodies))
    if log.exists():
        verdict.acknowledged_repeats = acknowledged_repeats(log.read_text().splitlines())
    _count_overlaps(verdict, bodies)
    if resume_from_ns is not None:
        verdict.resume_s = resume_seconds(bodies, resume_from_ns, affected_runs)
    return verdict
