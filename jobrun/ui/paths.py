"""The path prefix the console is served under (``--base-path``, ``--root-path``)."""

from __future__ import annotations

import re

from jobrun._core import refuse, refuse_type, type_name

# Characters a path segment may hold as they are, in links and in the request
# path alike: no query (?), fragment (#) or percent-escape (%), which would make
# the prefix in links differ from the path the router sees, so every page 404s.
_SEGMENT = re.compile(r"[A-Za-z0-9._~-]+")


def checked_base_path(text: object, path: str = "base_path") -> str:
    """``text`` as a prefix the console can serve under: ``""`` for the root,
    ``"/jobs"`` for ``"/jobs"``, ``"jobs/"`` or ``"/jobs/"``."""
    if not isinstance(text, str):
        raise refuse_type(path, f"must be a path like /jobs, got {type_name(text)}")
    stripped = text.strip("/")
    if not stripped:
        return ""
    for segment in stripped.split("/"):
        if not _SEGMENT.fullmatch(segment) or segment in (".", ".."):
            raise refuse(
                path,
                f"{text!r} is not a plain path like /jobs (letters, digits, - . _ ~ "
                "between slashes; no ?, # or %)",
            )
    return "/" + stripped
