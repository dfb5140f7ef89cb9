"""MkDocs hook: load every ``jobrun`` command before the CLI reference is rendered.

The ``jobrun`` group imports a command's module only when that command runs
(``jobrun/_cli/app.py``), and mkdocs-click lists a group's already loaded
commands when it has any; importing them all first makes the page list every
command, whichever of them an earlier page happened to load.
"""

from __future__ import annotations

import importlib
from typing import Any


def on_config(config: Any) -> Any:
    from jobrun._cli.app import LAZY_COMMANDS

    for module, _help in LAZY_COMMANDS.values():
        importlib.import_module(module)
    return config
