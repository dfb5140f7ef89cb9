"""``help()`` answers the first questions: what a pass offers, what a report counts."""

from __future__ import annotations

import dataclasses
import pydoc

import jobrun


def _help(thing: object) -> str:
    return pydoc.render_doc(thing, renderer=pydoc.plaintext)


def test_help_of_job_pass_lists_what_a_handler_uses() -> None:
    text = _help(jobrun.JobPass)
    for name in ("payload", "cursor", "counters", "run", "step", "count", "scope"):
        assert f"``{name}" in text or f"{name}(" in text, name
    assert "sync, or returning an" in text  # step's fn may be sync or async
    step = _help(jobrun.JobPass.step)
    # What a failed step does to the pass, and what retry= changes.
    assert "the pass fails and the run is" in step
    assert "retried after a backoff" in step
    assert "a step policy replaces it" in step


def test_every_drive_report_and_health_field_says_what_it_counts() -> None:
    for record in (jobrun.JobDriveReport, jobrun.JobRunHealth):
        doc = record.__doc__ or ""
        for field in dataclasses.fields(record):
            assert f"``{field.name}``:" in doc, (record.__name__, field.name)
    report = jobrun.JobDriveReport.__doc__ or ""
    assert "``attempted``: runs claimed" in report
    assert "every other number counts PASSES" in report
