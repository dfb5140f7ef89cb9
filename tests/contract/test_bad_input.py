"""Input that must be refused before anything is written, input that must be stored exactly,
and a database nobody migrated."""

from __future__ import annotations

import dataclasses
import enum
import math
import re
from collections import OrderedDict
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any, cast
from uuid import UUID

import pytest
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

import jobrun
from jobrun._core.port import StoreLimits
from jobrun.sql.schema import job_runs as runs_table
from jobrun.testing import FakeClock, MemoryJobRunStore
from tests.support import sized_store, start

# --- helpers -----------------------------------------------------------------------------


async def assert_nothing_written(store: Any, engine: AsyncEngine | None) -> None:
    assert await jobrun.job_runs(store) == []
    if engine is not None:
        async with engine.connect() as connection:
            count = (
                await connection.execute(select(func.count()).select_from(runs_table))
            ).scalar_one()
        assert count == 0


# --- the key -------------------------------------------------------------------------------


@pytest.mark.parametrize("field", ["module_id", "job"])
@pytest.mark.parametrize(
    ("value", "error"),
    [
        ("", jobrun.JobValidationError),
        (None, TypeError),
        (5, TypeError),
        (b"crm", TypeError),
        (["crm"], TypeError),
    ],
    ids=["empty", "none", "int", "bytes", "list"],
)
async def test_module_id_and_job_must_be_non_empty_strings(store, engine, field, value, error):
    with pytest.raises(error, match=field):
        await start(store, **{field: value})
    await assert_nothing_written(store, engine)


@pytest.mark.parametrize("value", [None, 5, b"default", ("a",)], ids=repr)
async def test_instance_must_be_a_string(store, engine, value):
    with pytest.raises(TypeError, match="instance"):
        await start(store, instance=value)
    await assert_nothing_written(store, engine)


# --- queue safety --------------------------------------------------------------------------


class Colour(enum.Enum):
    RED = "red"


class Label(enum.StrEnum):
    A = "a"


class Options(dict):  # type: ignore[type-arg]
    pass


@dataclasses.dataclass
class Point:
    x: int


class Plain:
    pass


def make_dict_cycle() -> dict[str, Any]:
    outer: dict[str, Any] = {"items": [{"name": "leaf"}]}
    outer["items"].append({"back": outer})
    return outer


def make_list_cycle() -> list[Any]:
    loop: list[Any] = [1]
    loop.append(loop)
    return loop


UNSAFE = [
    ({"source": {"bytes": b"\x00\x01"}}, "payload.source.bytes"),
    ({"buffer": bytearray(b"x")}, "payload.buffer"),
    ({"steps": [1, (2, 3)]}, "payload.steps.1"),
    ((1, 2), "payload"),
    ({"tags": {"a", "b"}}, "payload.tags"),
    ({"tags": frozenset()}, "payload.tags"),
    (datetime(2026, 1, 1, tzinfo=UTC), "payload"),
    ({"when": {"day": date(2026, 1, 1)}}, "payload.when.day"),
    ({"price": Decimal("1.50")}, "payload.price"),
    ({"id": UUID(int=1)}, "payload.id"),
    ({"options": Options(a=1)}, "payload.options"),
    ({"options": OrderedDict(a=1)}, "payload.options"),
    ({"m": {1: "one"}}, "payload.m.1"),
    ({"m": {("a", "b"): 1}}, "payload.m.('a', 'b')"),
    ({"ratio": math.nan}, "payload.ratio"),
    ({"xs": [0.5, math.inf]}, "payload.xs.1"),
    (-math.inf, "payload"),
    (make_dict_cycle(), "payload.items.1.back"),
    (make_list_cycle(), "payload.1"),
    ({"callback": print}, "payload.callback"),
    ({"callback": lambda: 1}, "payload.callback"),
    ({"point": Point(1)}, "payload.point"),
    ({"thing": Plain()}, "payload.thing"),
    ({"colour": Colour.RED}, "payload.colour"),
    ({"label": Label.A}, "payload.label"),
    # Depth first, in order: the first violation is the one reported.
    ({"a": {"b": [1, {"c": b"first"}]}, "z": b"second"}, "payload.a.b.1.c"),
]


