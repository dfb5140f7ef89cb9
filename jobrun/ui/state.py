"""What every handler of one console shares, and the shortcuts handlers use to reach it."""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import parse_qs

from starlette.requests import Request

from jobrun.errors import CodeOutdatedError, SchemaOutdatedError
from jobrun.ui.databases import Database, upgrade_command
from jobrun.ui.security import Guard, Refused
from jobrun.ui.views import Pages

MAX_FORM_BYTES = 256 * 1024


@dataclass(frozen=True, slots=True)
class Console:
    guard: Guard
    pages: Pages
    databases: list[Database]


def console_of(request: Request) -> Console:
    console: Console = request.app.state.jobrun_console
    return console


def database_of(request: Request) -> Database:
    databases = console_of(request).databases
    index = request.path_params["db"]
    if not 0 <= index < len(databases):
        raise Refused(404, "no such database")
    return databases[int(index)]


def failure_text(error: BaseException, database: Database) -> str:
    """One line for a database that is down or broken, for the part of the page it owns."""
    if isinstance(error, SchemaOutdatedError):
        where = "has no jobrun schema" if error.found is None else f"is at {error.found}"
        return (
            f"this database {where}; this jobrun needs revision {error.expected}: "
            f"run {upgrade_command(database)}"
        )
    if isinstance(error, CodeOutdatedError):
        return error.message
    text = str(error).strip()
    line = text.splitlines()[0] if text else type(error).__name__
    return f"this database cannot be read: {line}"


async def form_of(request: Request) -> dict[str, list[str]]:
    """A url-encoded form body (parsed here: no multipart dependency for a few fields)."""
    declared = request.headers.get("content-length")
    if declared is not None and (not declared.isdigit() or int(declared) > MAX_FORM_BYTES):
        raise Refused(413, "the form is too large")
    body = await request.body()
    if len(body) > MAX_FORM_BYTES:
        raise Refused(413, "the form is too large")
    return parse_qs(body.decode("utf-8", "replace"), keep_blank_values=True)


def first(form: dict[str, list[str]]) -> dict[str, str]:
    return {name: values[0] for name, values in form.items() if values}
