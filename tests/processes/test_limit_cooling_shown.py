"""A rate limit cooling down (``RetryAfter(rate_limit=key)``) as an operator sees it:
``jobrun health``'s table and the console's health page say until when and why,
on every store."""

from __future__ import annotations

from typing import Any

import httpx
from rich.console import Console

import jobrun
from jobrun._cli.render import health_table
from jobrun.ui import create_app


async def test_health_and_the_console_say_a_limit_cools_down_and_why(store: Any) -> None:
    await store.cool_limit("objects-api", 100.0, 5, 120.0, "429 from objects-api")
    health = await jobrun.job_run_health(store)
    [bucket] = health.rate_limits
    assert bucket.cooling_until is not None
    console = Console(width=200, record=True)
    console.print(health_table(health))
    shown = console.export_text()
    assert f"cooling down until {bucket.cooling_until} (429 from objects-api)" in shown
    app = create_app({"main": store}, allowed_hosts=["console.test"])
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://console.test") as client:
        page = await client.get("/health")
    assert page.status_code == 200
    assert "cooling down until " in page.text
    assert "(429 from objects-api)" in page.text
