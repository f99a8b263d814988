"""Defaults are written once (issue 59): a function of `rlanything.algo` takes each hyper-parameter
the config sets as a keyword-only argument without a default, so config.py holds the only value
and every caller passes the config's (a default in `algo` would be a second copy that drifts)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import rlanything.algo
from rlanything.config import AlgoConfig, ModelConfig, OptimConfig, RMGuardConfig

ALGO = Path(rlanything.algo.__file__).parent
PACKAGE = ALGO.parent
GLUE = ["agent/advantage_rows.py", "agent/unit_test_scoring.py"]  # frame glue that passes the config's values on

ALGO_NAMES = {
    # what the algo functions call the config's values: algo.band's ends, optim.anchor_beta, the
    # lr schedule's optim.*, env.answer_fallback, ...
    "low",
    "high",
    "clip_eps",
    "kl_beta",
    "anchor_beta",
    "lam",
    "outcome_weight",
    "rm_balance",
    "warmup_steps",
    "schedule",
    "total_steps",
    "min_lr_ratio",
    "fallback",
    "unparseable_reward",  # no config field: the paper's fixed -2 (algo.rewards.UNPARSEABLE_REWARD), passed explicitly
}
SAMPLING = {"temperature", "top_p"}  # fields of every model section (ModelConfig)
HYPER_PARAMETERS = frozenset(
    {*AlgoConfig.model_fields, *OptimConfig.model_fields, *RMGuardConfig.model_fields, *SAMPLING, *ALGO_NAMES}
)


def defaulted_hyper_parameters(source: str, filename: str = "<string>") -> list[str]:
    """Every parameter of a function (or lambda) in `source` that is named like a hyper-parameter
    and has a default -> "file:line function(name=...)", in source order."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        args = node.args
        positional = [*args.posonlyargs, *args.args]
        defaulted = positional[len(positional) - len(args.defaults) :]
        defaulted += [arg for arg, default in zip(args.kwonlyargs, args.kw_defaults) if default is not None]
        name = getattr(node, "name", "<lambda>")
        found += [f"{filename}:{a.lineno} {name}({a.arg}=...)" for a in defaulted if a.arg in HYPER_PARAMETERS]
    return sorted(found, key=lambda line: int(line.split(":")[1].split()[0]))


def test_names_come_from_the_config():
    assert {"clip_eps", "kl_beta", "lam", "band", "policy_band", "outcome_weight", "rm_balance"} <= HYPER_PARAMETERS
    assert {"warmup_steps", "schedule", "total_steps", "min_lr_ratio", "anchor_beta"} <= HYPER_PARAMETERS
    assert SAMPLING <= set(ModelConfig.model_fields)


def test_the_checker_catches_a_default():
    source = (
        "def loss(logprobs, clip_eps=0.2, *, kl_beta, eps=1e-6, is_weights=None):\n"
        "    pass\n"
        "def band(accuracy, *, low=0.2, high):\n"
        "    return lambda lam=1.0: accuracy\n"
        "def fine(x, *, lam, eps=1e-6):\n"
        "    pass\n"
    )
    assert defaulted_hyper_parameters(source) == [
        "<string>:1 loss(clip_eps=...)",
        "<string>:3 band(low=...)",
        "<string>:4 <lambda>(lam=...)",
    ]


@pytest.mark.parametrize(
    "path", [*sorted(ALGO.glob("*.py")), *(PACKAGE / name for name in GLUE)], ids=lambda p: f"{p.parent.name}/{p.name}"
)
def test_algo_hyper_parameters_have_no_default(path: Path):
    found = defaulted_hyper_parameters(path.read_text(), str(path.relative_to(PACKAGE.parent)))
    assert not found, "hyper-parameters with a default (pass the config's value instead):\n" + "\n".join(found)
