"""The docs name only code that exists: every backticked reference in docs/*.md and README.md to a
file or folder of ours (`models/engines/make.py`, `configs/tiny.yaml`, `tests/agent`), to a name
in a file (`agent/rm_roles.py: RM_ROLES`, `seeding.py:derive_seed`, `models/training/trainer.py:
ppo_update(...)`, `file.py: a, b`, `Class.member`), or to a module by its dotted name
(`rlanything.models.engines.make`, `agent.play.play`) must resolve, so a file, function or module
renamed without its docs fails here.

- A path resolves under rlanything/ first, then under the repository root. A name after a .py
  path (`: name` in the same backticks, or `` `file.py`: `name` ``) must be bound at the top level
  of that file (def, class, assignment; a package's __init__.py may re-export it), `Class.name`
  in that class's body.
- A dotted name resolves to its longest prefix that is a module of the package; the rest must be
  a name bound there.
- Checked are only the references that start where our code lives: a folder of the repository
  (`rlanything/`, `tests/`, `configs/`, `benchmarks/`, `docs/`, `examples/`, `notebooks/`), a
  subpackage (`agent/`, `models.engines`), or a top-level module (`config.py`; dotted only as
  `rlanything.config`, since `config.options` reads as a variable). In a command (a span with
  spaces that does not start with a path) each such word is checked.
- Not references to code, so not checked: fenced code blocks; run-folder files and placeholders
  (`iter_NNNN/…`, `runs/tiny/`, `rollouts.parquet`, `configs/<model>-<name>.yaml`,
  `tasks/v(N+1).parquet`), globs, URLs; dotted file names (`tasks.png`, `config.json`); config
  keys (`algo.band`: a field of the config's algo section, though algo is also a subpackage); and
  `rlanything.X` where X is no folder or module of ours (the MLflow tag `rlanything.arm`).
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from functools import cache, cached_property
from pathlib import Path

import pytest

from rlanything.config import Config

REPO = Path(__file__).resolve().parents[1]
PACKAGE_NAME = "rlanything"
DOCS = [*sorted((REPO / "docs").glob("*.md")), REPO / "README.md"]
REPO_FOLDERS = ("rlanything", "tests", "configs", "benchmarks", "docs", "examples", "notebooks")
SKIP = re.compile(r"[<>*…]|NNNN|://")
SPAN = re.compile(r"`([^`\n]+)`")
PATH = r"[\w.-]+(?:/[\w.-]+)*/?"
NAME = r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*"
NAMES = rf"{NAME}(?:\s*,\s*{NAME})*"
# a path, then `: name[, name]` (which may go on: `(args)`, words), or nothing more than words after it
PATH_HEAD = re.compile(rf"(?P<path>{PATH})(?:\s*:\s*(?P<names>{NAMES})(?=$|[\s(])|(?=$|\s))")
DOTTED_REF = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+")
NEXT_NAME = re.compile(rf":\s*`(?P<name>{NAME})`")  # `file.py`: `name`
FILE_TYPES = {"png", "json", "jsonl", "yaml", "yml", "md", "parquet", "csv", "txt", "log", "pt", "db", "ipynb"}


@dataclass(frozen=True)
class Tree:
    """Where references resolve: the repository root and its package's folders and modules."""

    root: Path
    package: str = PACKAGE_NAME

    @property
    def package_dir(self) -> Path:
        return self.root / self.package

    @cached_property
    def subpackages(self) -> frozenset[str]:
        return frozenset(p.parent.name for p in self.package_dir.glob("*/__init__.py"))

    @cached_property
    def modules(self) -> frozenset[str]:
        return frozenset(p.stem for p in self.package_dir.glob("*.py") if p.stem != "__init__")

    def is_ours(self, path: str) -> bool:
        """Does a slash path or a bare file name start where our code lives?"""
        first = path.split("/", 1)[0]
        if "/" in path:
            return first in REPO_FOLDERS or first in self.subpackages
        return path.endswith(".py") and path[: -len(".py")] in self.modules

    def resolve(self, path: str) -> Path | None:
        for base in (self.package_dir, self.root):
            if (base / path).exists():
                return base / path
        return None

    def module_file(self, dotted: str) -> Path | None:
        """`models.engines.make` or `rlanything.models.engines.make` -> its file, if a module."""
        parts = dotted.split(".")
        parts = parts[1:] if parts[0] == self.package else parts
        if not parts:
            return None
        target = self.package_dir.joinpath(*parts)
        return next((f for f in (target.with_suffix(".py"), target / "__init__.py") if f.is_file()), None)


