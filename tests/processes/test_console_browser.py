"""The console in a real browser: Debian's chromium, headless, driven by Playwright.

Playwright cannot download its own browser here, so the system one is launched.
Locally the tests skip (with the reason) when ``/usr/bin/chromium`` is missing;
under CI they fail instead (``.ci/run`` installs it). Each test leaves a
screenshot of the screen it drove; with ``JOBRUN_UPDATE_SCREENSHOTS=1`` they are
written to ``docs/images/`` (the README links them), else to the test's tmp dir.
"""

from __future__ import annotations

import asyncio
import os
import socket
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from playwright.async_api import Page, async_playwright, expect
from sqlalchemy.ext.asyncio import create_async_engine

import jobrun
from jobrun.ui import create_app
from tests.support import IN_CI, REPO

CHROMIUM = Path("/usr/bin/chromium")
SCREENSHOTS = REPO / "docs" / "images"


@pytest.fixture(scope="module")
def chromium() -> Path:
    if not CHROMIUM.exists():
        if IN_CI:
            pytest.fail(f"{CHROMIUM} is missing: .ci/run installs Debian's chromium before tests")
        pytest.skip(f"no browser: {CHROMIUM} is missing (apt-get install -y chromium)")
    return CHROMIUM


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def served(sqlite_url: str) -> Iterator[str]:
    """The console on the test's SQLite file, served by uvicorn from its own thread and loop."""
    engine = create_async_engine(sqlite_url)  # used only from the server's loop
    app = create_app({"main": engine}, allowed_hosts=["127.0.0.1"], poll_interval_s=0.2)
    port = _free_port()
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off")
    )

    def serve() -> None:
        async def main() -> None:
            try:
                await server.serve()
            finally:
                await engine.dispose()

        asyncio.run(main())

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    while not server.started and thread.is_alive():
        threading.Event().wait(0.02)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(timeout=30)


@pytest.fixture
async def store(sqlite_url: str) -> AsyncIterator[jobrun.SqlJobRunStore]:
    engine = create_async_engine(sqlite_url)
    try:
        yield jobrun.SqlJobRunStore(engine)
    finally:
        await engine.dispose()


@pytest.fixture
async def page(chromium: Path) -> AsyncIterator[Page]:
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=str(chromium), headless=True)
        try:
            context = await browser.new_context(viewport={"width": 1280, "height": 800})
            opened = await context.new_page()
            opened.on("dialog", lambda dialog: asyncio.ensure_future(dialog.accept()))
            yield opened
        finally:
            await browser.close()


async def _screenshot(page: Page, name: str, tmp_path: Path) -> None:
    folder = SCREENSHOTS if os.environ.get("JOBRUN_UPDATE_SCREENSHOTS") else tmp_path
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"console-{name}.png"
    await page.screenshot(path=str(path), full_page=True)
    assert path.stat().st_size > 1000


async def test_list_filter_open_and_cancel(
    page: Page, served: str, store: Any, tmp_path: Path
) -> None:
    for instance in ("acme", "globex", "initech"):
        await jobrun.start_job_run(store, module_id="shop", job="sync", instance=instance)
    target = await jobrun.start_job_run(
        store, module_id="billing", job="invoice", instance="march", payload={"month": 3}
    )
    await page.goto(f"{served}/")
    await expect(page.locator("table.runs tbody tr")).to_have_count(4)
    await _screenshot(page, "runs", tmp_path)
    await page.fill('input[name="module"]', "billing")
    await page.click("text=Filter")
    await expect(page.locator("table.runs tbody tr")).to_have_count(1)
    await page.click(f"text={target.id}")
    await expect(page.locator("h1 .status")).to_have_text("running")
    await page.fill('input[name="reason"]', "wrong month")
    await page.click('button:has-text("Cancel")')
    await expect(page.locator("h1 .status")).to_have_text("cancelled")
    await expect(page.locator(".notice")).to_contain_text("Cancelled")
    record = await jobrun.get_job_run(store, target.id)
    assert record is not None
    assert record.last_error == "cancelled: wrong month"


