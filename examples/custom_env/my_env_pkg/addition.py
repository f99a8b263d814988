r"""A one-step environment brought to rlanything as a plug-in: add two numbers.

rlanything loads it from `env.kind: "my_env_pkg.addition:AdditionEnv"` (the folder holding
`my_env_pkg/` must be importable: installed, or on PYTHONPATH). `env.options` is validated by
`AdditionEnv.Options` (unknown keys and bad values are refused, naming the key) and reaches
the environment as `config.options`; `env.num_problems`, `env.max_steps` ... stay at `env`'s top.

A spec (what the task buffer stores, and what task adaptation rewrites) is `{"a": int, "b": int}`.
The policy answers inside \boxed{}; the outcome is +1 iff the answer is the sum.
"""

from __future__ import annotations

import json
import random
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from rlanything.envs.base import StepResult, parse_json_box

LIMIT = 10**6  # specs past it are refused: the rewrites must stay checkable


class AdditionOptions(BaseModel):
    """`env.options` of this environment."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    low: int = Field(1, ge=0)
    """Smallest operand of the initial problems."""
    high: int = Field(9, ge=0, le=LIMIT)
    """Largest operand of the initial problems."""


class AdditionEnv:
    Options = AdditionOptions
    system_prompt = "Add the two numbers. Give only the sum inside \\boxed{}."
    judge_hint = "A good step puts the correct sum of the two numbers in \\boxed{}."

    def __init__(self, config) -> None:
        self.options: AdditionOptions = config.options
        self._spec: dict[str, int] | None = None
        self._answer: str | None = None

    def reset(self, spec: dict[str, Any]) -> str:
        self._spec, self._answer = spec, None
        return f"What is {spec['a']} + {spec['b']}?"

    def step(self, action: str | None) -> StepResult:
        self._answer = action  # one step: the answer ends the episode
        return StepResult(observation="", done=True)

    def outcome(self) -> int:
        if self._spec is None or self._answer is None:
            return -1
        return 1 if self._answer.strip() == str(self._spec["a"] + self._spec["b"]) else -1

    def close(self) -> None:
        self._spec = None

    # --- specs and rewrites ---------------------------------------------------------------
    @staticmethod
    def initial_specs(config, seed: int) -> list[dict[str, Any]]:
        rng, low, high = random.Random(seed), config.options.low, config.options.high
        return [{"a": rng.randint(low, high), "b": rng.randint(low, high)} for _ in range(config.num_problems)]

    @staticmethod
    def validate_spec(config, spec: dict[str, Any]) -> None:
        if set(spec) != {"a", "b"}:
            raise ValueError(f"spec keys must be a, b; got {sorted(spec)}")
        for key in ("a", "b"):
            value = spec[key]
            if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= LIMIT:
                raise ValueError(f"{key} must be an integer in [0, {LIMIT}], got {value!r}")

    @staticmethod
    def rewrite_instructions(spec: dict[str, Any], direction: str) -> str:
        return (
            f"The problem adds a = {spec['a']} and b = {spec['b']}. Make it {direction} by choosing new "
            'operands (larger numbers are harder). Answer with {"a": A, "b": B} inside \\boxed{}.'
        )

    @staticmethod
    def parse_rewrite(spec: dict[str, Any], text: str) -> dict[str, Any]:
        return {**spec, **parse_json_box(text, {"a", "b"})}

    @staticmethod
    def rule_rewrite(spec: dict[str, Any], direction: str) -> str:
        """Harder: one more digit on each operand; easier: one digit less (a one-digit problem
        has no easier version)."""
        if direction == "harder":
            new = {"a": spec["a"] * 10 + 7, "b": spec["b"] * 10 + 3}
        elif max(spec["a"], spec["b"]) < 10:
            raise ValueError("both operands have one digit already: nothing easier")
        else:
            new = {"a": spec["a"] // 10, "b": spec["b"] // 10}
        return "\\boxed{" + json.dumps(new) + "}"