@dataclass(frozen=True)
class Ref:
    """A reference found in a doc: a path (with a name defined in it) or a dotted module name."""

    doc: str
    line: int
    text: str
    path: str | None = None
    name: str | None = None
    dotted: str | None = None


def _config_keys() -> dict[str, frozenset[str]]:
    """The config's sections and their fields: `algo.band` is a setting, not the module algo.band."""
    return {
        section: frozenset(field.annotation.model_fields)
        for section, field in Config.model_fields.items()
        if hasattr(field.annotation, "model_fields")
    }


CONFIG_KEYS = _config_keys()


def _without_fences(markdown: str) -> list[str]:
    """The doc's lines, those of fenced code blocks blanked (their line numbers kept)."""
    lines, fenced = [], False
    for line in markdown.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            lines.append("")
        else:
            lines.append("" if fenced else line)
    return lines


def references(markdown: str, tree: Tree, doc: str = "doc") -> list[Ref]:
    """Every backticked reference to code of ours in `markdown` (outside fenced code blocks): a
    span that starts with a path (`agent/play.py: play`, `algo/rewards.py: integrated_reward(...)`,
    `envs/unit_tests.py: a, b`), or is a dotted module name, or else each such word of a command
    (`rlanything train -c configs/tiny.yaml`)."""
    out = []
    for number, line in enumerate(_without_fences(markdown), 1):
        for span in SPAN.finditer(line):
            text = span.group(1).strip()
            head = PATH_HEAD.match(text)
            if head and _is_path(head["path"], tree):
                names = re.split(r"\s*,\s*", head["names"]) if head["names"] else []
                following = NEXT_NAME.match(line, span.end())  # `file.py`: `name`
                if not names and following and head["path"].endswith(".py") and head.end() == len(text):
                    names = [following["name"]]
                if not SKIP.search(head.group()):
                    out += [Ref(doc, number, head.group(), head["path"], name) for name in names or [None]]
                continue
            for word in [text] if DOTTED_REF.fullmatch(text) else text.split():
                ref = None if SKIP.search(word) else _reference(word, tree, doc, number)
                out += [ref] if ref else []
    return out


def _is_path(path: str, tree: Tree) -> bool:
    return ("/" in path or path.endswith(".py")) and tree.is_ours(path)


def _reference(word: str, tree: Tree, doc: str, line: int) -> Ref | None:
    """A word of a span -> the reference it is, if any: a path of ours or a dotted module name."""
    if re.fullmatch(PATH, word) and _is_path(word, tree):
        return Ref(doc, line, word, path=word)
    if not DOTTED_REF.fullmatch(word) or word.rsplit(".", 1)[1] in FILE_TYPES | {"py"}:
        return None  # `tasks.png`, `config.json`: a file name
    parts = word.split(".")
    if parts[0] == tree.package:  # `rlanything.experiment` (an MLflow tag) names no folder or module of ours
        ours = parts[1] in tree.subpackages or parts[1] in tree.modules
        return Ref(doc, line, word, dotted=word) if ours else None
    if parts[0] in CONFIG_KEYS and parts[1] in CONFIG_KEYS[parts[0]]:
        return None  # a setting (`algo.band`), though algo is also a package
    if parts[0] in tree.subpackages:  # a top-level module only with rlanything.: `config.options` is a variable's
        return Ref(doc, line, word, dotted=word)
    return None


@cache
def defined_names(path: Path) -> frozenset[str]:
    """The top-level names a module defines (defs, classes, assignments; a package's __init__.py
    its imports too) and `Class.member` for the members of its classes."""
    names = set()
    for node in ast.parse(path.read_text()).body:
        names |= _bound(node, path.name == "__init__.py")
        if isinstance(node, ast.ClassDef):
            for member in node.body:
                names |= {f"{node.name}.{name}" for name in _bound(member, False)}
    return frozenset(names)


