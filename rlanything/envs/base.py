"""What the environments share around their Protocol (`Environment`, declared in
rlanything/environment.py with the built-in kinds' table `ENV_KINDS`): the class and a fresh
instance of a kind (`env_class`, `make_env`), the optional members read for any environment
(`optional`), and the JSON answer format of rewrites (`parse_json_box`).

Built-in environments subclass `Environment` and so inherit the defaults of its optional
members; they import `Environment` and `StepResult` from here. Plug-ins: `env.kind:
"package.module:ClassName"` names any importable class that implements the Protocol,
subclassing it or not (loaded and checked by rlanything/plugins.py); its `env.options` are
validated by its pydantic model `Options` (a class attribute; none: it takes no options) and
reach it as `config.options`. A plug-in that does not subclass `Environment` may leave its
optional members out: code that reads them for any environment goes through `optional`, which
supplies the declared default. See examples/custom_env.
"""

from __future__ import annotations

import inspect
import json
from types import FunctionType
from typing import TYPE_CHECKING, Any

from rlanything.algo.parsing import extract_last_boxed
from rlanything.environment import OPTIONAL_MEMBERS, Environment, StepLabel, StepResult  # noqa: F401  (environments import StepResult from here)
from rlanything.plugins import environment_class

if TYPE_CHECKING:
    from rlanything.config import EnvConfig


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


def env_class(kind: str) -> type[Environment]:
    """The environment class of `kind`: a built-in name (`ENV_KINDS`, imported on first use: each
    pulls its own libraries), or a plug-in given as "package.module:ClassName" (any importable
    class implementing `Environment`)."""
    return environment_class(kind)


def make_env(config: EnvConfig) -> Environment:
    """A fresh environment instance for `config.kind`."""
    return env_class(config.kind)(config)


def initial_specs(config: EnvConfig, seed: int) -> list[dict[str, Any]]:
    specs = env_class(config.kind).initial_specs(config, seed)
    env_class(config.kind).validate_spec(config, specs[0])  # fail at start-up, not mid-iteration
    return specs
