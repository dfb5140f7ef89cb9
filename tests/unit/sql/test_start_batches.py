"""Single starts from concurrent callers go out together: one batch in flight per store,
those arriving meanwhile in the next one, a key twice in a batch one run."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from jobrun._core import RunRow
from jobrun._core.operator.starts import new_run_row
from jobrun.sql.start_batches import StartBatches


def row(instance: str, run_id: str) -> RunRow:
    return new_run_row(
        run_id=run_id,
        key=("m", "j", instance),
        payload_text="null",
        priority=0,
        at="2026-01-01T00:00:00.000000Z",
    )


class GatedSender:
    """Records each batch sent; holds each until the test opens the gate."""

    def __init__(self) -> None:
        self.batches: list[list[str]] = []
        self.gate = asyncio.Event()
        self.fail_next = False

    async def send(self, rows: Sequence[RunRow]) -> list[tuple[RunRow, bool]]:
        self.batches.append([row.id for row in rows])
        await self.gate.wait()
        if self.fail_next:
            self.fail_next = False
            raise RuntimeError("database gone")
        return [(row, True) for row in rows]


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_a_lone_start_goes_at_once_and_those_arriving_meanwhile_go_in_one_batch() -> None:
    sender = GatedSender()
    batches = StartBatches(sender.send)
    first = asyncio.ensure_future(batches.start(row("a", "1")))
    await settle()
    assert sender.batches == [["1"]]
    later = [asyncio.ensure_future(batches.start(row(name, name))) for name in "bcd"]
    await settle()
    assert sender.batches == [["1"]]  # waiting for the batch in flight
    sender.gate.set()
    answers = await asyncio.gather(first, *later)
    assert sender.batches == [["1"], ["b", "c", "d"]]
    assert [(found.id, inserted) for found, inserted in answers] == [
        ("1", True),
        ("b", True),
        ("c", True),
        ("d", True),
    ]


async def test_a_key_started_twice_in_one_batch_is_one_run_the_second_caller_joins() -> None:
    sender = GatedSender()
    batches = StartBatches(sender.send)
    blocker = asyncio.ensure_future(batches.start(row("x", "0")))
    await settle()
    first = asyncio.ensure_future(batches.start(row("a", "1")))
    second = asyncio.ensure_future(batches.start(row("a", "2")))
    await settle()
    sender.gate.set()
    await blocker
    assert sender.batches[1] == ["1"]
    assert await first == (row("a", "1"), True)
    assert await second == (row("a", "1"), False)


async def test_a_failed_batch_fails_each_of_its_callers_and_the_next_batch_goes() -> None:
    sender = GatedSender()
    batches = StartBatches(sender.send)
    sender.fail_next = True
    failing = [asyncio.ensure_future(batches.start(row(name, name))) for name in "ab"]
    await settle()
    sender.gate.set()
    for caller in failing:
        with pytest.raises(RuntimeError, match="database gone"):
            await caller
    assert await batches.start(row("c", "c")) == (row("c", "c"), True)


async def test_a_cancelled_caller_does_not_cancel_its_batchmates() -> None:
    sender = GatedSender()
    batches = StartBatches(sender.send)
    blocker = asyncio.ensure_future(batches.start(row("x", "0")))
    await settle()
    gone = asyncio.ensure_future(batches.start(row("a", "1")))
    kept = asyncio.ensure_future(batches.start(row("b", "2")))
    await settle()
    gone.cancel()
    sender.gate.set()
    await blocker
    assert await kept == (row("b", "2"), True)
    assert gone.cancelled()
    # Its start stayed queued and went (as a cancelled statement may still commit).
    assert sender.batches[1] == ["1", "2"]
