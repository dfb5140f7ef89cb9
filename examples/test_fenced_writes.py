"""Writes to the outside world that a replay cannot repeat or a stale holder overwrite.

    pytest examples/test_fenced_writes.py      (needs pytest and pytest-asyncio)

The job charges an order through a payments API, then records the charge in a
store outside jobrun, one step each. A step's body can run twice (the process
dies after the effect, before its result is stored), so:

* the charge carries ``p.idempotency_key(...)`` in an ``Idempotency-Key``
  header: every replay of the pass sends the same key, and the API answers a
  repeated key with its first response instead of charging again;
* the record carries ``p.lease_epoch``: the store keeps the highest epoch it has
  seen and refuses writes below it, so a request from a holder that lost the
  run, arriving late, cannot overwrite what the new holder wrote.
"""

from __future__ import annotations

from typing import Any

import pytest

import jobrun
from jobrun.testing import FakeClock, MemoryJobRunStore

pytestmark = pytest.mark.asyncio


class Crash(BaseException):
    """The process dying: not an ``Exception``, so the pass is not committed at all."""


class PaymentsAPI:
    """A payments API that honours idempotency keys, like most do: a key it has seen
    gets the first response back, and nothing is charged again."""

    def __init__(self) -> None:
        self.charged_cents: list[int] = []
        self.keys_received: list[str] = []
        self._responses: dict[str, dict[str, Any]] = {}
        self.crash_after_charging = False

    def post(self, path: str, headers: dict[str, str], body: dict[str, Any]) -> dict[str, Any]:
        assert path == "/v1/charges"
        key = headers["Idempotency-Key"]
        self.keys_received.append(key)
        if key not in self._responses:
            self.charged_cents.append(body["cents"])
            self._responses[key] = {"id": f"ch_{len(self.charged_cents)}", "cents": body["cents"]}
        if self.crash_after_charging:
            # The charge went through; the process dies before the step result is stored.
            self.crash_after_charging = False
            raise Crash
        return self._responses[key]


class StaleWriteError(Exception):
    """A write carried an epoch lower than one the store has already seen."""


class FencedStore:
    """A store outside jobrun that keeps, per key, the highest epoch it has seen."""

    def __init__(self) -> None:
        self.values: dict[str, str] = {}
        self.epochs: dict[str, int] = {}
        self.delayed: list[tuple[str, str, int]] = []
        self.delay_next = False

    def put(self, key: str, value: str, epoch: int) -> None:
        if self.delay_next:
            # The request is stuck in the network, and its sender dies meanwhile.
            self.delay_next = False
            self.delayed.append((key, value, epoch))
            raise Crash
        self._apply(key, value, epoch)

    def deliver_delayed(self) -> None:
        for key, value, epoch in self.delayed:
            self._apply(key, value, epoch)

    def _apply(self, key: str, value: str, epoch: int) -> None:
        if epoch < self.epochs.get(key, 0):
            raise StaleWriteError(f"{key}: epoch {epoch} < {self.epochs[key]}")
        self.epochs[key] = epoch
        self.values[key] = value


def order_jobs(api: PaymentsAPI, ledger: FencedStore) -> jobrun.JobRegistry:
    registry = jobrun.JobRegistry()

    @registry.job("shop", "charge-order")
    async def charge_order(p: jobrun.JobPass) -> jobrun.PassResult:
        order, cents = p.payload["order"], p.payload["cents"]
        # The same on every replay of this pass, whichever driver runs it.
        key = p.idempotency_key(f"charge-{order}")
        charge = await p.step(
            f"charge-{order}",
            lambda: api.post("/v1/charges", {"Idempotency-Key": key}, {"cents": cents}),
        )
        # Higher for every later holder of the run, on any host.
        epoch = p.lease_epoch
        await p.step("record", lambda: ledger.put(order, charge["id"], epoch=epoch))
        return jobrun.PassResult(done=True)

    return registry


async def start_order(store: MemoryJobRunStore, clock: FakeClock) -> str:
    payload = {"order": "42", "cents": 1200}
    run = await jobrun.start_job_run(
        store, module_id="shop", job="charge-order", instance="42", payload=payload, clock=clock
    )
    return run.id


async def test_a_charge_repeated_after_a_crash_is_charged_once() -> None:
    store, clock, api, ledger = MemoryJobRunStore(), FakeClock(), PaymentsAPI(), FencedStore()
    jobs = order_jobs(api, ledger)
    await start_order(store, clock)
    api.crash_after_charging = True
    with pytest.raises(Crash):
        await jobrun.run_due_jobs(store, jobs, clock=clock)

    # The replay calls the API again (the step's result was never stored), with the same key.
    assert (await jobrun.run_due_jobs(store, jobs, clock=clock)).completed == 1
    first, again = api.keys_received
    assert first == again
    assert api.charged_cents == [1200]
    assert ledger.values == {"42": "ch_1"}


async def test_a_late_write_from_a_lost_holder_is_refused() -> None:
    store, clock, api, ledger = MemoryJobRunStore(), FakeClock(), PaymentsAPI(), FencedStore()
    jobs = order_jobs(api, ledger)
    await start_order(store, clock)
    ledger.delay_next = True
    with pytest.raises(Crash):
        await jobrun.run_due_jobs(store, jobs, clock=clock)

    # The run is claimed again, under a higher epoch, and records the charge.
    assert (await jobrun.run_due_jobs(store, jobs, clock=clock)).completed == 1
    assert ledger.epochs == {"42": 2}
    # Then the dead holder's request arrives: the store refuses it.
    with pytest.raises(StaleWriteError, match="epoch 1 < 2"):
        ledger.deliver_delayed()
    assert ledger.values == {"42": "ch_1"}
    assert api.charged_cents == [1200]
