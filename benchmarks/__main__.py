"""``python -m benchmarks``: the scenarios, one line each; ``python -m benchmarks NAME
[options]`` runs one (``python -m benchmarks NAME --help`` for its options)."""

from __future__ import annotations

import ast
import runpy
import sys
from pathlib import Path

SCENARIOS = Path(__file__).resolve().parent / "scenarios"


def scenarios() -> dict[str, str]:
    """Each scenario's name and the first sentence of its docstring (read, not imported:
    a scenario may import what is not installed)."""
    found = {}
    for path in sorted(SCENARIOS.glob("*.py")):
        if not path.name.startswith("_"):
            docstring = ast.get_docstring(ast.parse(path.read_text())) or ""
            found[path.stem] = " ".join(docstring.split("\n\n")[0].split())
    return found


def main() -> None:
    known = scenarios()
    if len(sys.argv) < 2 or sys.argv[1] in ("-h", "--help") or sys.argv[1] not in known:
        if len(sys.argv) >= 2 and sys.argv[1] not in ("-h", "--help"):
            print(f"no scenario {sys.argv[1]!r}\n", file=sys.stderr)
        print(__doc__ or "")
        width = max(len(name) for name in known)
        for name, line in known.items():
            print(f"  {name:<{width}}  {line}")
        sys.exit(0 if len(sys.argv) < 2 or sys.argv[1] in ("-h", "--help") else 2)
    name = sys.argv[1]
    del sys.argv[1]
    runpy.run_module(f"benchmarks.scenarios.{name}", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
