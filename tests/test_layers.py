"""The import rules of the package's layers, read from the layer table of docs/architecture.md
("## Layers": layer | holds | must not import) and checked on the source (an AST walk, imports
inside functions and `TYPE_CHECKING` blocks included); and the one declaration of the pipeline.

The table is the one statement of the rules: a cell of "must not import" names layers or modules
of ours in backticks (`envs`, `storage.layout`), "anything of ours" (every module of the package
outside the layer itself, but those named after "but") and Prefect. Every module of the package
must belong to a row.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "rlanything"
ARCHITECTURE = PACKAGE.parent / "docs" / "architecture.md"


@dataclass(frozen=True)
class Rule:
    """What one layer must not import, as its row of the table says."""

    named: frozenset[str]  # modules of ours in the cell, dotted without "rlanything." (envs, storage.layout)
    everything: bool  # "anything of ours": every module of ours but the `named` ones
    prefect: bool


def read_rules(markdown: str) -> dict[str, Rule]:
    r"""The layer table under "## Layers" -> layer (or top-level module) -> its rule.

    >>> rows = "| `a`, `b` | x | anything of ours but `c.d`; Prefect |\n| `e` | y | `a` |\n"
    >>> rules = read_rules("## Layers\n| layer | holds | must not import |\n|---|---|---|\n" + rows)
    >>> rules["b"] == Rule(frozenset({"c.d"}), True, True), rules["e"] == Rule(frozenset({"a"}), False, False)
    (True, True)
    """
    section = ("\n" + markdown).split("\n## Layers\n", 1)[1].split("\n## ", 1)[0]
    rows = [[cell.strip() for cell in line.strip().strip("|").split("|")] for line in section.splitlines()]
    rows = [row for row in rows if len(row) == 3]
    if not rows or rows[0] != ["layer", "holds", "must not import"]:
        raise ValueError("no 'layer | holds | must not import' table under ## Layers")
    rules = {}
    for layers, _, cell in rows[2:]:  # after the header and its |---| line
        named = frozenset(re.findall(r"`([\w.]+)`", cell))
        rule = Rule(named, "anything of ours" in cell, re.search(r"\bPrefect\b", cell) is not None)
        rules.update((layer, rule) for layer in re.findall(r"`(\w+)`", layers))
    return rules


RULES = read_rules(ARCHITECTURE.read_text())


def _modules(package: Path) -> dict[str, Path]:
    """Absolute module name -> its file, for every module of `package` (a folder named rlanything)."""
    out = {}
    for path in sorted(package.rglob("*.py")):
        parts = path.relative_to(package.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _imports(tree: ast.AST, module: str, is_package: bool, known: set[str]) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import in a module's tree; a name imported from a
    module of ours that is itself a module or package of ours (`from rlanything.storage import
    layout`) stands for that module."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            name = node.module or ""
            if node.level:  # relative: against the importing module's package (itself, for an __init__)
                here = module.split(".")[: None if is_package else -1]
                name = ".".join(here[: len(here) - node.level + 1] + ([node.module] if node.module else []))
            full = [f"{name}.{alias.name}" for alias in node.names]
            out += [(node.lineno, f if f in known else name) for f in full]
    return out


def _within(name: str, names: frozenset[str]) -> str | None:
    """The one of `names` (dotted, without "rlanything.") that module `name` is or lies in."""
    dotted = name.removeprefix("rlanything.")
    return next((n for n in sorted(names) if dotted == n or dotted.startswith(n + ".")), None)


def layer_violations(package: Path, rules: dict[str, Rule] = RULES) -> list[str]:
    """Every import in `package` (a folder named rlanything) that its layer's rule forbids, and
    every module whose layer has no rule."""
    modules = _modules(package)
    known = {".".join(m.split(".")[:n]) for m in modules for n in range(1, m.count(".") + 2)}
    problems = []
    for module, path in modules.items():
        parts = module.split(".")
        layer = parts[1] if len(parts) > 1 else "__init__"
        where = path.relative_to(package.parent)
        if layer not in rules:
            problems.append(f"{where}: layer {layer} has no row in the layer table")
            continue
        rule = rules[layer]
        for line, name in sorted(
            set(_imports(ast.parse(path.read_text(), str(path)), module, path.name == "__init__.py", known))
        ):
            target = name.split(".")
            if target[0] == "prefect" and rule.prefect:
                problems.append(f"{where}:{line} imports {name}: {layer} must not import Prefect")
            if target[0] != "rlanything" or len(target) < 2 or target[1] == layer:
                continue
            named = _within(name, rule.named)
            if rule.everything and named is None:
                but = f" but {', '.join(sorted(rule.named))}" if rule.named else ""
                problems.append(f"{where}:{line} imports {name}: {layer} imports nothing of ours{but}")
            elif not rule.everything and named is not None:
                problems.append(f"{where}:{line} imports {name}: {layer} must not import {named}")
    return problems


def test_the_package_keeps_its_import_rules():
    assert layer_violations(PACKAGE) == []


def test_the_table_states_the_rules_written_under_it():
    """The bullets under the table follow from it: algo imports nothing of ours, only tasks,
    flows and the CLI import Prefect, nothing but the CLI (and flows) imports flows."""
    assert RULES["algo"] == Rule(frozenset(), everything=True, prefect=True)
    assert {layer for layer, rule in RULES.items() if not rule.prefect} == {"tasks", "flows", "cli"}
    may_import_flows = {layer for layer, r in RULES.items() if layer == "flows" or r.everything == ("flows" in r.named)}
    assert may_import_flows == {"flows", "cli"}
    assert {"envs", "models", "agent", "storage"} <= RULES.keys()


# ---------------------------------------------------------------- imports go down only


def read_order(markdown: str) -> list[list[str]]:
    r"""The ```import-order block of the layer section -> its tiers, top first.

    >>> read_order("## Layers\n```import-order\ncli\nflows, tasks\n```\n")
    [['cli'], ['flows', 'tasks']]
    """
    section = ("\n" + markdown).split("\n## Layers\n", 1)[1].split("\n## ", 1)[0]
    block = section.split("```import-order\n", 1)[1].split("```", 1)[0]
    return [[name.strip() for name in line.split(",")] for line in block.strip().splitlines()]


ORDER = read_order(ARCHITECTURE.read_text())


def upward_imports(package: Path, order: list[list[str]]) -> list[str]:
    """Every import (at run time, in a function or under TYPE_CHECKING) from one layer of `package`
    into a layer of the same tier or a tier above it in `order`, and every layer not in `order`."""
    rank = {layer: k for k, tier in enumerate(order) for layer in tier}
    graph = {module: set(targets) for module, targets in import_graph(package).items()}
    for module, path in _modules(package).items():  # TYPE_CHECKING imports too
        known = set(graph)
        for _, name in _imports(ast.parse(path.read_text()), module, path.name == "__init__.py", known):
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name and name != module:
                graph[module].add(name)

    def layer(module: str) -> str:
        parts = module.split(".")
        return parts[1] if len(parts) > 1 else "__init__"

    problems = sorted({f"layer {layer(m)} is not in the import order" for m in graph if layer(m) not in rank})
    for module, targets in sorted(graph.items()):
        for target in sorted(targets):
            source, dest = layer(module), layer(target)
            if source != dest and source in rank and dest in rank and rank[dest] <= rank[source]:
                problems.append(f"{module} imports {target}: {dest} is not below {source}")
    return problems


def test_every_import_goes_down_the_order():
    assert upward_imports(PACKAGE, ORDER) == []


def test_the_order_and_the_table_agree():
    """Every layer is in the order once and has a row; each row forbids every layer at or above its
    own tier (an import the order refuses is one the table refuses too, so the two cannot drift)."""
    listed = [layer for tier in ORDER for layer in tier]
    assert len(listed) == len(set(listed)) and set(listed) == set(RULES)
    rank = {layer: k for k, tier in enumerate(ORDER) for layer in tier}
    allowed_upwards = []
    for layer, rule in RULES.items():
        for other in listed:
            forbidden = (other not in rule.named) if rule.everything else (other in rule.named)
            if other != layer and rank[other] <= rank[layer] and not forbidden:
                allowed_upwards.append(f"{layer} may import {other}")
    assert allowed_upwards == []


def test_the_order_checker_catches_an_import_up_and_sideways(tmp_path):
    package = _tree(
        tmp_path,
        {
            "__init__.py": "",
            "algo/a.py": "",
            "envs/e.py": "from rlanything.algo import a\n",  # down: fine
            "models/m.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from rlanything.envs.e import E\n",
            "storage/s.py": "def f():\n    import rlanything.models.m\n",
            "odd.py": "",
        },
    )
    order = [["envs", "models"], ["algo", "storage"], ["__init__"]]
    assert upward_imports(package, order) == [
        "layer odd is not in the import order",
        "rlanything.models.m imports rlanything.envs.e: envs is not below models",
        "rlanything.storage.s imports rlanything.models.m: models is not below storage",
    ]


def _tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / "rlanything" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root / "rlanything"


def test_the_checker_catches_each_kind_of_violation(tmp_path):
    package = _tree(
        tmp_path,
        {
            "__init__.py": "",
            "algo/advantages.py": "import numpy\nfrom rlanything.storage import layout\n",
            "algo/rewards.py": "from . import advantages\nfrom ..envs import base\n",
            "envs/textworld.py": "def f():\n    from rlanything.models.loading import cache_dir\n",
            "storage/buffer.py": "from prefect import task\nfrom rlanything.algo import curriculum\n",
            "storage/layout.py": "",
            "models/adaptation.py": "from rlanything import flows\nfrom rlanything.envs.base import env_class\n",
            "reports/iteration_report.py": "import rlanything.tasks.common\n",
            "config.py": "from rlanything.pipeline import STEPS\nfrom rlanything.models import engine\n"
            "from rlanything.storage import layout, buffer\n",
            "tasks/common.py": "import prefect\nfrom rlanything.flows.runlock import run_lock\n",
            "flows/iteration.py": "import prefect\nfrom rlanything.flows import steps\nfrom rlanything.tasks import common\n",
            "cli.py": "from rlanything.flows import training\n",
            "sampling.py": "",
        },
    )
    found = layer_violations(package)
    expected = [
        "rlanything/algo/advantages.py:2 imports rlanything.storage.layout: algo imports nothing of ours",
        "rlanything/algo/rewards.py:2 imports rlanything.envs: algo imports nothing of ours",
        "rlanything/envs/textworld.py:2 imports rlanything.models.loading: envs must not import models",
        "rlanything/storage/buffer.py:1 imports prefect: storage must not import Prefect",
        "rlanything/models/adaptation.py:1 imports rlanything.flows: models must not import flows",
        "rlanything/models/adaptation.py:2 imports rlanything.envs.base: models must not import envs",
        "rlanything/reports/iteration_report.py:1 imports rlanything.tasks.common: reports must not import tasks",
        "rlanything/config.py:2 imports rlanything.models: config imports nothing of ours but environment, pipeline, plugins",
        "rlanything/config.py:3 imports rlanything.storage.buffer: config imports nothing of ours but environment, pipeline, plugins",
        "rlanything/config.py:3 imports rlanything.storage.layout: config imports nothing of ours but environment, pipeline, plugins",
        "rlanything/storage/buffer.py:2 imports rlanything.algo: storage imports nothing of ours but pipeline, stopping",
        "rlanything/tasks/common.py:2 imports rlanything.flows.runlock: tasks must not import flows",
        "rlanything/sampling.py: layer sampling has no row in the layer table",
    ]
    assert sorted(found) == sorted(expected)


# ---------------------------------------------------------------- no import cycle


def import_graph(package: Path) -> dict[str, set[str]]:
    """Module -> the modules of `package` (a folder named rlanything) it imports anywhere: at its
    top, inside a function, or under `if TYPE_CHECKING:`.

    A name resolves to the module that defines it: `from rlanything.models import packing` is an
    edge to rlanything.models.training.packing, `from rlanything.models.engines.transformers_engine import X` one to
    rlanything.models.engines.transformers_engine. A `TYPE_CHECKING` import never runs, so it cannot
    fail at import time, but it still ties the two modules together: a circle closed through one is
    a circle all the same (docs/architecture.md), and the graph keeps it."""
    files = {}
    for path in sorted(package.rglob("*.py")):
        parts = path.relative_to(package.parent).with_suffix("").parts
        files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph = {}
    for module, path in files.items():
        tree = ast.parse(path.read_text(), str(path))
        names = []
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names += [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: against the importing module's package (itself, for an __init__)
                    here = module.split(".")[: None if path.name == "__init__.py" else -1]
                    base = ".".join(here[: len(here) - node.level + 1] + ([node.module] if node.module else []))
                names += [f"{base}.{a.name}" if f"{base}.{a.name}" in files else base for a in node.names]
        graph[module] = set()
        for name in names:
            while (
                name and name not in files
            ):  # rlanything.models.engines.transformers_engine.X -> rlanything.models.engines.transformers_engine
                name = name.rpartition(".")[0]
            if name and name != module:
                graph[module].add(name)
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One circle [a, b, ..., a] through each group of modules that import one another, directly
    or through others (a strongly connected component, Tarjan); [] when there is none."""
    order: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups = []

    def visit(module: str) -> None:
        order[module] = low[module] = len(order)
        stack.append(module)
        for other in sorted(graph[module]):
            if other not in order:
                visit(other)
                low[module] = min(low[module], low[other])
            elif other in stack:
                low[module] = min(low[module], order[other])
        if low[module] == order[module]:
            group = set()
            while module not in group:
                group.add(stack.pop())
            if len(group) > 1:
                groups.append(group)

    for module in sorted(graph):
        if module not in order:
            visit(module)
    cycles = []
    for group in groups:  # the shortest way from the group's first module back to it (breadth first)
        start = min(group)
        came_from, frontier = {}, [start]
        while start not in came_from:
            reached = []
            for module in frontier:
                for other in sorted(graph[module] & group):
                    if other not in came_from:
                        came_from[other] = module
                        reached.append(other)
            frontier = reached
        cycle = [start, came_from[start]]
        while cycle[-1] != start:
            cycle.append(came_from[cycle[-1]])
        cycles.append(cycle[::-1])
    return sorted(cycles)


def test_no_module_imports_itself_through_others():
    cycles = import_cycles(import_graph(PACKAGE))
    assert cycles == [], "import cycles: " + "; ".join(" -> ".join(cycle) for cycle in cycles)


def test_the_cycle_finder_finds_every_circle_and_only_those(tmp_path):
    package = _tree(
        tmp_path,
        {
            "__init__.py": "",
            "models/__init__.py": "",
            "models/a.py": "from rlanything.models import b\n",
            "models/b.py": "def f():\n    from rlanything.models.a import x\n",  # inside a function: it runs too
            "models/c.py": "import rlanything.models.a\n",  # into a circle, not in one
            "models/d.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from rlanything.models.e import E\n",
            "models/e.py": "from . import d\n",  # d imports e only for type checkers: a circle all the same
            "models/f.py": "import rlanything.models.c\n",  # into a circle's importer, in none
            "algo/__init__.py": "",
            "algo/x.py": "from .y import f\n",
            "algo/y.py": "from rlanything.algo import z\n",
            "algo/z.py": "import rlanything.algo.x\n",
        },
    )
    graph = import_graph(package)
    assert graph["rlanything.models.b"] == {"rlanything.models.a"} and graph["rlanything.models.d"] == {
        "rlanything.models.e"
    }
    assert import_cycles(graph) == [
        ["rlanything.algo.x", "rlanything.algo.y", "rlanything.algo.z", "rlanything.algo.x"],
        ["rlanything.models.a", "rlanything.models.b", "rlanything.models.a"],
        ["rlanything.models.d", "rlanything.models.e", "rlanything.models.d"],
    ]


# ---------------------------------------------------------------- importing sets no environment variable

LIBRARY_MODULES = [
    "rlanything",
    "rlanything.config",
    "rlanything.algo",
    "rlanything.envs",
    "rlanything.models.engines.transformers_engine",
    "rlanything.envs.verification",
    "rlanything.agent.play",
    "rlanything.algo.samples",
    "rlanything.storage.artifacts",
    "rlanything.agent.adapt_tasks",
    "rlanything.reports.iteration_report",
]


# Third-party imports that set variables themselves: transformers 5.24's modeling_utils imports
# torch._dynamo (integrations/deepgemm.py), which sets TORCHINDUCTOR_CACHE_DIR. Imported before the
# snapshot, so the test sees what our modules set, not what our dependencies do.
THIRD_PARTY = ("transformers.modeling_utils",)


def test_importing_the_library_changes_no_environment_variable():
    """Each module imported in turn in one fresh process (one start, not one per module): the
    variables an import changed are reported under the first module whose import changed them."""
    code = (
        "import importlib, json, os, sys; "
        f"[importlib.import_module(m) for m in {THIRD_PARTY!r}]; "
        "changed = {}\n"
        "for module in sys.argv[1:]:\n"
        "    before = dict(os.environ); importlib.import_module(module)\n"
        "    diff = {k: v for k, v in os.environ.items() if before.get(k) != v}\n"
        "    changed.update({module: diff} if diff else {})\n"
        "print(json.dumps(changed))"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "HF_", "TRANSFORMERS_"))}
    out = subprocess.run(
        [sys.executable, "-c", code, *LIBRARY_MODULES],
        env={**env, "PYTHONPATH": str(PACKAGE.parent)},
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == "{}", out.stdout + out.stderr


def test_the_cli_and_flows_set_the_prefect_defaults_and_the_user_wins():
    code = "import os, rlanything.flows; print(os.environ['PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS'])"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}

    def run(extra: dict) -> str:
        return subprocess.run(
            [sys.executable, "-c", code],
            env={**env, **extra, "PYTHONPATH": str(PACKAGE.parent)},
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()

    assert run({}) == "120"
    assert run({"PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "45"}) == "45"


# ---------------------------------------------------------------- one declaration of the pipeline


def test_the_iteration_flow_calls_the_steps_in_the_declared_order():
    from rlanything.flows import iteration
    from rlanything.pipeline import STEPS

    tree = ast.parse(Path(iteration.__file__).read_text())
    [flow] = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "iteration_flow"]
    called = [
        getattr(iteration, c.args[0].id).name
        for c in ast.walk(flow)
        if isinstance(c, ast.Call) and isinstance(c.func, ast.Name) and c.func.id == "step"
    ]
    assert tuple(called) == STEPS


def test_every_reader_of_the_steps_follows_the_declaration():
    from rlanything.config import ConfigError, build_config
    from rlanything.debug_faults import parse_fault
    from rlanything.flows.steps import STEP_TASKS
    from rlanything.pipeline import PIPELINE, STEPS
    from rlanything.storage.layout import RunLayout
    from rlanything.storage.schemas import ARTIFACTS

    assert STEPS == ("rollout", "verify", "rm_score", "advantages", "policy_update", "rm_update", "adapt_tasks")
    assert tuple(STEP_TASKS) == STEPS and all(task.name == name for name, task in STEP_TASKS.items())
    placed = build_config({"run": {"step_deployments": {step: "rlanything-step/x" for step in STEPS}}})
    assert set(placed.run.step_deployments) == set(STEPS)  # the config accepts exactly the declared steps
    with pytest.raises(ConfigError):
        build_config({"run": {"step_deployments": {"reflect": "rlanything-step/x"}}})
    assert {a for step in PIPELINE for a in step.artifacts} == set(ARTIFACTS)  # every artifact has its schema
    layout = RunLayout(Path("/r"))
    assert layout.step_outputs(2, "policy_update") == [
        Path("/r/iter_0002/policy_update.parquet"),
        Path("/r/checkpoints/policy/iter_0002/config.json"),
    ]
    assert layout.step_outputs(2, "adapt_tasks") == [
        Path("/r/iter_0002/adaptation.parquet"),
        Path("/r/tasks/v0003.parquet"),
    ]
    with pytest.raises(ValueError, match="unknown step"):
        layout.step_outputs(0, "reflect")
    assert parse_fault("raise:adapt_tasks") == ("raise", "adapt_tasks", None, "start")
    with pytest.raises(ValueError, match="rollout, verify, rm_score"):
        parse_fault("raise:reflect")


def tree_block(markdown: str) -> str:
    """The layer tree: the first code block under "## Layers"."""
    section = ("\n" + markdown).split("\n## Layers\n", 1)[1]
    return section.split("```\n", 1)[1].split("```", 1)[0]


def tree_entries(markdown: str) -> set[str]:
    r"""The package's top-level folders and modules the layer tree names at its first indentation,
    and those a comma list there names.

    >>> sorted(tree_entries("## Layers\n```\nrlanything/\n  cli.py  x\n  agent/  y\n  a.py, b.py: z\n    sub/  w\n```\n"))
    ['a', 'agent', 'b', 'cli']
    """
    names = set()
    for line in tree_block(markdown).splitlines():
        if line.startswith("  ") and not line.startswith("   "):
            first = line.split()[0]
            head = line.strip().split(": ", 1)[0] if first.endswith(".py,") else first
            names.update(re.findall(r"(\w+)(?:\.py|/)", head))
    return names


def tree_folders(markdown: str) -> dict[str, set[str]]:
    r"""Each folder the layer tree gives a line of its own (`  agent/`; `    engines/` under
    `  models/`) -> the modules (`name.py`) its entry names, on that line and the lines under it
    indented deeper than any entry.

    >>> tree = "## Layers\n```\nrlanything/\n  cli.py  x\n  m/  a.py, b\n        c.py\n    e/  d.py\n```\n"
    >>> {folder: sorted(modules) for folder, modules in tree_folders(tree).items()}
    {'m': ['a', 'c'], 'm/e': ['d']}
    """
    folders: dict[str, set[str]] = {}
    path: list[str] = []
    current = None
    for line in tree_block(markdown).splitlines()[1:]:
        indent = len(line) - len(line.lstrip())
        if indent in (2, 4):  # an entry: a folder (then its modules follow) or a module
            folder = re.match(r"(\w+)/\s", line.lstrip())
            path = path[: indent // 2 - 1] + [folder[1] if folder else ""]
            current = "/".join(path) if folder else None
            if current:
                folders[current] = set()
        if current:
            folders[current].update(re.findall(r"(\w+)\.py\b", line))
    return folders


def test_the_layer_tree_names_every_folder_and_module_and_nothing_else():
    tree = tree_entries(ARCHITECTURE.read_text())
    package = {p.stem if p.is_file() else p.name for p in PACKAGE.iterdir() if p.suffix == ".py" or p.is_dir()}
    package -= {"__init__", "__pycache__"}
    assert tree == package
    layers = {layer for tier in ORDER for layer in tier} - {"__init__"}
    assert layers == package  # and each is a layer of the order (and so of the table)
    named = tree_folders(ARCHITECTURE.read_text())
    folders = {p.parent.relative_to(PACKAGE).as_posix() for p in PACKAGE.rglob("*.py")} - {"."}
    assert set(named) == folders  # every folder with modules has its entry
    for folder, modules in named.items():
        assert modules == {p.stem for p in (PACKAGE / folder).glob("*.py")} - {"__init__"}, folder


def repeated_file_names(package: Path) -> dict[str, list[str]]:
    """File name -> its modules, for every name two modules of `package` share (`__init__.py` apart)."""
    seen: dict[str, list[str]] = {}
    for path in sorted(package.rglob("*.py")):
        if path.name != "__init__.py":
            seen.setdefault(path.name, []).append(path.relative_to(package.parent).as_posix())
    return {name: where for name, where in seen.items() if len(where) > 1}


def test_one_file_name_means_one_thing(tmp_path):
    assert repeated_file_names(PACKAGE) == {}
    package = _tree(tmp_path, {"__init__.py": "", "agent/rollout.py": "", "tasks/rollout.py": "", "algo/x.py": ""})
    assert repeated_file_names(package) == {
        "rollout.py": ["rlanything/agent/rollout.py", "rlanything/tasks/rollout.py"]
    }


def test_algo_works_on_arrays_and_tensors_not_frames():
    """docs/architecture.md: algo is functions over numpy arrays and torch tensors; frame glue
    (pandas) lives in the library layers that read the run folder."""
    for path in sorted((PACKAGE / "algo").glob("*.py")):
        names = {
            name for _, name in _imports(ast.parse(path.read_text()), f"rlanything.algo.{path.stem}", False, set())
        }
        assert not {n for n in names if n.split(".")[0] in ("pandas", "pyarrow")}, path.name
