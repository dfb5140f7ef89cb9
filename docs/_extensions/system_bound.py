"""A griffe extension for the reference site: the public operations bound to the real sources.

``jobrun/_api.py`` makes most public operations by a call,
``start_job_run = with_system_sources(runs.start_job_run)``: the core function
with its first parameter (``sources``) handed in. griffe reads source and sees
an attribute there; this extension puts in its place the core function's
signature without that parameter and its docstring, as ``inspect.signature``
and ``help()`` show the bound function at run time.
"""

from __future__ import annotations

from typing import Any

import griffe

MODULE = "jobrun._api"
BINDER = "with_system_sources"


class SystemBound(griffe.Extension):
    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        if pkg.path != MODULE.partition(".")[0]:
            return
        module = pkg.modules_collection[MODULE]
        for name, member in list(module.members.items()):
            core = _bound_function(member)
            if core is None:
                continue
            parameters = list(core.parameters)[1:]
            function = griffe.Function(
                name,
                lineno=member.lineno,
                endlineno=member.endlineno,
                parameters=griffe.Parameters(*parameters),
                returns=core.returns,
                docstring=core.docstring,
            )
            function.labels |= core.labels
            module.set_member(name, function)


def _bound_function(member: griffe.Object | griffe.Alias) -> griffe.Function | None:
    """The core function ``member`` binds, when it is ``with_system_sources(core)``."""
    if member.is_alias or not isinstance(member, griffe.Attribute):
        return None
    value = member.value
    if not isinstance(value, griffe.ExprCall) or str(value.function) != BINDER:
        return None
    [argument] = value.arguments
    assert isinstance(argument, griffe.Expr), argument
    target = member.modules_collection[argument.canonical_path]
    core = target.final_target if target.is_alias else target
    assert isinstance(core, griffe.Function), core
    return core