@pytest.mark.parametrize(("payload", "path"), UNSAFE, ids=[path for _, path in UNSAFE])
async def test_unsafe_payload_is_refused_with_its_path(store, engine, payload, path):
    with pytest.raises(jobrun.JobValidationError) as caught:
        await start(store, payload=payload)

    error = caught.value
    assert error.code == "validation_failed"
    assert isinstance(error, jobrun.JobRunError)
    assert len(error.errors) == 1
    assert error.errors[0]["path"] == path
    assert set(error.errors[0]) == {"path", "message"}
    assert isinstance(error.errors[0]["message"], str)
    assert error.errors[0]["message"]
    assert path in str(error)
    await assert_nothing_written(store, engine)


async def test_a_shared_sub_object_is_not_a_cycle(store):
    shared = {"id": "s-1"}
    payload = {"left": shared, "right": [shared, shared]}

    run = await start(store, payload=payload)

    assert run.payload == {"left": {"id": "s-1"}, "right": [{"id": "s-1"}, {"id": "s-1"}]}


async def test_deeply_nested_payload_is_refused_not_a_crash(store, engine):
    deep: Any = "leaf"
    for _ in range(5000):
        deep = [deep]

    with pytest.raises(jobrun.JobValidationError):
        await start(store, payload=deep)
    await assert_nothing_written(store, engine)


# --- the payload cap -----------------------------------------------------------------------


@pytest.fixture
def capped_store(store: Any, engine: AsyncEngine | None) -> Any:
    """A store of the same backend whose payloads may be at most 100 bytes of JSON."""
    return sized_store(store, engine, max_payload_bytes=100)


@pytest.mark.parametrize(
    ("payload", "size"),
    [("x" * 99, 101), ("é" * 50, 102), ({"k": "v" * 200}, 208)],
    ids=["ascii", "utf8-bytes", "object"],
)
async def test_payload_over_the_cap_is_refused(capped_store, engine, payload, size):
    with pytest.raises(jobrun.JobValidationError) as caught:
        await start(capped_store, payload=payload)

    # The message names the cap and a size over it (at most the real size: encoding
    # may stop as soon as the cap is passed).
    message = str(caught.value)
    assert "100-byte cap" in message
    named = re.search(r"(\d+) bytes of JSON", message)
    assert named is not None
    assert 100 < int(named.group(1)) <= size
    assert caught.value.errors[0]["path"] == "payload"
    await assert_nothing_written(capped_store, engine)


@pytest.mark.parametrize("payload", ["x" * 98, "é" * 49], ids=["ascii", "utf8-bytes"])
async def test_payload_exactly_at_the_cap_is_accepted(capped_store, payload):
    run = await start(capped_store, payload=payload)
    assert run.payload == payload
    assert (await jobrun.get_job_run(capped_store, run.id)).payload == payload


# --- registration --------------------------------------------------------------------------


def test_registering_a_job_twice_is_a_conflict():
    registry = jobrun.JobRegistry()
    registry.register("crm", "import", lambda p: None)

    with pytest.raises(jobrun.JobConflictError, match="import") as caught:
        registry.register("crm", "import", lambda p: None)

    assert caught.value.code == "conflict"
    assert len(registry) == 1


def test_the_decorator_form_refuses_a_duplicate_too():
    registry = jobrun.JobRegistry()

    @registry.job("crm", "import")
    def first(p: jobrun.JobPass) -> None:
        return None

    assert first.__name__ == "first"  # the decorator hands the function back
    with pytest.raises(jobrun.JobConflictError):

        @registry.job("crm", "import")
        def second(p: jobrun.JobPass) -> None:
            return None

    assert registry.get("crm", "import").handler is first
    registry.register("crm", "export", lambda p: None)  # another name is fine
    assert len(registry) == 2


def test_the_registry_key_is_a_pair_not_a_joined_string():
    registry = jobrun.JobRegistry()
    registry.register("a/b", "c", lambda p: "one")
    registry.register("a", "b/c", lambda p: "two")
    assert registry.get("a/b", "c") is not registry.get("a", "b/c")


