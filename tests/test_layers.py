"""The import rules of the package's layers, checked on the source (an AST walk, imports inside
functions and `TYPE_CHECKING` blocks included), and the one declaration of the pipeline.

Layers (one way): flows -> tasks -> agent -> (envs, models), algo, storage, reports.
    algo imports nothing of ours; only tasks, flows and the CLI import prefect; nothing but the
    CLI (and flows itself) imports flows; library layers (envs, models, storage, reports, agent)
    import neither tasks nor flows; envs do not import models or agent; models do not import
    agent; storage imports none of models, envs, agent, reports; config imports nothing of ours
    but the step declaration (storage.layout), the plug-in importer (plugins) and the table of
    built-in environment kinds with their options models (envs.kinds, light: pydantic only; the
    environment classes are named there, not imported). Anyone may import config, metric_names,
    paths, progress, seeding.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "rlanything"
LIBRARY = ("envs", "models", "storage", "reports", "agent")
FORBIDDEN = {  # importing layer -> layers of ours it must not import
    **{layer: {"tasks", "flows", "cli"} for layer in LIBRARY},
    "envs": {"tasks", "flows", "cli", "models", "agent"},
    "models": {"tasks", "flows", "cli", "agent"},
    "storage": {"tasks", "flows", "cli", "models", "envs", "agent", "reports"},
    "tasks": {"flows", "cli"},
}
PREFECT_LAYERS = {"tasks", "flows", "cli"}
CONFIG_MAY_IMPORT = {"rlanything.storage.layout", "rlanything.plugins", "rlanything.envs.kinds"}


def _imports(tree: ast.AST, module: str) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import in a module's tree."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against the importing module's package
                base = module.split(".")[: -node.level]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            out.append((node.lineno, name))
            out += [(node.lineno, f"{name}.{alias.name}") for alias in node.names if name == "rlanything"]
    return out


def layer_violations(package: Path) -> list[str]:
    """Every import in `package` (a folder named rlanything) that breaks the layer rules."""
    problems = []
    for path in sorted(package.rglob("*.py")):
        parts = path.relative_to(package.parent).with_suffix("").parts
        module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        layer = parts[1] if len(parts) > 1 else "__init__"
        layer = layer.removesuffix(".py")
        for line, name in _imports(ast.parse(path.read_text(), str(path)), module):
            where = f"{path.relative_to(package.parent)}:{line} imports {name}"
            target = name.split(".")
            if target[0] == "prefect" and layer not in PREFECT_LAYERS:
                problems.append(f"{where}: only tasks, flows and the CLI import prefect")
            if target[0] != "rlanything" or len(target) < 2:
                continue
            theirs = target[1]
            if layer == "algo" and theirs != "algo":
                problems.append(f"{where}: algo imports nothing of ours")
            elif layer == "config" and not any(name == ok or name.startswith(ok + ".") for ok in CONFIG_MAY_IMPORT):
                problems.append(f"{where}: config imports nothing of ours but {', '.join(sorted(CONFIG_MAY_IMPORT))}")
            elif theirs in FORBIDDEN.get(layer, set()):
                problems.append(f"{where}: {layer} must not import {theirs}")
            elif theirs == "flows" and layer not in ("flows", "cli"):
                problems.append(f"{where}: only the CLI imports flows")
    return problems


def test_the_package_keeps_its_import_rules():
    assert layer_violations(PACKAGE) == []


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
            "models/adaptation.py": "from rlanything import flows\n",
            "reports/iteration.py": "import rlanything.tasks.common\n",
            "config.py": "from rlanything.storage.layout import STEPS\nfrom rlanything.models import engine\n",
            "tasks/common.py": "import prefect\nfrom rlanything.flows.runlock import run_lock\n",
            "flows/iteration.py": "import prefect\nfrom rlanything.flows import steps\nfrom rlanything.tasks import common\n",
            "cli.py": "from rlanything.flows import training\n",
        },
    )
    found = layer_violations(package)
    expected = [
        "rlanything/algo/advantages.py:2 imports rlanything.storage: algo imports nothing of ours",
        "rlanything/algo/rewards.py:2 imports rlanything.envs: algo imports nothing of ours",
        "rlanything/config.py:2 imports rlanything.models: config imports nothing of ours but rlanything.envs.kinds, rlanything.plugins, rlanything.storage.layout",
        "rlanything/envs/textworld.py:2 imports rlanything.models.loading: envs must not import models",
        "rlanything/models/adaptation.py:1 imports rlanything.flows: models must not import flows",
        "rlanything/reports/iteration.py:1 imports rlanything.tasks.common: reports must not import tasks",
        "rlanything/storage/buffer.py:1 imports prefect: only tasks, flows and the CLI import prefect",
        "rlanything/tasks/common.py:2 imports rlanything.flows.runlock: tasks must not import flows",
    ]
    assert found == expected


# ---------------------------------------------------------------- no import cycle


def _never_run(tree: ast.AST) -> set[int]:
    """ids of the nodes under `if TYPE_CHECKING:` (or `typing.TYPE_CHECKING`): code that never runs."""
    skip = set()
    for node in ast.walk(tree):
        test = getattr(node, "test", None)
        if isinstance(node, ast.If) and getattr(test, "id", getattr(test, "attr", None)) == "TYPE_CHECKING":
            skip.update(id(n) for child in node.body for n in ast.walk(child))
    return skip


def import_graph(package: Path) -> dict[str, set[str]]:
    """Module -> the modules of `package` (a folder named rlanything) it imports when it runs,
    at its top or inside a function.

    A name resolves to the module that defines it: `from rlanything.models import packing` is an
    edge to rlanything.models.packing, `from rlanything.models.engine import X` one to
    rlanything.models.engine. Imports under `if TYPE_CHECKING:` are left out: they never run, so
    they cannot make a circular import (and type checkers resolve such circles)."""
    files = {}
    for path in sorted(package.rglob("*.py")):
        parts = path.relative_to(package.parent).with_suffix("").parts
        files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph = {}
    for module, path in files.items():
        tree = ast.parse(path.read_text(), str(path))
        skip = _never_run(tree)
        names = []
        for node in ast.walk(tree):
            if id(node) in skip:
                continue
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
            while name and name not in files:  # rlanything.models.engine.X -> rlanything.models.engine
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
            "models/e.py": "from . import d\n",  # d imports e only for type checkers: no circle
            "algo/__init__.py": "",
            "algo/x.py": "from .y import f\n",
            "algo/y.py": "from rlanything.algo import z\n",
            "algo/z.py": "import rlanything.algo.x\n",
        },
    )
    graph = import_graph(package)
    assert graph["rlanything.models.b"] == {"rlanything.models.a"} and graph["rlanything.models.d"] == set()
    assert import_cycles(graph) == [
        ["rlanything.algo.x", "rlanything.algo.y", "rlanything.algo.z", "rlanything.algo.x"],
        ["rlanything.models.a", "rlanything.models.b", "rlanything.models.a"],
    ]


# ---------------------------------------------------------------- importing sets no environment variable

LIBRARY_MODULES = [
    "rlanything",
    "rlanything.config",
    "rlanything.algo",
    "rlanything.envs",
    "rlanything.models.engine",
    "rlanything.envs.verification",
    "rlanything.agent.rollout",
    "rlanything.algo.samples",
    "rlanything.storage.artifacts",
    "rlanything.models.adapt_tasks",
    "rlanything.reports.iteration",
]


# Third-party imports that set variables themselves: transformers 5.24's modeling_utils imports
# torch._dynamo (integrations/deepgemm.py), which sets TORCHINDUCTOR_CACHE_DIR. Imported before the
# snapshot, so the test sees what our modules set, not what our dependencies do.
THIRD_PARTY = ("transformers.modeling_utils",)


@pytest.mark.parametrize("module", LIBRARY_MODULES)
def test_importing_the_library_changes_no_environment_variable(module):
    code = (
        "import importlib, json, os, sys; "
        f"[importlib.import_module(m) for m in {THIRD_PARTY!r}]; "
        "before = dict(os.environ); importlib.import_module(sys.argv[1]); "
        "print(json.dumps({k: v for k, v in os.environ.items() if before.get(k) != v}))"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "HF_", "TRANSFORMERS_"))}
    out = subprocess.run(
        [sys.executable, "-c", code, module],
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
    from rlanything.storage.layout import STEPS

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
    from rlanything.flows.steps import STEP_TASKS
    from rlanything.storage.layout import PIPELINE, STEPS, RunLayout
    from rlanything.storage.schemas import ARTIFACTS
    from rlanything.tasks.common import parse_fault

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
