"""What one environment does differently is asked of the environment (its class, or its row in
`ENV_KINDS`: e.g. `runs_code`), never tested by the kind's name outside `rlanything/envs/`
(docs/architecture.md, "Import rules"). Checked on the source (an AST walk): no comparison
(`==`, `!=`, `in`, `match`) of an environment's kind (`config.env.kind`, `env_config.kind`) or
with a built-in kind's name ("coding") anywhere else in the package.
"""

from __future__ import annotations

import ast
from pathlib import Path

from rlanything.environment import ENV_KINDS

PACKAGE = Path(__file__).resolve().parents[1] / "rlanything"


def _names_a_kind(node: ast.AST) -> bool:
    """An environment's kind (`<x>.env.kind`, `env_config.kind`) or a built-in kind's name, alone
    or among the elements of a tuple, list or set."""
    if isinstance(node, ast.Constant):
        return node.value in ENV_KINDS
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return any(_names_a_kind(element) for element in node.elts)
    if isinstance(node, ast.Attribute) and node.attr == "kind":
        owner = node.value
        name = owner.attr if isinstance(owner, ast.Attribute) else getattr(owner, "id", "")
        return "env" in name
    return False


def kind_tests(source: str, name: str) -> list[str]:
    """'file:line code' for every comparison in `source` that tests an environment's kind.

    >>> kind_tests("if config.env.kind == 'coding':\\n    pass\\nok = adv.kind == 'policy'\\n", "m.py")
    ["m.py:1 config.env.kind == 'coding'"]
    """
    found = []
    for node in ast.walk(ast.parse(source, filename=name)):
        if isinstance(node, ast.Compare) and any(map(_names_a_kind, [node.left, *node.comparators])):
            found.append((node.lineno, ast.unparse(node)))
        elif isinstance(node, ast.Match) and _names_a_kind(node.subject):
            found.append((node.lineno, f"match {ast.unparse(node.subject)}"))
        elif isinstance(node, ast.MatchValue) and _names_a_kind(node.value):
            found.append((node.lineno, f"case {ast.unparse(node.value)}"))
    return [f"{name}:{line} {code}" for line, code in sorted(found)]


def test_the_check_finds_each_form_of_a_kind_test():
    source = (
        "if self.env.kind != 'coding':\n"
        "    pass\n"
        "dropped = kind != 'reasoning_gym'\n"
        "gui = env_config.kind in ('miniwob', 'osworld')\n"
        "match config.env.kind:\n"
        "    case 'textworld':\n"
        "        pass\n"
        "fine = adv.kind == 'policy' or step.kind in ('policy', 'rm') or kind in ENV_KINDS\n"
    )
    assert kind_tests(source, "m.py") == [
        "m.py:1 self.env.kind != 'coding'",
        "m.py:3 kind != 'reasoning_gym'",
        "m.py:4 env_config.kind in ('miniwob', 'osworld')",
        "m.py:5 match config.env.kind",
        "m.py:6 case 'textworld'",
    ]


def test_no_code_outside_envs_tests_an_environment_kind():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.relative_to(PACKAGE).parts[0] != "envs":
            found += kind_tests(path.read_text(), str(path.relative_to(PACKAGE.parent)))
    assert not found, "ask the environment (its class or its ENV_KINDS row) instead:\n" + "\n".join(found)
