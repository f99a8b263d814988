"""The environment seam: a small Protocol every environment implements.

An episode: `reset(spec)` gives the first observation; each `step(action)` gives the next
observation and whether the episode ended; `outcome()` is the verifier's ±1. `action` is the
content of the policy's last `\\boxed{}`, or None when the response held none: the environment
decides what an unparseable action costs (usually a "nothing happens" observation).

A *spec* is a small JSON-able dict from which the environment rebuilds one problem exactly
(the task buffer stores specs). For task adaptation an environment also says how a language
model may rewrite a spec and turns the model's answer back into a valid spec.

Built-in environments subclass `Environment` (their kinds, classes and options models: the one
table `ENV_KINDS` in envs/kinds.py) and so inherit the defaults of its optional members.
Plug-ins: `env.kind: "package.module:ClassName"` names any importable class that implements
this Protocol, subclassing it or not; its `env.options` are validated by its pydantic model
`Options` (a class attribute; none: it takes no options) and reach it as `config.options`. A
plug-in that does not subclass `Environment` may leave its optional members out: code that
reads them for any environment goes through `optional`, which supplies the declared default.
See examples/custom_env.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable
from dataclasses import dataclass
from types import FunctionType
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from rlanything.algo.parsing import extract_last_boxed
from rlanything.envs.kinds import ENV_KINDS
from rlanything.plugins import environment_class

if TYPE_CHECKING:
    from rlanything.config import EnvConfig


@dataclass(frozen=True)
class StepResult:
    observation: str
    done: bool


StepLabel = tuple[int, str]
"""(label in {-1, +1}, the case of the environment's rule that gave it), e.g. (1, "closer")."""


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

    # --- optional members, with their defaults (`OPTIONAL_MEMBERS`; read them with `optional`) --
    replayable: ClassVar[bool] = True
    """False for environments whose episodes cannot be replayed to the same end (a desktop VM):
    verify then keeps the outcome evaluated at the end of the live episode."""
    example: tuple[tuple[str, str], ...] | None = None
    """The (observation, answer) turns of a solved problem the policy sees before the episode's
    first observation, set by `reset` (reasoning-gym's `worked_example`: one turn; a text game's:
    every turn of a won episode of another game); None: no example."""
    test_results: list[bool] | None = None
    """The per-test results of the last `outcome()`, for environments with ground-truth tests
    (coding); None for the others."""
    heldout_specs: ClassVar[Callable[[EnvConfig, str, int, int], list[dict[str, Any]]] | None] = None
    """A static `heldout_specs(config, split, n, seed) -> list[spec]`: the problems `rlanything
    eval` plays, kept apart from every problem training can draw (envs/heldout.py); None: the
    environment has no held-out split."""

    def last_screenshot(self) -> bytes | None:
        """PNG of the environment's screen as the last reset/step left it (MiniWoB++, OSWorld);
        None: a text environment."""
        return None

    @staticmethod
    def step_labels(
        config: EnvConfig, spec: dict[str, Any], actions: list[str | None]
    ) -> list[StepLabel | None] | None:
        """Ground-truth labels of a trajectory's steps, one per action (None: that step has no
        label), replaying the actions from `reset(spec)`; the rules are in each environment's
        module docstring (TextWorld: did the step bring the goal closer; reasoning-gym: the
        answer's correctness). None (the default): the environment knows no label, and none is
        ever made up."""
        return None

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


OPTIONAL_MEMBERS = ("replayable", "example", "test_results", "heldout_specs", "last_screenshot", "step_labels")
"""The members of `Environment` that have a default (declared on it): a plug-in that does not
subclass `Environment` may leave them out."""


def optional(env: Environment | type, name: str) -> Any:
    """The optional member `name` of `env` (an environment or its class): its own, or the default
    `Environment` declares, for a plug-in that does not subclass it and leaves the member out.

    >>> class Plain:  # a plug-in that does not subclass Environment
    ...     replayable = False
    >>> optional(Plain, "replayable"), optional(Plain(), "example"), optional(Plain(), "last_screenshot")()
    (False, None, None)
    """
    if name not in OPTIONAL_MEMBERS:
        raise AttributeError(f"{name!r} is not an optional member of Environment ({', '.join(OPTIONAL_MEMBERS)})")
    try:
        return getattr(env, name)
    except AttributeError:
        default = inspect.getattr_static(Environment, name)
        if isinstance(default, (FunctionType, staticmethod)):  # a method: bound to `env` as its own would be
            return default.__get__(None, env) if isinstance(env, type) else default.__get__(env, type(env))
        return default


def screenshot(env: Environment) -> bytes | None:
    """`env.last_screenshot()`: PNG of the environment's screen as the last reset/step left it;
    None for text environments."""
    return optional(env, "last_screenshot")()


def example_of(env: Environment) -> tuple[tuple[str, str], ...] | None:
    """`env.example`: the (observation, answer) turns of a solved problem the policy sees before
    the episode's first observation, or None."""
    return optional(env, "example")


def replayable(env: Environment | type) -> bool:
    """`env.replayable`: False for environments whose episodes cannot be replayed to the same end
    (a desktop VM): verify then keeps the outcome evaluated at the end of the live episode."""
    return optional(env, "replayable")


def step_labels(
    env: type, config: EnvConfig, spec: dict[str, Any], actions: list[str | None]
) -> list[StepLabel | None] | None:
    """`env.step_labels(config, spec, actions)` (env: the class): ground-truth labels of a
    trajectory's steps, one per action, or None from environments that know none."""
    return optional(env, "step_labels")(config, spec, actions)


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


_CLASS_REFS = {kind: entry.env_class for kind, entry in ENV_KINDS.items()}


def env_class(kind: str) -> type[Environment]:
    """The environment class of `kind`: a built-in name (`ENV_KINDS`, imported on first use: each
    pulls its own libraries), or a plug-in given as "package.module:ClassName" (any importable
    class implementing `Environment`)."""
    return environment_class(kind, _CLASS_REFS)


def make_env(config: EnvConfig) -> Environment:
    """A fresh environment instance for `config.kind`."""
    return env_class(config.kind)(config)


def initial_specs(config: EnvConfig, seed: int) -> list[dict[str, Any]]:
    specs = env_class(config.kind).initial_specs(config, seed)
    env_class(config.kind).validate_spec(config, specs[0])  # fail at start-up, not mid-iteration
    return specs
