"""``jobrun worker --loop``: uvloop when installed (the ``speed`` extra), else asyncio's own."""

from __future__ import annotations

import asyncio
import importlib.util

import click
import pytest

from jobrun._cli import event_loop
from jobrun._cli.event_loop import loop_factory, run_on

HAS_UVLOOP = importlib.util.find_spec("uvloop") is not None


async def _loop_module() -> str:
    return type(asyncio.get_running_loop()).__module__


def test_asyncio_asked_for_is_the_standard_loop_even_where_uvloop_is_installed() -> None:
    assert loop_factory("asyncio") is None
    assert run_on("asyncio", _loop_module()).startswith("asyncio")


def test_auto_without_uvloop_is_the_standard_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(event_loop.importlib.util, "find_spec", lambda name: None)
    assert loop_factory("auto") is None
    assert run_on("auto", _loop_module()).startswith("asyncio")


def test_uvloop_asked_for_but_missing_names_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing(name: str) -> object:
        raise ImportError(f"No module named {name!r}")

    monkeypatch.setattr(event_loop.importlib, "import_module", missing)
    with pytest.raises(click.UsageError, match=r"pip install 'jobrun\[speed\]'.*--loop asyncio"):
        loop_factory("uvloop")


@pytest.mark.skipif(not HAS_UVLOOP, reason="uvloop is not installed (the speed extra)")
@pytest.mark.parametrize("choice", ["auto", "uvloop"])
def test_uvloop_runs_the_worker_loop_when_installed(choice: str) -> None:
    assert run_on(choice, _loop_module()).startswith("uvloop")
