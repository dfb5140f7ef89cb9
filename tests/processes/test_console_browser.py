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
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from playwright.async_api import Page, async_playwright, expect
from sqlalchemy.ext.asyncio import create_async_engine

import jobrun
from jobrun._core.model.formats import format_instant
from jobrun._core.model.worker_rows import WorkerRow, jobs_text
from jobrun._core.operator.worker_registry import beat_row
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
    # The list shows a short id; the link holds the whole one.
    await page.click(f'a[title="{target.id}"]')
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
    # An idle worker's own row, and a due run of a job no live worker registers.
    blank = WorkerRow(
        "idle", "web-9:77", "web-9", 77, jobs_text([("shop", "quick"), ("shop", "long")]),
        format_instant(datetime.now(UTC)), "", "",
    )  # fmt: skip
    await store.beat_worker(beat_row(blank, datetime.now(UTC), 60.0))
    await jobrun.start_job_run(store, module_id="shop", job="quik", instance="typo")
    await page.goto(f"{served}/db/0/workers")
    await expect(page.locator("table.workers tbody tr")).to_have_count(1)
    await expect(page.locator("table.workers tbody tr")).to_contain_text("web-7")
    await expect(page.locator("table.registered tbody tr")).to_contain_text("idle")
    await expect(page.locator("ul.unserved")).to_contain_text("shop / quik")
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


# -- the console at 1280 and 390 px (issue 33 item 9) ------------------------------------------

_BOXES = """
(selectors) => {
  const inside = (element) => {
    const box = element.getBoundingClientRect();
    const empty = !element.textContent.trim() && !element.querySelector("progress");
    // Text spilling out of its own cell (over the next row or column) is not in sight.
    const spills = element.scrollWidth > element.clientWidth + 1
      || element.scrollHeight > element.clientHeight + 1;
    return {
      left: box.left, right: box.right, width: box.width, height: box.height, empty, spills,
    };
  };
  const rows = [...document.querySelectorAll("table.runs tbody tr")].map((row) => ({
    height: row.getBoundingClientRect().height,
    cells: Object.fromEntries(
      selectors.map((s) => [s, row.querySelector(s) && inside(row.querySelector(s))])),
  }));
  const boxes = [...document.querySelectorAll(".table-box")].map(
    (box) => [box.scrollWidth, box.clientWidth]);
  const error = document.querySelector("pre.error-text");
  return {
    rows, boxes, error: error && inside(error),
    page: document.documentElement.scrollWidth, viewport: window.innerWidth,
  };
}
"""
# What must stay in sight on the runs list at every width: status, key, progress, next, error.
_KEPT = ["td.status-cell", "td.run-key", "td.progress-cell", "td.next", "td.error-text"]
_LONG_ERROR = (
    "ValueError: the upstream answered 502 for https://api.example.com/v2/orders/"
    "4411/lines?expand=customer,shipments,invoices&page=17 after 3 tries; giving up on it"
)


async def _layout_history(store: Any) -> tuple[str, str]:
    """Failed runs with long errors, a running run with progress (due: no worker
    registers its job, so flagged), one backing off; one failed run's id and error."""
    failed = await _failing_history(store)
    await _set(store, failed[0], last_error=_LONG_ERROR)
    live = await jobrun.start_job_run(store, module_id="shop", job="reindex", instance="all")
    await _set(store, live.id, counters='{"total": 1000, "done": 250}')
    later = await jobrun.start_job_run(store, module_id="shop", job="sync", instance="retry")
    await _set(
        store,
        later.id,
        attempts=2,
        last_error="OSError: connection reset by peer",
        next_attempt_at=format_instant(datetime.now(UTC) + timedelta(minutes=40)),
    )
    return failed[0], _LONG_ERROR


def _check_boxes(found: dict[str, Any], width: int) -> None:
    assert found["page"] <= width, ("the page scrolls sideways", found["page"], width)
    for scroll_width, client_width in found["boxes"]:
        assert scroll_width <= client_width, ("a table overflows its box", scroll_width)
    assert len(found["rows"]) == 6
    # Each of them has something to show on some row: progress, next and an error.
    for selector in _KEPT:
        assert any(not row["cells"][selector]["empty"] for row in found["rows"]), selector
    for row in found["rows"]:
        for selector in _KEPT:
            box = row["cells"][selector]
            assert box is not None, selector
            assert box["width"] > 0 or box["empty"], (selector, "hidden", width)
            assert not box["spills"], (selector, "spills out of its cell", width)
            assert box["left"] >= 0, (selector, box, width)
            assert box["right"] <= width, (selector, box, width)
        # No row turns into a tall blank band (a cut error wrapping word by word).
        assert row["height"] < 160, (row, width)


@pytest.mark.parametrize("width", [1280, 390])
async def test_runs_and_run_pages_keep_what_matters_in_sight(
    chromium: Path, served: str, store: Any, tmp_path: Path, width: int
) -> None:
    failed_id, error = await _layout_history(store)
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=str(chromium), headless=True)
        try:
            context = await browser.new_context(viewport={"width": width, "height": 900})
            shown = await context.new_page()
            await shown.goto(f"{served}/db/0/runs")
            await expect(shown.locator("table.runs tbody tr")).to_have_count(6)
            await expect(shown.locator(".unserved")).not_to_have_count(0)
            _check_boxes(await shown.evaluate(_BOXES, _KEPT), width)
            await _screenshot(shown, "runs" if width == 1280 else "runs-narrow", tmp_path)
            await shown.goto(f"{served}/db/0/runs/{failed_id}")
            await expect(shown.locator("pre.error-text")).to_have_text(error)
            found = await shown.evaluate(_BOXES, _KEPT)
            assert found["page"] <= width
            box = found["error"]
            assert box["left"] >= 0, (box, width)
            assert box["right"] <= width, (box, width)
        finally:
            await browser.close()
