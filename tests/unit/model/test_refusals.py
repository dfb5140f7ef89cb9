"""One way to refuse bad input (issue 22, item 5): every refusal is made in
``jobrun/_core/model/refusals.py``, and the checks that recur are spelled there once.

The guard tests scan ``jobrun/`` and fail when a refusal is spelled a second
time: an error of the validation family built elsewhere, an "int but not a
bool" check written out again, or a plain ``ValueError``/``TypeError`` raised
for bad input.
"""

from __future__ import annotations

import ast
from datetime import timedelta
from pathlib import Path

import pytest

import jobrun
from jobrun._core.model import refusals
from jobrun.testing import MemoryJobRunStore

PACKAGE = Path(jobrun.__file__).parent
HOME = PACKAGE / "_core" / "model" / "refusals.py"
REFUSALS = {"JobValidationError", "ArgumentTypeError", "HandlerMistakeError"}
# Raised on purpose, and not refusals of a caller's input:
PLAIN_RAISES_ALLOWED = {
    # jobrun's own statements break a rule of the executor: a bug in jobrun, not input.
    ("sql/executor.py", "TypeError"): 3,
    # json's hooks: json.loads/dumps turn these into their own errors, which the
    # callers translate (a malformed stored column, a bad --payload).
    ("_core/model/formats.py", "ValueError"): 3,
    ("_cli/params.py", "ValueError"): 1,
}


# errors.py is the bottom layer (the import contract) and cannot import the
# refusals module, yet RetryAfter, raised by user code, refuses its own arguments:
# its two checks (seconds, reason) build their refusals there, one function each.
BUILT_OUTSIDE_ALLOWED = {"errors.py": {"_checked_delay_s", "_one_line", "_checked_rate_limit"}}


def _function_of(tree: ast.Module, line: int) -> str | None:
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.lineno <= line <= (node.end_lineno or 0):
            return node.name
    return None


def _allowed(where: str, tree: ast.Module, line: int) -> bool:
    return _function_of(tree, line) in BUILT_OUTSIDE_ALLOWED.get(where, set())


def _modules() -> list[tuple[str, ast.Module]]:
    return [
        (path.relative_to(PACKAGE).as_posix(), ast.parse(path.read_text(encoding="utf-8")))
        for path in sorted(PACKAGE.rglob("*.py"))
        if path != HOME and "_migrations" not in path.parts
    ]


