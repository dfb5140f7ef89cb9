"""``jobrun start --from-file`` (JSON lines), ``--at``/``--in`` and "starts at" (issue 34)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.processes.cli_support import APP, fails, ok
from tests.support import SQL_BACKENDS


@pytest.fixture(params=SQL_BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    """Only the SQL backends: the command line always speaks to a database."""
    return str(request.param)


def runs_listed(url: str) -> list[dict[str, object]]:
    return list(json.loads(ok("runs", "--url", url, "--json").stdout))


def test_from_file_starts_one_run_per_line_and_says_which_joined(
    database_url: str, tmp_path: Path
) -> None:
    ok("start", "--url", database_url, "shop", "walk", "-i", "b")
    lines = [
        '{"module_id": "shop", "job": "walk", "instance": "a", "payload": {"n": 1}}',
        "",
        '{"module_id": "shop", "job": "walk", "instance": "b", "priority": 5}',
        '{"module_id": "shop", "job": "walk", "instance": "a", "payload": {"n": 2}}',
        '{"module_id": "shop", "job": "walk", "instance": "c", "start_at": "2999-01-01T00:00:00Z"}',
    ]
    source = tmp_path / "starts.jsonl"
    source.write_text("\n".join(lines) + "\n", encoding="utf-8")

    said = ok("start", "--url", database_url, "--from-file", str(source)).stdout.splitlines()

    assert [line.split()[0] for line in said] == ["started", "joined", "started", "started"]
    assert said[0].split()[1] == said[2].split()[1]  # one key twice: one run
    assert said[3].endswith("(starts at 2999-01-01 00:00:00 UTC)")
    assert len(runs_listed(database_url)) == 3


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        ("{not json", "line 2: not valid JSON"),
        ("[1, 2]", "line 2: must be a JSON object, got list"),
        ('{"module_id": "shop"}', "line 2: job is missing"),
        ('{"module_id": "shop", "job": "w", "colour": 1}', "line 2: unknown key 'colour'"),
        ('{"module_id": "shop", "job": ""}', "line 2: job"),
        ('{"module_id": "shop", "job": "w", "priority": 1e99}', "line 2: priority"),
        ('{"module_id": "shop", "job": "w", "start_at": "2030-01-01"}', "line 2: start_at"),
        ('{"module_id": "shop", "job": "w", "start_at": "soon"}', "line 2: start_at"),
    ],
)
def test_a_bad_line_is_named_and_nothing_is_started(
    database_url: str, tmp_path: Path, line: str, problem: str
) -> None:
    source = tmp_path / "starts.jsonl"
    good = '{"module_id": "shop", "job": "walk"}'
    source.write_text(f"{good}\n{line}\n{good}\n", encoding="utf-8")

    refused = fails(2, "start", "--url", database_url, "--from-file", str(source))

    assert f"{source} {problem}" in refused.output
    assert runs_listed(database_url) == []


def test_in_and_at_start_later_and_show_says_when(database_url: str) -> None:
    later = ok("start", "--url", database_url, "shop", "walk", "--in", "3600").stdout
    assert later.split()[0] == "started"
    assert "(starts at " in later
    run_id = later.split()[1]
    shown = ok("show", "--url", database_url, run_id).stdout
    assert "starts at" in shown

    at = ok(
        "start",
        "--url",
        database_url,
        "shop",
        "walk",
        "-i",
        "x",
        "--at",
        "2999-01-02T03:04:05+01:00",
    )
    assert at.stdout.strip().endswith("(starts at 2999-01-02 02:04:05 UTC)")


@pytest.mark.parametrize(
    ("given", "problem"),
    [
        (["--at", "2030-01-01T00:00:00"], "has no offset"),
        (["--at", "tomorrow"], "is not an ISO 8601 instant"),
        (["--in", "-5"], "--in"),
        (["--in", "5", "--at", "2030-01-01T00:00:00Z"], "delay_s cannot be given with start_at"),
    ],
)
def test_a_bad_later_start_is_refused(database_url: str, given: list[str], problem: str) -> None:
    refused = fails(2, "start", "--url", database_url, "shop", "walk", *given)
    assert problem in refused.output
    assert runs_listed(database_url) == []


def test_from_file_takes_no_single_start_arguments(database_url: str, tmp_path: Path) -> None:
    source = tmp_path / "starts.jsonl"
    source.write_text("", encoding="utf-8")
    refused = fails(2, "start", "--url", database_url, "shop", "walk", "--from-file", str(source))
    assert "--from-file takes the starts from FILE" in refused.output
    assert "give MODULE and JOB" in fails(2, "start", "--url", database_url).output


def test_start_says_started_then_joined(database_url: str) -> None:
    first = ok("start", "--url", database_url, "shop", "walk", "--payload", '{"shop": 42}')
    verb, run_id = first.stdout.split()
    assert verb == "started"
    again = ok("start", "--url", database_url, "shop", "walk", "--payload", '{"shop": 7}')
    assert again.stdout.split() == ["joined", run_id]
    other = ok("start", "--url", database_url, "shop", "walk", "--instance", "b")
    assert other.stdout.split()[0] == "started"
    assert other.stdout.split()[1] != run_id
    shown = json.loads(ok("show", "--url", database_url, run_id, "--json").stdout)
    assert shown["run"]["payload"] == {"shop": 42}  # the live run's payload won


def test_start_with_app_refuses_a_job_the_registry_lacks(database_url: str) -> None:
    refused = fails(2, "start", "--url", database_url, "demo", "pagse", "--app", APP)
    assert "registers no job demo/pagse; did you mean demo/pages?" in refused.stderr
    far = fails(2, "start", "--url", database_url, "shop", "zzz", "--app", APP)
    assert "registers no job shop/zzz (it registers" in far.stderr
    # Nothing was written: the runs list is empty.
    assert json.loads(ok("runs", "--url", database_url, "--json").stdout) == []
    started = ok("start", "--url", database_url, "demo", "pages", "--app", APP)
    assert started.stdout.split()[0] == "started"
    assert "warning" not in started.stderr


def test_start_without_app_warns_that_the_name_is_unchecked(database_url: str) -> None:
    started = ok("start", "--url", database_url, "shop", "heartbeet")
    assert started.stdout.split()[0] == "started"
    assert "shop/heartbeet is not checked against any registry" in started.stderr
