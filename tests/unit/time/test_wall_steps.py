"""The step watch (jobrun._core.time.wall_steps): expiries judged on the earliest basis
seen, written on the latest, so no wall-clock step makes a live lease look expired."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from jobrun._core.model.records import BootInstant
from jobrun._core.time.wall_steps import STEP_MEMORY_S, StepWatch, boot_instant, lease_instants
from jobrun.testing import FakeClock

START = datetime(2026, 1, 1, tzinfo=UTC)


def test_without_a_step_both_instants_are_the_wall_clock() -> None:
    watch = StepWatch()
    assert watch.instants(START, 10.0) == (START, START)
    later = START + timedelta(seconds=5)
    assert watch.instants(later, 15.0) == (later, later)
    assert not watch.stepped()


def test_a_forward_step_judges_on_the_time_before_it() -> None:
    watch = StepWatch()
    watch.instants(START, 10.0)
    stepped = START + timedelta(seconds=91)  # one second of real time, plus a +90 s step
    judged, written = watch.instants(stepped, 11.0)
    assert judged == START + timedelta(seconds=1)
    assert written == stepped


def test_a_backward_step_writes_on_the_time_before_it() -> None:
    watch = StepWatch()
    watch.instants(START, 10.0)
    stepped = START - timedelta(seconds=89)
    judged, written = watch.instants(stepped, 11.0)
    assert judged == stepped
    assert written == START + timedelta(seconds=1)


def test_slewing_is_no_step() -> None:
    watch = StepWatch()
    for second in range(100):
        # 0.2 s of drift a reading, 20 s in all: followed, never a step.
        watch.instants(START + timedelta(seconds=second * 1.2), float(second))
    assert not watch.stepped()


def test_a_step_is_forgotten_after_the_memory() -> None:
    watch = StepWatch()
    watch.instants(START, 0.0)
    watch.instants(START + timedelta(seconds=90), 0.0)
    assert watch.stepped()
    later_s = STEP_MEMORY_S + 1
    moment = START + timedelta(seconds=90 + later_s)
    assert watch.instants(moment, later_s) == (moment, moment)
    assert not watch.stepped()


def test_a_fake_clock_stepped_alone_is_watched_across_calls() -> None:
    clock = FakeClock(START)
    lease_instants(clock)
    clock.advance(seconds=1)
    clock.step_wall(seconds=90)
    judged, written = lease_instants(clock)
    assert judged == START + timedelta(seconds=1)
    assert written == START + timedelta(seconds=91)


def test_a_fake_clock_has_a_boot_clock_only_when_named_and_no_step_moves_it() -> None:
    assert boot_instant(FakeClock()) is None
    clock = FakeClock(boot_id="b", boot_offset_s=5)
    assert boot_instant(clock) == BootInstant("b", 5000)
    clock.advance(seconds=1.5)
    clock.step_wall(seconds=90)
    assert boot_instant(clock) == BootInstant("b", 6500)
    # A bare wall callable is not the host's time: it has no boot clock.
    assert boot_instant(lambda: clock.now()) is None
