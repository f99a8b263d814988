"""The environment seam: a small Protocol every environment implements.

An episode: `reset(spec)` gives the first observation; each `step(action)` gives the next
observation and whether the episode ended; `outcome()` is the verifier's ±1. `action` is the
content of the policy's last `\\boxed{}`, or None when the response held none: the environment
decides what an unparseable action costs (usually a "nothing happens" observation).

A *spec* is a small JSON-able dict from which the environment rebuilds one problem exactly
(the task buffer stores specs). For task adaptation an environment also says how a language
model may rewrite a spec and turns the model's answer back into a valid spec.

Plug-ins: `env.kind: "package.module:ClassName"` names any importable class that implements
this Protocol; its `env.options` are validated by its pydantic model `Options` (a class
attribute; none: it takes no options) and reach it as `config.options`. See examples/custom_env.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from rlanything.algo.parsing import extract_last_boxed
from rlanything.plugins import environment_class

if TYPE_CHECKING:
    from rlanything.config import EnvConfig


@dataclass(frozen=True)
class StepResult:
    observation: str
    done: bool


class Environment(Protocol):
    system_prompt: str
    """What the policy is told once, before the first observation."""
    judge_hint: str
    """One or two sentences telling the RM what a good step looks like in this environment."""

    def __init__(self, config: EnvConfig) -> None:
        """`config.options` holds this kind's options (its `Options` model, for a plug-in)."""
        ...

    def reset(self, spec: dict[str, Any]) -> str: ...

    def step(self, action: str | None) -> StepResult: ...

    def outcome(self) -> int:
        """+1 if the episode solved the problem, else -1."""
        ...

    def close(self) -> None: ...

    # Optional: `heldout_specs(config, split, n, seed) -> list[spec]` (static), the problems
    # `rlanything eval` plays, kept apart from every problem training can draw (envs/heldout.py).
    # Optional: `last_screenshot() -> bytes | None` (a PNG of the screen, see `screenshot`) and
    # `replayable = False` (see `replayable`); environments without them are text-only and
    # replayable. Optional: `example`, a solved (problem, answer) pair shown before the first
    # observation (see `example_of`). Optional: `step_labels(config, spec, actions)` (static),
    # ground-truth labels of single steps (see `step_labels`).

    # --- specs and rewrites (task adaptation) -------------------------------------------
    @staticmethod
    def initial_specs(config: EnvConfig, seed: int) -> list[dict[str, Any]]:
        """The specs of a new run's buffer, one per slot (config.num_problems of them)."""
        ...

    @staticmethod
    def validate_spec(config: EnvConfig, spec: dict[str, Any]) -> None:
        """Raise ValueError (with the reason) unless `spec` builds a verifiable problem."""
        ...

    @staticmethod
    def rewrite_instructions(spec: dict[str, Any], direction: str) -> str:
        """What the environment model may change to make `spec` harder/easier, and the exact
        answer format it must use (parsed by `parse_rewrite`)."""
        ...

    @staticmethod
    def parse_rewrite(spec: dict[str, Any], text: str) -> dict[str, Any]:
        """The environment model's answer -> a new spec; ValueError if malformed."""
        ...

    @staticmethod
    def rule_rewrite(spec: dict[str, Any], direction: str) -> str:
        """A deterministic rewrite written in `parse_rewrite`'s format (`adapt.rewriter: rule`);
        ValueError when the environment has no rule for this spec."""
        ...


def screenshot(env: Environment) -> bytes | None:
    """PNG of the environment's screen as the last reset/step left it, for environments that
    have one (MiniWoB++, OSWorld define `last_screenshot()`); None for text environments."""
    shot = getattr(env, "last_screenshot", None)
    return shot() if shot is not None else None


def example_of(env: Environment) -> tuple[str, str] | None:
    """The solved (problem, answer) pair the policy sees before the episode's first observation
    (an optional `example` attribute, set by `reset`; reasoning-gym's `worked_example`), or None."""
    return getattr(env, "example", None)


def replayable(env: Environment | type) -> bool:
    """False for environments whose episodes cannot be replayed to the same end (a desktop VM):
    verify then keeps the outcome evaluated at the end of the live episode."""
    return getattr(env, "replayable", True)


StepLabel = tuple[int, str]
"""(label in {-1, +1}, the case of the environment's rule that gave it), e.g. (1, "closer")."""


def step_labels(
    env: type, config: EnvConfig, spec: dict[str, Any], actions: list[str | None]
) -> list[StepLabel | None] | None:
    """Ground-truth labels of a trajectory's steps, one per action (None: that step has no label),
    from environments that can know them: the class's optional static `step_labels(config, spec,
    actions)`, which replays the actions from `reset(spec)`. None for environments without one:
    no label is ever made up. The rules are in each environment's module docstring (TextWorld:
    did the step bring the goal closer; reasoning-gym: the answer's correctness)."""
    label = getattr(env, "step_labels", None)
    return label(config, spec, actions) if label is not None else None


def parse_json_box(text: str, allowed: set[str] | None) -> dict[str, Any]:
    r"""The JSON object in the last \boxed{} of `text`, keys restricted to `allowed` (None: any).

    The answer format every environment's `parse_rewrite` reads.

    >>> parse_json_box('\\boxed{{"seed": 3}}', {"seed", "level"})
    {'seed': 3}
    """
    boxed = extract_last_boxed(text)
    if boxed is None:
        raise ValueError("no \\boxed{...} with the new parameters")
    try:
        params = json.loads(boxed)
    except json.JSONDecodeError as err:
        raise ValueError(f"parameters are not JSON: {err}") from err
    if not isinstance(params, dict) or not params:
        raise ValueError("parameters must be a non-empty JSON object")
    unknown = set(params) - allowed if allowed is not None else set()
    if unknown:
        raise ValueError(f"unknown parameters {sorted(unknown)}; allowed: {sorted(allowed)}")
    return params


ENV_CLASSES = {
    "reasoning_gym": "rlanything.envs.reasoning:ReasoningGymEnv",
    "miniwob": "rlanything.envs.miniwob:MiniWoBEnv",
    "osworld": "rlanything.envs.osworld:OSWorldEnv",
    "textworld": "rlanything.envs.textworld:TextWorldEnv",
    "textworld_express": "rlanything.envs.textworld_express:TextWorldExpressEnv",
    "alfworld": "rlanything.envs.alfworld:AlfWorldEnv",
    "coding": "rlanything.envs.coding:CodingEnv",
    "first_letter": "rlanything.envs.first_letter:FirstLetterEnv",
}
"""Built-in kinds -> their classes (imported on first use: each pulls its own libraries)."""


def env_class(kind: str) -> type[Environment]:
    """The environment class of `kind`: a built-in name (`ENV_CLASSES`), or a plug-in given as
    "package.module:ClassName" (any importable class implementing `Environment`)."""
    return environment_class(kind, ENV_CLASSES)


def make_env(config: EnvConfig) -> Environment:
    """A fresh environment instance for `config.kind`."""
    return env_class(config.kind)(config)


def initial_specs(config: EnvConfig, seed: int) -> list[dict[str, Any]]:
    specs = env_class(config.kind).initial_specs(config, seed)
    env_class(config.kind).validate_spec(config, specs[0])  # fail at start-up, not mid-iteration
    return specs