def _name(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def _mentions_bool(node: ast.expr) -> bool:
    return any(isinstance(part, ast.Name) and part.id == "bool" for part in ast.walk(node))


def test_refusals_are_built_only_in_the_refusals_module() -> None:
    found = [
        f"{where}:{node.lineno} {_name(node.func)}(...)"
        for where, tree in _modules()
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and _name(node.func) in REFUSALS
        and not _allowed(where, tree, node.lineno)
    ]
    assert found == [], "use jobrun._core.model.refusals (refuse, refuse_type, mistake)"


def test_the_int_but_not_a_bool_check_is_spelled_once() -> None:
    found = [
        f"{where}:{node.lineno}"
        for where, tree in _modules()
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and _name(node.func) == "isinstance"
        and len(node.args) == 2
        and _mentions_bool(node.args[1])
        and not _allowed(where, tree, node.lineno)
    ]
    assert found == [], "use refusals.is_int, is_number, checked_int, checked_bool, ..."


def test_bad_input_is_never_a_plain_value_or_type_error() -> None:
    counts: dict[tuple[str, str], int] = {}
    for where, tree in _modules():
        for node in ast.walk(tree):
            if isinstance(node, ast.Raise) and node.exc is not None:
                raised = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
                kind = _name(raised)
                if kind in ("ValueError", "TypeError"):
                    counts[(where, kind)] = counts.get((where, kind), 0) + 1
    assert counts == PLAIN_RAISES_ALLOWED, "refuse with refusals.refuse or refuse_type"


def test_the_allowance_is_no_wider_than_retry_after() -> None:
    """The functions let off still exist and refuse exactly what RetryAfter is given."""
    errors_tree = dict(_modules())["errors.py"]
    defined = {node.name for node in ast.walk(errors_tree) if isinstance(node, ast.FunctionDef)}
    assert BUILT_OUTSIDE_ALLOWED["errors.py"] <= defined
    with pytest.raises(jobrun.ArgumentTypeError) as refused:
        jobrun.RetryAfter(True)
    assert refused.value.errors == [
        {"path": "seconds", "message": "must be a number of seconds, got bool"}
    ]


def test_the_guard_sees_what_it_guards() -> None:
    # The scans above would pass on an empty package: they must find the module's own.
    home = ast.parse(HOME.read_text(encoding="utf-8"))
    built = {
        _name(node.func)
        for node in ast.walk(home)
        if isinstance(node, ast.Call) and _name(node.func) in REFUSALS
    }
    assert built == REFUSALS
    assert len(_modules()) > 50


# --- what a refusal is ---------------------------------------------------------------------------


def test_a_refusal_names_the_input_and_the_problem() -> None:
    error = refusals.refuse("batch_size", "must be a positive int, got 0")
    assert isinstance(error, jobrun.JobValidationError)
    assert isinstance(error, ValueError)
    assert not isinstance(error, TypeError)
    assert str(error) == "batch_size must be a positive int, got 0"
    assert error.errors == [{"path": "batch_size", "message": "must be a positive int, got 0"}]
    assert error.code == "validation_failed"


def test_a_wrong_type_is_a_refusal_and_a_type_error() -> None:
    error = refusals.refuse_type("run_id", "must be a str, got int")
    assert isinstance(error, jobrun.ArgumentTypeError)
    assert isinstance(error, jobrun.JobValidationError)
    assert isinstance(error, TypeError)
    assert isinstance(error, ValueError)
    assert error.code == "validation_failed"
    assert error.errors == [{"path": "run_id", "message": "must be a str, got int"}]


def test_a_handler_mistake_reads_as_its_own_sentence() -> None:
    error = refusals.mistake("step", "a step name must be a str, got int")
    assert isinstance(error, jobrun.HandlerMistakeError)
    assert str(error) == "a step name must be a str, got int"
    assert error.errors == [{"path": "step", "message": "a step name must be a str, got int"}]


@pytest.mark.parametrize("value", [True, False, 1.0, "1", None])
def test_a_bool_is_not_an_int_here(value: object) -> None:
    assert not refusals.is_int(value)
    with pytest.raises(jobrun.ArgumentTypeError, match=r"^limit must be an int, got "):
        refusals.checked_int(value, "limit")


def test_the_checks_return_what_they_accept() -> None:
    assert refusals.checked_int(-3, "n") == -3
    assert refusals.checked_count(1, "n") == 1
    assert refusals.checked_positive_int(7, "n") == 7
    assert refusals.checked_seconds(2, "s") == 2.0
    assert isinstance(refusals.checked_seconds(2, "s"), float)
    assert refusals.checked_str("x", "s") == "x"
    assert refusals.checked_bool(False, "b") is False
    assert refusals.is_number(0.5)
    assert not refusals.is_number(True)


@pytest.mark.parametrize(
    ("check", "value", "kind"),
    [
        (refusals.checked_count, 0, jobrun.JobValidationError),
        (refusals.checked_positive_int, "3", jobrun.ArgumentTypeError),
        (refusals.checked_positive_int, 0, jobrun.JobValidationError),
        (refusals.checked_seconds, float("inf"), jobrun.JobValidationError),
        (refusals.checked_seconds, True, jobrun.ArgumentTypeError),
        (refusals.checked_str, 5, jobrun.ArgumentTypeError),
        (refusals.checked_bool, 1, jobrun.ArgumentTypeError),
    ],
)
def test_each_check_refuses_by_the_input_path(check: object, value: object, kind: type) -> None:
    with pytest.raises(kind) as caught:
        check(value, "given")  # type: ignore[operator]
    assert caught.value.errors[0]["path"] == "given"


# --- neighbouring arguments refuse alike (prune_job_runs raised both kinds before) -----------


@pytest.mark.parametrize(
    "arguments",
    [
        {"older_than": timedelta(days=1), "statuses": ("running",)},
        {"older_than": timedelta(days=1), "batch_size": 0},
        {"older_than": timedelta(days=1), "batch_size": "5"},
        {"older_than": timedelta(days=-1)},
        {"older_than": 5},
    ],
)
async def test_prune_refuses_every_bad_argument_as_a_validation_error(
    arguments: dict[str, object],
) -> None:
    with pytest.raises(jobrun.JobValidationError) as caught:
        await jobrun.prune_job_runs(MemoryJobRunStore(), **arguments)  # type: ignore[arg-type]
    assert caught.value.errors[0]["path"] in arguments


async def test_a_wrong_type_is_still_caught_as_a_type_error_where_it_was_one() -> None:
    store = MemoryJobRunStore()
    with pytest.raises(TypeError, match=r"^run_id must be a str, got int$"):
        await jobrun.get_job_run(store, 5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"^priority must be an int, got bool$"):
        await jobrun.start_job_run(store, module_id="m", job="j", priority=True)
    with pytest.raises(TypeError, match=r"^max_takeovers must be an int, got float$"):
        jobrun.JobRegistry().register("m", "j", lambda p: None, max_takeovers=1.5)  # type: ignore[arg-type]
