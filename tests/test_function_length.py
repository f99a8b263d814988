"""No function in the package is longer than MAX_LINES: a longer one is split into named steps.

Checked on the source (an AST walk: methods, nested functions and async functions included);
a function's length runs from its `def` line to its last line, docstring included, decorators not.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "rlanything"
MAX_LINES = 70


def _long_functions(source: str, name: str) -> list[str]:
    """'file:line function (N lines)' for each function of `source` longer than MAX_LINES."""
    out = []
    for node in ast.walk(ast.parse(source, filename=name)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            length = node.end_lineno - node.lineno + 1
            if length > MAX_LINES:
                out.append(f"{name}:{node.lineno} {node.name} ({length} lines)")
    return out


def test_the_check_counts_from_def_to_last_line():
    body = "".join(f"        x{i} = {i}\n" for i in range(MAX_LINES - 1))  # the def line + these: the limit
    assert _long_functions(f"class C:\n    @dec\n    def ok(self):\n{body}", "m.py") == []
    longer = f"class C:\n    def method(self):\n{body}        return 1\n"
    assert _long_functions(longer, "m.py") == [f"m.py:2 method ({MAX_LINES + 1} lines)"]


def test_no_function_is_longer_than_the_limit():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        found += _long_functions(path.read_text(), str(path.relative_to(PACKAGE.parent)))
    assert not found, f"functions longer than {MAX_LINES} lines (split them into named steps):\n" + "\n".join(found)