@pytest.mark.parametrize(
    ("module_id", "name", "handler", "error"),
    [
        ("", "import", lambda p: None, jobrun.JobValidationError),
        ("crm", "", lambda p: None, jobrun.JobValidationError),
        (None, "import", lambda p: None, TypeError),
        ("crm", 3, lambda p: None, TypeError),
        ("crm", "import", "not callable", TypeError),
    ],
    ids=["empty-module", "empty-name", "none-module", "int-name", "not-callable"],
)
def test_registration_checks_its_arguments(module_id, name, handler, error):
    registry = jobrun.JobRegistry()
    with pytest.raises(error):
        registry.register(module_id, name, handler)
    assert len(registry) == 0


# --- awkward strings are data ----------------------------------------------------------------

# Named ids: ids made of the texts themselves (quotes, spaces, escapes) are not found again
# when a tool (mutmut) passes them back to pytest on its command line.
AWKWARD = {
    "apostrophe": "it's",
    "double-quotes": 'say "hi"',
    "percent-suffix": "100%",
    "percent": "%",
    "underscore": "_",
    "semicolon": "a;b",
    "sql-comment": "x -- y",
    "sql-injection": "'; DROP TABLE _substrat_job_runs; --",
    "pyformat": "%(x)s",
    "format": "%s",
    "qmark": "?",
    "named": ":name",
    "numeric": "$1",
    "backslash": "back\\slash",
    "tab": "tab\there",
    "newline": "new\nline",
    "control-characters": "ctl\x01\x1f\x7f",
    "unicode": "ünïcödé ✓ 日本語",
    "emoji": "🚀 emoji",
    "padded": " padded ",
}


@pytest.mark.parametrize("text", AWKWARD.values(), ids=AWKWARD.keys())
async def test_awkward_strings_are_stored_and_matched_exactly(store, clock, text):
    payload = {"text": text, text: [text], "nul": "a\x00b"}
    decoys = [
        await jobrun.start_job_run(store, module_id=text + "z", job=text, clock=clock),
        await jobrun.start_job_run(store, module_id="plain", job="plain", clock=clock),
    ]

    run = await jobrun.start_job_run(
        store, module_id=text, job=text, instance=text, payload=payload, clock=clock
    )
    joined = await jobrun.start_job_run(
        store, module_id=text, job=text, instance=text, payload="other", clock=clock
    )

    assert (run.module_id, run.job, run.instance, run.payload) == (text, text, text, payload)
    assert joined.id == run.id
    assert joined.payload == payload
    assert run.id not in {decoy.id for decoy in decoys}
    assert [r.id for r in await jobrun.job_runs(store, module_id=text)] == [run.id]
    assert [r.id for r in await jobrun.job_runs(store, instance=text)] == [run.id]
    assert [r.id for r in await jobrun.job_runs(store, job=text, module_id=text)] == [run.id]
    assert await jobrun.job_runs(store, module_id=text, instance="default") == []
    assert await jobrun.get_job_run(store, run.id) == run

    # A handler registered under the same strings drives it, and sees them unchanged.
    registry = jobrun.JobRegistry()
    seen: list[Any] = []

    def handler(p: jobrun.JobPass) -> jobrun.PassResult:
        seen.append((p.run.module_id, p.run.job, p.run.instance, p.payload))
        return jobrun.PassResult(cursor=text, done=True)

    registry.register(text, text, handler)
    report = await jobrun.run_due_jobs(store, registry, clock=clock)
    assert (report.attempted, report.completed) == (1, 1)
    assert seen == [(text, text, text, payload)]
    finished = await jobrun.get_job_run(store, run.id)
    assert finished is not None
    assert (finished.status, finished.cursor) == ("done", text)


# --- a database nobody migrated --------------------------------------------------------------


async def check_unmigrated(engine: AsyncEngine) -> None:
    store = jobrun.SqlJobRunStore(engine)
    registry = jobrun.JobRegistry()
    registry.register("crm", "import", lambda p: jobrun.PassResult(done=True))

    with pytest.raises(jobrun.SchemaOutdatedError) as caught:
        await jobrun.run_due_jobs(store, registry)
    message = str(caught.value)
    assert "jobrun.upgrade" in message
    assert "jobrun db upgrade --url" in message
    assert "alembic" not in message  # alembic.ini is in jobrun's checkout, not its wheel
    assert caught.value.code == "schema_outdated"

    with pytest.raises(jobrun.SchemaOutdatedError):
        await start(store)
    with pytest.raises(jobrun.SchemaOutdatedError):
        await jobrun.job_runs(store)

    # Once migrated, the very same store works.
    await jobrun.upgrade(engine)
    run = await start(store)
    report = await jobrun.run_due_jobs(store, registry)
    assert (report.attempted, report.completed) == (1, 1)
    assert (await jobrun.get_job_run(store, run.id)).status == "done"


