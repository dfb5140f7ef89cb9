"""A job's own tests, written with ``jobrun.testing``: no database, no sleeping.

    pytest examples/test_invoice_job.py      (needs pytest and pytest-asyncio)

The job charges a customer, then emails the receipt, one step each. The tests
prove what matters to the business: a crash between the two steps does not
charge the customer twice, and a failing email is retried after its backoff.
"""

from __future__ import annotations

import pytest

import jobrun
from jobrun.testing import FakeClock, MemoryJobRunStore

# MemoryJobRunStore keeps SqlJobRunStore's contract in a dict; FakeClock moves only
# when told. Both go to every jobrun call, so time and storage are the test's own.
pytestmark = pytest.mark.asyncio


class Crash(BaseException):
    """The process dying: not an ``Exception``, so the pass is not committed at all."""


class FakeBilling:
    """The outside world the job talks to, recording every call."""

    def __init__(self) -> None:
        self.charges: list[str] = []
        self.emails: list[str] = []
        self.crash_in_email = False
        self.email_failures = 0

    def charge(self, customer: str, cents: int) -> str:
        self.charges.append(customer)
        return f"receipt-{customer}-{cents}"

    def email(self, customer: str, receipt: str) -> bool:
        if self.crash_in_email:
            self.crash_in_email = False
            raise Crash
        if self.email_failures:
            self.email_failures -= 1
            raise ConnectionError("mail server unreachable")
        self.emails.append(receipt)
        return True


def invoice_jobs(billing: FakeBilling) -> jobrun.JobRegistry:
    """The job as the application registers it, with its collaborators passed in."""
    registry = jobrun.JobRegistry()
    retry = jobrun.RetryPolicy(max_attempts=3, base_delay_ms=2000)

    @registry.job("billing", "invoice", retry=retry)
    async def invoice(p: jobrun.JobPass) -> jobrun.PassResult:
        customer, cents = p.payload["customer"], p.payload["cents"]
        receipt = await p.step("charge", lambda: billing.charge(customer, cents))
        await p.step("email", lambda: billing.email(customer, receipt))
        return jobrun.PassResult(done=True)

    return registry


async def start_invoice(store: MemoryJobRunStore, clock: FakeClock) -> str:
    payload = {"customer": "ada", "cents": 1200}
    run = await jobrun.start_job_run(
        store, module_id="billing", job="invoice", instance="ada", payload=payload, clock=clock
    )
    return run.id


async def status_of(store: MemoryJobRunStore, run_id: str) -> str | None:
    record = await jobrun.get_job_run(store, run_id)
    return None if record is None else record.status


async def test_charges_and_emails_once() -> None:
    store, clock, billing = MemoryJobRunStore(), FakeClock(), FakeBilling()
    run_id = await start_invoice(store, clock)
    await jobrun.run_due_jobs(store, invoice_jobs(billing), clock=clock)
    assert await status_of(store, run_id) == "done"
    assert billing.charges == ["ada"]
    assert billing.emails == ["receipt-ada-1200"]


async def test_crash_between_steps_does_not_charge_again() -> None:
    store, clock, billing = MemoryJobRunStore(), FakeClock(), FakeBilling()
    jobs = invoice_jobs(billing)
    run_id = await start_invoice(store, clock)
    billing.crash_in_email = True
    with pytest.raises(Crash):
        await jobrun.run_due_jobs(store, jobs, clock=clock)
    assert billing.charges == ["ada"]
    assert await status_of(store, run_id) == "running"

    # The replay: "charge" answers from the step ledger; only "email" runs.
    report = await jobrun.run_due_jobs(store, jobs, clock=clock)
    assert report.completed == 1
    assert billing.charges == ["ada"]
    assert billing.emails == ["receipt-ada-1200"]


async def test_failed_email_is_retried_after_backoff() -> None:
    store, clock, billing = MemoryJobRunStore(), FakeClock(), FakeBilling()
    jobs = invoice_jobs(billing)
    await start_invoice(store, clock)
    billing.email_failures = 1
    first = await jobrun.run_due_jobs(store, jobs, clock=clock)
    assert first.retrying == 1
    assert "mail server unreachable" in first.errors[0].error

    # Backing off (2 s, give or take 20% jitter): nothing is due yet.
    assert (await jobrun.run_due_jobs(store, jobs, clock=clock)).attempted == 0
    clock.advance(seconds=3)
    assert (await jobrun.run_due_jobs(store, jobs, clock=clock)).completed == 1
    assert billing.charges == ["ada"]
    assert billing.emails == ["receipt-ada-1200"]