async def test_a_live_runs_counters_move(
    page: Page, served: str, store: Any, tmp_path: Path
) -> None:
    registry = jobrun.JobRegistry()

    @registry.job("shop", "reindex")
    async def reindex(p: jobrun.JobPass) -> jobrun.PassResult:
        p.count("total", 0 if p.cursor else 1000)
        p.count("done", 100)
        await p.step("page", lambda: {"page": p.cursor or 0})
        return jobrun.PassResult(cursor=(p.cursor or 0) + 1)

    run = await jobrun.start_job_run(store, module_id="shop", job="reindex")
    await jobrun.run_due_jobs(store, registry)
    await page.goto(f"{served}/db/0/runs/{run.id}")
    done = page.locator('[data-counter="done"]')
    await expect(done).to_have_text("100")
    for expected in ("200", "300", "400"):
        await jobrun.run_due_jobs(store, registry)
        # No reload: the page's own polling brings the new counters in.
        await expect(done).to_have_text(expected, timeout=10_000)
    await expect(page.locator("progress")).to_have_attribute("value", "400")
    await _screenshot(page, "run", tmp_path)


async def test_bulk_resume_of_failed_runs(
    page: Page, served: str, store: Any, tmp_path: Path
) -> None:
    failed = []
    for index in range(3):
        run = await jobrun.start_job_run(store, module_id="crm", job="import", instance=f"n{index}")
        await jobrun.cancel_job_run(store, run.id, "upstream was down")
        failed.append(run.id)
    await jobrun.start_job_run(store, module_id="crm", job="import", instance="healthy")
    await page.goto(f"{served}/db/0/runs?status=cancelled")
    await expect(page.locator("table.runs tbody tr")).to_have_count(3)
    await page.check("#select-all")
    await page.click('#selected button:has-text("Resume")')
    await expect(page.locator("h1")).to_have_text("Resume 3 runs?")
    await page.click('button:has-text("Resume 3 runs")')
    await expect(page.locator("h1")).to_contain_text("3 done, 0 refused")
    for run_id in failed:
        record = await jobrun.get_job_run(store, run_id)
        assert record is not None
        assert record.status == "running"
    await page.goto(f"{served}/health")
    await expect(page.locator("table.health tbody tr")).to_have_count(1)
    await _screenshot(page, "health", tmp_path)


_LAYOUT_SHIFTS = """
window.__shift = 0;
window.__refreshes = 0;
new PerformanceObserver((list) => {
  for (const entry of list.getEntries()) {
    if (!entry.hadRecentInput) { window.__shift += entry.value; }
  }
}).observe({ type: "layout-shift", buffered: true });
document.addEventListener("jobrun:refreshed", () => { window.__refreshes += 1; });
"""


async def _failing_history(store: Any) -> list[str]:
    """Runs failed on three orders, one on a timeout, two done, one running with progress."""
    failed = []
    for order in (4411, 97, 1203):
        run = await jobrun.start_job_run(store, module_id="shop", job="sync", instance=f"o{order}")
        await jobrun.cancel_job_run(store, run.id, "x")
        await _set(store, run.id, last_error=f"KeyError: order {order} not found", cancelled=0)
        failed.append(run.id)
    run = await jobrun.start_job_run(store, module_id="crm", job="mail", instance="n1")
    await jobrun.cancel_job_run(store, run.id, "x")
    await _set(store, run.id, last_error="TimeoutError: upstream took 30 s", cancelled=0)
    return failed


async def _set(store: Any, run_id: str, **values: Any) -> None:
    from sqlalchemy import update

    from jobrun.sql.schema import job_runs

    async with store.engine.begin() as connection:
        await connection.execute(update(job_runs).where(job_runs.c.id == run_id).values(**values))