def _bound(node: ast.stmt, imports: bool) -> set[str]:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {node.name}
    if isinstance(node, ast.Assign):
        return {t.id for target in node.targets for t in ast.walk(target) if isinstance(t, ast.Name)}
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return {node.target.id}
    if imports and isinstance(node, (ast.Import, ast.ImportFrom)):
        return {(alias.asname or alias.name).split(".")[0] for alias in node.names}
    if isinstance(node, (ast.If, ast.Try)):  # `if TYPE_CHECKING:` / `try: import x` blocks
        return {name for child in node.body for name in _bound(child, imports)}
    return set()


def problem(ref: Ref, tree: Tree) -> str | None:
    """What is wrong with a reference, or None if it resolves."""
    if ref.dotted:
        parts = ref.dotted.split(".")
        for cut in range(len(parts), 0, -1):  # the longest prefix that is a module, then names in it
            module = tree.module_file(".".join(parts[:cut]))
            if module:
                name = ".".join(parts[cut:])
                if name and name not in defined_names(module):
                    return f"{name} is not defined in {module.relative_to(tree.root)}"
                return None
        return f"no module {ref.dotted}"
    found = tree.resolve(ref.path)
    if found is None:
        return f"no file or folder {ref.path} (under {tree.package}/ or the repository root)"
    if ref.name and found.suffix == ".py" and ref.name not in defined_names(found):
        return f"{ref.name} is not defined in {found.relative_to(tree.root)}"
    return None


def test_the_checker_on_a_made_up_tree(tmp_path):
    for package in ("agent", "algo"):
        (tmp_path / "rlanything" / package).mkdir(parents=True)
        (tmp_path / "rlanything" / package / "__init__.py").write_text("")
    (tmp_path / "rlanything" / "agent" / "play.py").write_text("class Ep:\n    n: int = 1\n\ndef play(): ...\n")
    (tmp_path / "rlanything" / "config.py").write_text("LIMIT = 3\n")
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "tiny.yaml").write_text("")
    doc = (
        "Plays in `agent/play.py: play` (`agent/play.py`: `Ep.n`), `agent.play.play` and `config.py:LIMIT`,\n"
        "with `rlanything train -c configs/tiny.yaml`; not `agent/rollout.py`, `agent/play.py: Ep, rollout`,\n"
        "`agent/play.py: gone(tasks)`, `agent.play.gone` nor `-c configs/huge.yaml`. Not code:\n"
        "`iter_NNNN/…`, `runs/tiny/`, `algo.band`, `configs/<model>-<name>.yaml`, `agent/v(N+1).parquet`,\n"
        "`rollouts.parquet`, `config.options`, `agent.png`, `rlanything.arm`.\n"
        "```\nagent/missing.py `agent/missing.py`\n```\n"
    )
    tree = Tree(tmp_path)
    found = [(ref.line, ref.path or ref.dotted, ref.name, problem(ref, tree)) for ref in references(doc, tree)]
    no_file = "no file or folder {} (under rlanything/ or the repository root)"
    assert found == [
        (1, "agent/play.py", "play", None),
        (1, "agent/play.py", "Ep.n", None),
        (1, "agent.play.play", None, None),
        (1, "config.py", "LIMIT", None),
        (2, "configs/tiny.yaml", None, None),
        (2, "agent/rollout.py", None, no_file.format("agent/rollout.py")),
        (2, "agent/play.py", "Ep", None),
        (2, "agent/play.py", "rollout", "rollout is not defined in rlanything/agent/play.py"),
        (3, "agent/play.py", "gone", "gone is not defined in rlanything/agent/play.py"),
        (3, "agent.play.gone", None, "gone is not defined in rlanything/agent/play.py"),
        (3, "configs/huge.yaml", None, no_file.format("configs/huge.yaml")),
    ]


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.relative_to(REPO).as_posix())
def test_every_code_reference_of_the_docs_resolves(doc):
    tree = Tree(REPO)
    name = doc.relative_to(REPO).as_posix()
    refs = references(doc.read_text(), tree, name)
    wrong = [f"{ref.doc}:{ref.line}: `{ref.text}`: {why}" for ref in refs if (why := problem(ref, tree))]
    assert not wrong, "stale references to the code:\n" + "\n".join(wrong)
