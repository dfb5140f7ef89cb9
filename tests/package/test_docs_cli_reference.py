"""The command-line reference page lists every ``jobrun`` command.

``docs/reference/cli.md`` is rendered by mkdocs-click from the ``cli`` group,
which lists only the commands already loaded once any is; the MkDocs hook
``docs/_extensions/cli_commands.py`` loads them all first.
"""

from __future__ import annotations

import importlib.util
import re

from jobrun._cli.app import LAZY_COMMANDS, cli
from tests.support import REPO


def test_the_page_renders_the_cli_group() -> None:
    page = (REPO / "docs/reference/cli.md").read_text()
    assert re.search(r"^::: mkdocs-click$", page, re.MULTILINE)
    assert ":module: jobrun._cli.app" in page
    assert ":command: cli" in page
    assert "docs/_extensions/cli_commands.py" in (REPO / "mkdocs.yml").read_text()


def test_the_hook_loads_every_command() -> None:
    spec = importlib.util.spec_from_file_location(
        "cli_commands", REPO / "docs/_extensions/cli_commands.py"
    )
    assert spec is not None
    assert spec.loader is not None
    hook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hook)
    config = object()
    assert hook.on_config(config) is config
    assert set(cli.commands) == set(LAZY_COMMANDS)
