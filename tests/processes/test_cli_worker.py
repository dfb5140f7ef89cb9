"""``jobrun worker``'s options, with the worker itself replaced (jobrun/_cli/commands/worker.py).

The worker running for real under the command is in ``test_worker.py``."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.processes.cli_support import CLI_APP, fails, file_url, ok


def test_the_worker_prunes_other_apps_jobs_only_when_told(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--prune-after`` is for the app's own jobs; the others need their own option."""
    from jobrun._cli.commands import worker as worker_command

    url = file_url(tmp_path / "retention.db")
    ok("db", "upgrade", "--url", url)
    given: list[dict[str, Any]] = []

    async def fake_worker(*args: Any, **options: Any) -> None:
        given.append(options)

    monkeypatch.setattr(worker_command, "run_worker", fake_worker)
    app = ("worker", "--app", CLI_APP, "--url", url)
    ok(*app, "--prune-after", "30d")
    ok(*app, "--prune-after", "30d", "--prune-unregistered-after", "400d")
    assert [(seen["prune_after"], seen["prune_unregistered_after"]) for seen in given] == [
        (timedelta(days=30), None),
        (timedelta(days=30), timedelta(days=400)),
    ]
    refused = fails(2, *app, "--prune-unregistered-after", "soon")
    assert "--prune-unregistered-after" in refused.output
    assert "--prune-unregistered-after" in ok("worker", "--help").output
