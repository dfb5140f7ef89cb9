"""``create_app``: the console as an ASGI application a host serves or mounts."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles

from jobrun._core import is_number, refuse
from jobrun.ui.acting import bulk_act, bulk_confirm, run_action
from jobrun.ui.databases import Databases, databases_of
from jobrun.ui.hosts import AllowedHosts, HostGuard
from jobrun.ui.paths import checked_base_path
from jobrun.ui.reading import health_page, run_live, run_page, runs_page
from jobrun.ui.screens import activity_page, errors_page, workers_page
from jobrun.ui.security import Authorize, Guard, Refused
from jobrun.ui.state import Console, console_of
from jobrun.ui.views import HERE, Pages

DEFAULT_POLL_INTERVAL_S = 2.0


async def _home(request: Request) -> Response:
    base = request.scope.get("root_path", "").rstrip("/")
    return RedirectResponse(f"{base}/db/0/runs", status_code=303)


async def _to_base(request: Request) -> Response:
    base = request.scope.get("root_path", "").rstrip("/") + request.app.state.jobrun_base
    return RedirectResponse(f"{base}/", status_code=307)


class _GuardedFiles:
    """The static files, behind the same ``authorize(request, "view")`` as the pages."""

    def __init__(self, guard: Guard) -> None:
        self._guard = guard
        self._files = StaticFiles(directory=HERE / "static")

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await self._guard.require_view(Request(scope, receive))
        await self._files(scope, receive, send)


async def _refused(request: Request, error: Exception) -> Response:
    assert isinstance(error, Refused)
    context = {"message": error.message, "status": error.status}
    return await console_of(request).pages.render(request, "refused.html", context, error.status)


async def _http_error(request: Request, error: Exception) -> Response:
    assert isinstance(error, HTTPException)
    context = {"message": str(error.detail), "status": error.status_code}
    return await console_of(request).pages.render(
        request, "refused.html", context, error.status_code
    )


def create_app(
    databases: Databases,
    *,
    allowed_hosts: Iterable[str] | None = None,
    read_only: bool = False,
    authorize: Authorize | None = None,
    trusted_origins: Iterable[str] = (),
    base_path: str = "/",
    poll_interval_s: float = DEFAULT_POLL_INTERVAL_S,
) -> Starlette:
    """The operator console for ``databases``, as an ASGI app.

    ``databases`` maps a name to an ``AsyncEngine`` or a store (``SqlJobRunStore``,
    ``MemoryJobRunStore``), or lists them (named after their database). Serve it
    alone or mount it: ``host.mount("/jobs", create_app({"main": engine},
    allowed_hosts=["jobs.example.com"]))``; links follow the mount path. With
    ``base_path="/jobs"`` it serves itself under that path instead (and redirects
    ``/`` there).

    ``allowed_hosts`` are the host names (``"jobs.example.com"``, any port) or
    ``"host:port"`` pairs browsers reach the console by; a request naming another
    ``Host`` gets a one-line 400 (the defence against DNS rebinding). Without
    them the console shows but refuses every action, and says so on every page.
    ``read_only`` hides every action and refuses every POST. ``authorize(request,
    action)`` (plain or async) decides, per request, who may ``"view"`` (every
    page and static file) and who may ``"cancel"``, ``"resume"``, ``"release"`` or
    ``"start"``; without it, whoever reaches the app may do everything (put it
    behind the host's own authentication). ``trusted_origins`` are origins besides
    the request's own host a state change may come from (a proxy that rewrites
    the Host header).
    """
    if not is_number(poll_interval_s) or not 0.05 <= poll_interval_s <= 3600:
        raise refuse("poll_interval_s", f"must be in [0.05, 3600], got {poll_interval_s!r}")
    base = checked_base_path(base_path)
    hosts = None if allowed_hosts is None else AllowedHosts.of(allowed_hosts)
    found = databases_of(databases)
    guard = Guard(
        read_only=read_only,
        authorize=authorize,
        allowed_hosts=hosts,
        trusted_origins=trusted_origins,
    )
    pages = Pages.build(guard, found, int(poll_interval_s * 1000))
    console = Starlette(
        routes=_routes(guard),
        exception_handlers={Refused: _refused, HTTPException: _http_error},
    )
    console.state.jobrun_console = Console(guard, pages, found)
    app = console
    if base:
        app = Starlette(routes=[Route("/", _to_base), Mount(base, app=console)])
        app.state.jobrun_base = base
    if hosts is not None:
        app.add_middleware(HostGuard, allowed=hosts)
    return app


def _routes(guard: Guard) -> list[BaseRoute]:
    """Every page and action of the console; static files are guarded too."""
    return [
        Route("/", _home),
        Route("/health", health_page),
        Route("/db/{db:int}/runs", runs_page),
        Route("/db/{db:int}/activity", activity_page),
        Route("/db/{db:int}/workers", workers_page),
        Route("/db/{db:int}/errors", errors_page),
        Route("/db/{db:int}/runs/{run_id}", run_page),
        Route("/db/{db:int}/runs/{run_id}/live", run_live),
        Route("/db/{db:int}/runs/{run_id}/{action}", run_action, methods=["POST"]),
        Route("/db/{db:int}/bulk", bulk_confirm),
        Route("/db/{db:int}/bulk", bulk_act, methods=["POST"]),
        Mount("/static", app=_GuardedFiles(guard)),
    ]