async def test_an_unmigrated_sqlite_database_names_the_command_to_run(tmp_path: Path):
    engine = create_async_engine(f"sqlite+aiosqlite:///{tmp_path / 'empty.db'}")
    try:
        await check_unmigrated(engine)
    finally:
        await engine.dispose()


@pytest.mark.postgres
async def test_an_unmigrated_postgres_database_names_the_command_to_run(empty_postgres_url):
    engine = create_async_engine(empty_postgres_url)
    try:
        await check_unmigrated(engine)
    finally:
        await engine.dispose()


async def test_a_long_refused_name_is_shown_cut_after_40_characters() -> None:
    with pytest.raises(jobrun.JobValidationError) as caught:
        await jobrun.start_job_run(MemoryJobRunStore(), module_id="m", job="a" * 600)
    assert str(caught.value) == (
        f"job '{'a' * 40}...' is 600 bytes of UTF-8, over the 512-byte limit for names"
    )
    with pytest.raises(jobrun.JobValidationError) as caught:
        await jobrun.start_job_run(MemoryJobRunStore(), module_id="m", job="b" * 39 + "\x00")
    assert str(caught.value).startswith(f"job '{'b' * 39}\\x00' contains a NUL")


async def test_operator_refusals_say_what_was_wrong(store: Any, clock: FakeClock) -> None:
    with pytest.raises(jobrun.JobValidationError) as caught:
        await jobrun.cancel_job_run(store, "R", "  ", clock=clock)
    assert caught.value.errors == [{"path": "reason", "message": "empty or not a str"}]
    with pytest.raises(jobrun.JobRunNotFoundError) as missing:
        await jobrun.cancel_job_run(store, "NO-SUCH-RUN", "why", clock=clock)
    assert missing.value.run_id == "NO-SUCH-RUN"
    run = await jobrun.start_job_run(store, module_id="m", job="j", clock=clock)
    await jobrun.cancel_job_run(store, run.id, "first", clock=clock)
    with pytest.raises(jobrun.JobConflictError) as conflict:
        await jobrun.cancel_job_run(store, run.id, "again", clock=clock)
    assert str(conflict.value) == f"run {run.id} is failed, not running; nothing to cancel"
    with pytest.raises(jobrun.JobValidationError) as caught:
        await jobrun.prune_job_runs(store, older_than=timedelta(days=1), statuses=("running",))
    assert caught.value.errors == [{"path": "statuses", "message": "not prunable: ['running']"}]
    with pytest.raises(TypeError, match=r"^older_than must be a timedelta or datetime, got int$"):
        await jobrun.prune_job_runs(store, older_than=cast(Any, 5))


async def test_a_run_id_that_cannot_be_stored_is_named_as_the_run_id() -> None:
    with pytest.raises(jobrun.JobValidationError) as caught:
        await jobrun.cancel_job_run(MemoryJobRunStore(), "R\x00", "why")
    assert caught.value.errors == [
        {"path": "run_id", "message": "contains a NUL character (Postgres cannot store it)"}
    ]
    assert str(caught.value).startswith("run_id 'R\\x00' contains a NUL")


@pytest.mark.parametrize(
    "name", ["max_payload_bytes", "max_cursor_bytes", "max_step_result_bytes", "max_counters_bytes"]
)
def test_every_store_limit_is_checked_by_its_own_name(name: str) -> None:
    assert getattr(StoreLimits(**{name: 1}), name) == 1  # one byte is a limit
    for bad in (0, -5, "100", True, 1.5):
        with pytest.raises(ValueError, match=rf"^{name} must be a positive int, got {bad!r}$"):
            StoreLimits(**{name: bad})
