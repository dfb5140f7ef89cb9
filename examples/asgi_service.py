"""An ASGI service (Starlette) that starts job runs and drives them in the background.

    pip install starlette uvicorn
    JOBRUN_DATABASE_URL=sqlite+aiosqlite:///service.db uvicorn asgi_service:app --app-dir examples

``POST /exports/{customer}`` starts the export of one customer's orders (or joins
the export already running for that customer) and answers with the run's id.
``GET /runs/{run_id}`` shows how far it got. The runs are driven by
``jobrun.run_worker``, started in the app's lifespan and stopped gracefully at
shutdown: nothing new is claimed, and a pass in flight finishes first.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from sqlalchemy.ext.asyncio import create_async_engine
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

import jobrun

registry = jobrun.JobRegistry()
BATCHES = 4


@registry.job("shop", "export-orders")
async def export_orders(p: jobrun.JobPass) -> jobrun.PassResult:
    batch = p.cursor or 0
    customer = p.payload["customer"]
    orders = await p.step(f"fetch-{batch}", lambda: fetch_orders(customer, batch))
    # Keyed by customer and batch, so writing it twice after a crash is harmless.
    await p.step(f"write-{batch}", lambda: write_export(customer, batch, orders))
    p.count("orders", len(orders))
    return jobrun.PassResult(cursor=batch + 1, done=batch + 1 >= BATCHES)


async def fetch_orders(customer: str, batch: int) -> list[dict[str, object]]:
    await asyncio.sleep(0.01)  # an HTTP call or a query in a real service
    return [{"customer": customer, "order": batch * 25 + n} for n in range(25)]


async def write_export(customer: str, batch: int, orders: list[dict[str, object]]) -> int:
    return len(orders)  # an upsert keyed by (customer, batch) in a real service


async def start_export(request: Request) -> JSONResponse:
    try:
        run = await jobrun.start_job_run(
            request.app.state.store,
            module_id="shop",
            job="export-orders",
            instance=request.path_params["customer"],
            payload={"customer": request.path_params["customer"]},
        )
    except jobrun.JobValidationError as error:
        return JSONResponse({"error": str(error), "errors": error.errors}, status_code=422)
    return JSONResponse({"run_id": run.id, "status": run.status}, status_code=202)


async def show_run(request: Request) -> JSONResponse:
    run = await jobrun.get_job_run(request.app.state.store, request.path_params["run_id"])
    if run is None:
        return JSONResponse({"error": "no such run"}, status_code=404)
    return JSONResponse(
        {
            "run_id": run.id,
            "status": run.status,
            "counters": run.counters,
            "last_error": run.last_error,
        }
    )


def create_app(database_url: str, poll_interval_s: float = 1.0) -> Starlette:
    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        engine = create_async_engine(database_url)
        await jobrun.upgrade(engine)  # create or migrate jobrun's tables
        app.state.store = jobrun.SqlJobRunStore(engine)
        stop = asyncio.Event()
        app.state.worker = asyncio.create_task(
            jobrun.run_worker([engine], registry, stop=stop, interval_s=poll_interval_s)
        )
        try:
            yield
        finally:
            stop.set()  # no new passes; the one in flight finishes and commits
            await app.state.worker
            await engine.dispose()

    routes = [
        Route("/exports/{customer}", start_export, methods=["POST"]),
        Route("/runs/{run_id}", show_run),
    ]
    return Starlette(routes=routes, lifespan=lifespan)


app = create_app(os.environ.get("JOBRUN_DATABASE_URL", "sqlite+aiosqlite:///service.db"))
