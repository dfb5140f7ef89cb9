"""A griffe extension for the reference site: jobrun's docstrings use reST roles.

``:class:`JobPass``` and friends become code spans, and a paragraph ending in
``::`` (a reST literal block) ends in one colon, so the Markdown reads cleanly.
The docstrings themselves stay as they are, for ``help()``.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:class|func|meth|attr|exc|data|mod|obj):`~?([^`]+)`")
LITERAL_BLOCK = re.compile(r"(\S)::$", re.MULTILINE)


class RestRoles(griffe.Extension):
    def on_object(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            text = ROLE.sub(r"`\1`", obj.docstring.value)
            obj.docstring.value = LITERAL_BLOCK.sub(r"\1:", text)
