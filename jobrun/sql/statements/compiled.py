"""How a facet's statements are compiled, and the one construct every facet's writes use.

A statement whose shape depends on the call (how many jobs a claim asks for,
which filters a listing uses, how many ids a prune batch deletes), or which only
some stores send, is compiled the first time its shape is asked for and kept
(:class:`Shapes`); the pass's fixed statements are compiled with the store
(:class:`~jobrun.sql.statements.runs.RunStatements`,
:class:`~jobrun.sql.statements.operator.OperatorStatements`).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any

from sqlalchemy.sql.expression import ClauseElement

from jobrun.sql.executor import Compiler, Prepared


def dialect_insert(is_postgres: bool, table: Any) -> Any:
    """The dialect's INSERT construct, which knows ``ON CONFLICT``."""
    from sqlalchemy.dialects import postgresql, sqlite

    return (postgresql if is_postgres else sqlite).insert(table)


class Shapes:
    """Statements compiled once per shape, on first use."""

    def __init__(self, compile_: Compiler) -> None:
        self._compile = compile_
        self._known: dict[tuple[Hashable, ...], Prepared] = {}

    def of(self, build: Callable[..., ClauseElement], *shape: Hashable) -> Prepared:
        """``build(*shape)``, compiled the first time this shape is asked for."""
        key = (build, *shape)
        found = self._known.get(key)
        if found is None:
            found = self._known[key] = self._compile(build(*shape))
        return found