async def test_the_runs_list_refreshes_without_a_layout_shift(
    page: Page, served: str, store: Any, tmp_path: Path
) -> None:
    await _failing_history(store)
    live = await jobrun.start_job_run(store, module_id="shop", job="reindex", instance="all")
    await _set(store, live.id, counters='{"total": 1000, "done": 5}')
    await page.add_init_script(_LAYOUT_SHIFTS)
    await page.goto(f"{served}/db/0/runs")
    await expect(page.locator("table.runs tbody tr")).to_have_count(5)
    for done in (250, 500, 1000):
        await _set(store, live.id, counters=f'{{"total": 1000, "done": {done}}}')
        await expect(page.locator("td.progress-cell").first).to_contain_text(
            f"{done // 10}%", timeout=10_000
        )
    # (wait_for_function would evaluate a string, which the console's CSP forbids.)
    for _ in range(100):
        if await page.evaluate("window.__refreshes") >= 4:
            break
        await asyncio.sleep(0.1)
    assert await page.evaluate("window.__refreshes") >= 4
    assert await page.evaluate("window.__shift") == 0
    await _screenshot(page, "runs", tmp_path)


async def test_errors_grouped_and_resumed_by_keyboard(
    page: Page, served: str, store: Any, tmp_path: Path
) -> None:
    failed = await _failing_history(store)
    await page.goto(f"{served}/db/0/errors")
    await expect(page.locator("table.errors tbody tr")).to_have_count(2)
    await expect(page.locator("table.errors tbody tr").first).to_contain_text("order <n> not found")
    await _screenshot(page, "errors", tmp_path)
    # Every action is reachable from the keyboard: tab to the group's button, press Enter.
    for _ in range(60):
        await page.keyboard.press("Tab")
        if await page.evaluate("document.activeElement.textContent") == "Resume 3…":
            break
    else:
        pytest.fail("the group's Resume button is not reachable by Tab")
    await page.keyboard.press("Enter")
    await expect(page.locator("h1")).to_have_text("Resume 3 runs?")
    await page.click('button:has-text("Resume 3 runs")')
    await expect(page.locator("h1")).to_contain_text("3 done, 0 refused")
    for run_id in failed:
        record = await jobrun.get_job_run(store, run_id)
        assert record is not None
        assert record.status == "running"


async def test_activity_and_workers(page: Page, served: str, store: Any, tmp_path: Path) -> None:
    await _failing_history(store)
    registry = jobrun.JobRegistry()
    registry.register("shop", "quick", lambda p: jobrun.PassResult(done=True))
    for index in range(5):
        await jobrun.start_job_run(store, module_id="shop", job="quick", instance=f"q{index}")
    await jobrun.run_due_jobs(store, registry)
    held = await jobrun.start_job_run(store, module_id="shop", job="long", instance="a")
    driver = "worker-1/2 [jobrun host=web-7 boot=b pidns=1 pid=4121 start=9]"
    await _set(
        store,
        held.id,
        lease_owner="tok",
        lease_driver=driver,
        lease_began_at="2026-01-01T10:00:00.000Z",
        next_attempt_at="2999-01-01T00:00:00.000Z",
    )
    await page.goto(f"{served}/db/0/activity")
    await expect(page.locator("svg.chart rect.bar-started")).not_to_have_count(0)
    await expect(page.locator(".legend")).to_contain_text("finished 9")
    await _screenshot(page, "activity", tmp_path)
    await page.goto(f"{served}/db/0/workers")
    await expect(page.locator("table.workers tbody tr")).to_have_count(1)
    await expect(page.locator("table.workers tbody tr")).to_contain_text("web-7")
    await _screenshot(page, "workers", tmp_path)


async def test_narrow_and_dark(chromium: Path, served: str, store: Any, tmp_path: Path) -> None:
    await _failing_history(store)
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=str(chromium), headless=True)
        try:
            context = await browser.new_context(
                viewport={"width": 390, "height": 844}, color_scheme="dark"
            )
            narrow = await context.new_page()
            await narrow.goto(f"{served}/db/0/runs")
            # Dark mode follows the system setting; nothing is wider than the screen
            # but the runs table, which scrolls inside its own box.
            background = await narrow.evaluate("getComputedStyle(document.body).backgroundColor")
            assert background == "rgb(18, 22, 31)"
            width = await narrow.evaluate("document.documentElement.scrollWidth")
            assert width <= 390
            await _screenshot(narrow, "runs-narrow-dark", tmp_path)
        finally:
            await browser.close()
