"""Each rule is spelled in one place: its Python home and its SQL twin, nowhere else.

The homes are ``jobrun/_core/model/predicates.py`` (and ``browse.run_matches``,
``leases/claims.py``, ``worker_registry``) with the twins of the same names in
``jobrun/sql/statements/`` (``rules.py``; the claim's in ``claims.py``, the
workers' in ``operator.py``; tests/contract/test_rule_parity.py checks that each
pair agrees). This test scans ``jobrun/`` for the spellings that were once
repeated across the stores, the test kit and the claim, and fails when one
appears outside its home (file, and function where the file holds more than the
rule).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "jobrun"
PREDICATES = "_core/model/predicates.py"
STATEMENTS = "sql/statements/rules.py"
CLAIM_STATEMENTS = "sql/statements/claims.py"
OPERATOR_STATEMENTS = "sql/statements/operator.py"

# (rule, pattern, {file: functions allowed to spell it, or None for the whole file})
RULES: list[tuple[str, str, dict[str, set[str] | None]]] = [
    (
        "the due instant",
        r"next_attempt_at\s+or\b|\bor\s+\w+\.started_at|coalesce\([^)]*next_attempt_at",
        # waiting_since reads next_attempt_at first too, then its own fallback.
        {PREDICATES: {"due_at", "waiting_since"}, "sql/schema.py": {"due_at_of"}}
        | {STATEMENTS: {"waiting_since"}},
    ),
    (
        "waiting since: a due run's wait counted from its last write",
        r"next_attempt_at\s+or\s+\w+\.updated_at|coalesce\([^)]*updated_at",
        {PREDICATES: {"waiting_since"}, STATEMENTS: {"waiting_since"}},
    ),
    (
        "due, leased, stranded: a lease's expiry or the due instant compared",
        r"next_attempt_at\s*[<>]|[<>]=?\s*[\w.]*next_attempt_at\b"
        r"|due_at\([^)]*\)\s*[<>]|[<>]=?\s*due_at\(",
        {PREDICATES: {"is_due", "is_leased"}, STATEMENTS: {"is_due", "is_leased"}},
    ),
    (
        "leased / stranded: a run carries a lease (SQL)",
        r"lease_owner\.is_not\(None\)",
        # change_statement: RunChange.leased (an operator's release), its own rule;
        # _claimed_values: claim_transition's twin (a lease on the run: a takeover).
        {
            STATEMENTS: {"is_leased", "is_stranded"},
            OPERATOR_STATEMENTS: {"change_statement"},
            CLAIM_STATEMENTS: {"_claimed_values"},
        },
    ),
    (
        "live: status is running (stores, core, SQL)",
        r"status\s*[!=]=\s*(JobRunStatus\.)?RUNNING\b|status\s*[!=]=\s*literal_column\(\s*f?[\"']'\{?RUNNING",
        # parked: the status a write leaves (a bound value), not is_live's column.
        {PREDICATES: {"is_live"}, STATEMENTS: {"is_live", "parked"}},
    ),
    (
        "one live run per key",
        r"\(\s*\w+\.module_id,\s*\w+\.job,\s*\w+\.instance\s*\)\s*==|instance\s*==\s*bindparam",
        {PREDICATES: {"live_run_of"}, STATEMENTS: {"live_run_of"}},
    ),
    (
        "the stored version: NULL is version 1",
        r"job_version\s+or\b|job_version\s+is\s+None|coalesce\([^)]*job_version",
        {PREDICATES: {"stored_version"}, STATEMENTS: {"stored_version"}},
    ),
    (
        "ended since (failed since builds on it)",
        r"ended_at\s*>=",
        {PREDICATES: {"has_ended_since"}, STATEMENTS: {"has_ended_since"}},
    ),
    (
        "prunable",
        r"ended_at\s*<",
        {PREDICATES: {"is_prunable"}, STATEMENTS: {"is_prunable"}},
    ),
    (
        "refill on resume",
        r"\.result\s+is\s+None\b|result\.is_\(None\)",
        {PREDICATES: {"refill_on_resume"}, STATEMENTS: {"refill_on_resume"}},
    ),
    (
        "cancelled: the stored marker read (outcome_of and the filters build on it)",
        r"cancelled\s*==\s*1",
        {PREDICATES: {"is_cancelled"}, STATEMENTS: {"is_cancelled"}},
    ),
    (
        "the presence field of lease_driver",
        r"presence=\(|presence=\[",
        {"_core/leases/holders.py": None},
    ),
    (
        "a worker is live: its row's expiry is still ahead",
        r"\.expires_at\s*[<>]",
        {
            "_core/operator/worker_registry.py": {"worker_is_live"},
            OPERATOR_STATEMENTS: {"worker_is_live"},
        },
    ),
]
# The console and the command line read public JobRun records, not stored rows.
OUTSIDE = ("ui/", "_cli/")


def _functions_by_line(tree: ast.AST) -> dict[int, str]:
    """Each line's innermost enclosing function."""
    names: dict[int, str] = {}
    functions = [
        node for node in ast.walk(tree) if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
    ]
    for node in sorted(functions, key=lambda node: node.lineno):
        for line in range(node.lineno, (node.end_lineno or node.lineno) + 1):
            names[line] = node.name
    return names


def _spellings(pattern: str) -> list[tuple[str, str | None, int]]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        name = path.relative_to(PACKAGE).as_posix()
        if name.startswith(OUTSIDE):
            continue
        text = path.read_text(encoding="utf-8")
        functions = _functions_by_line(ast.parse(text))
        for number, line in enumerate(text.splitlines(), start=1):
            if re.search(pattern, line) and not line.lstrip().startswith("#"):
                found.append((name, functions.get(number), number))
    return found


@pytest.mark.parametrize(("rule", "pattern", "homes"), RULES, ids=[rule for rule, *_ in RULES])
def test_a_rule_is_spelled_only_in_its_home(
    rule: str, pattern: str, homes: dict[str, set[str] | None]
) -> None:
    spellings = _spellings(pattern)
    strays = [
        f"{name}:{number} (in {function})"
        for name, function, number in spellings
        if name not in homes or (homes[name] is not None and function not in homes[name])
    ]
    assert not strays, f"{rule} is spelled outside its home: {strays}"
    # And the home itself still spells it (so the pattern is not stale).
    assert {name for name, _, _ in spellings} == set(homes), rule
