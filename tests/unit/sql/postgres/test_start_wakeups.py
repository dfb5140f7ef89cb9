"""One NOTIFY in flight per store: single starts share their wake-ups (issue 32 item 4)."""

from __future__ import annotations

import asyncio

from jobrun.sql.postgres.start_wakeups import StartWakeUps


async def test_starts_that_find_a_notify_in_flight_share_the_next_one():
    wakeups = StartWakeUps()
    sent: list[list[str]] = []
    first_may_finish = asyncio.Event()

    async def send(payloads: list[str]) -> None:
        sent.append(payloads)

    assert wakeups.take() is True  # the first start carries its own NOTIFY

    async def first() -> None:
        await first_may_finish.wait()
        await wakeups.release(send)

    carrier = asyncio.ensure_future(first())
    assert wakeups.take() is False  # the others insert without one...
    waiting = [asyncio.ensure_future(wakeups.after_commit(f"job-{n}", send)) for n in range(5)]
    await asyncio.sleep(0)  # let them queue (no wait for time: one loop turn)
    assert not any(task.done() for task in waiting)  # ...and wait for the carrier
    first_may_finish.set()
    await asyncio.wait_for(asyncio.gather(carrier, *waiting), 10)

    assert sent == [[f"job-{n}" for n in range(5)]]  # one NOTIFY for all five
    assert wakeups.take() is True  # and none is in flight any more


async def test_a_lone_wake_up_is_sent_by_its_own_caller():
    wakeups = StartWakeUps()
    sent: list[list[str]] = []

    async def send(payloads: list[str]) -> None:
        sent.append(payloads)

    await asyncio.wait_for(wakeups.after_commit("job", send), 10)
    assert sent == [["job"]]


async def test_a_failed_wake_up_is_logged_and_the_start_returns(caplog):
    wakeups = StartWakeUps()

    async def send(payloads: list[str]) -> None:
        raise OSError("connection lost")

    await asyncio.wait_for(wakeups.after_commit("job", send), 10)
    assert "could not send the wake-up for new runs: connection lost" in caplog.text
    assert wakeups.take() is True
