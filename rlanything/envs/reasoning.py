"""Single-turn reasoning problems from `reasoning-gym` (RLVR), verified by the generator.

A spec is `{"dataset": name, "config": {difficulty knobs}, "seed": int}`: the generator
rebuilds the exact problem from it, so specs stay small and rewrites change the difficulty
knobs (a structured target). The outcome is +1 only for a full score
(`score_answer == 1.0`); partial credit counts as a failure, since the method's outcome is binary.

With `worked_example` on, the policy first sees one solved problem of the same generator and
knobs as an earlier chat turn (`example`): small models that ignore "put the answer in
\\boxed{}" copy the format of a turn they see answered. Its seed is `EXAMPLE_SEED`, never a
training or evaluation seed (envs/heldout.py).

Step labels (`step_labels`, the RM's process accuracy): an episode is one step, the answer, so
that step's label is the answer's correctness, the outcome (rule `answer`): process accuracy
equals the step outcome accuracy here.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import reasoning_gym

from rlanything.envs.base import Environment, StepLabel, StepResult, parse_json_box
from rlanything.envs.heldout import EXAMPLE_SEED
from rlanything.seeding import slot_seed

if TYPE_CHECKING:
    from rlanything.config import EnvConfig


def build_entry(spec: dict[str, Any]) -> dict[str, Any]:
    """The reasoning-gym entry (question, answer, metadata) a spec describes, and its dataset."""
    try:
        dataset = reasoning_gym.create_dataset(spec["dataset"], size=1, seed=int(spec["seed"]), **spec["config"])
        return {"entry": dataset[0], "dataset": dataset}
    except Exception as err:  # generators raise assorted errors on bad knobs
        raise ValueError(f"invalid reasoning-gym spec {spec}: {type(err).__name__}: {err}") from err


def worked_example(spec: dict[str, Any]) -> tuple[str, str]:
    r"""The problem of `spec`'s generator and knobs at `EXAMPLE_SEED`, and its solution: the
    expression and its value where the generator records one (arithmetic datasets), the
    generator's chain of thought where it has one (gsm_symbolic), then the boxed answer.

    >>> knobs = {"max_terms": 2, "max_digits": 1, "operators": ["+"], "allow_parentheses": False, "allow_negation": False}
    >>> worked_example({"dataset": "basic_arithmetic", "config": knobs, "seed": 5})
    ('Calculate 7 + 4.', '7 + 4 = 11. The answer is \\boxed{11}.')
    """
    entry = build_entry({**spec, "seed": EXAMPLE_SEED})["entry"]
    meta, answer = entry.get("metadata", {}), entry["answer"]
    if meta.get("expression"):
        work = f"{meta['expression']} = {answer}. "
    elif meta.get("answer_cot"):
        work = f"{meta['answer_cot']}\n"
    else:
        work = ""
    return entry["question"], f"{work}The answer is \\boxed{{{answer}}}."


class ReasoningGymEnv(Environment):
    system_prompt = "Solve the problem. Think step by step, then give only the final answer inside \\boxed{}."
    judge_hint = "A good step reasons correctly and puts the correct final answer in \\boxed{}."

    def __init__(self, config: EnvConfig | None = None) -> None:
        self._built: dict[str, Any] | None = None
        self._answer: str | None = None
        self._worked_example = bool(config is not None and config.options.worked_example)
        self.example: tuple[tuple[str, str], ...] | None = None
        """The one (question, answer) turn shown to the policy before the problem, or None."""

    def reset(self, spec: dict[str, Any]) -> str:
        self._built = build_entry(spec)
        self._answer = None
        self.example = (worked_example(spec),) if self._worked_example else None
        return self._built["entry"]["question"]

    def step(self, action: str | None) -> StepResult:
        self._answer = action
        return StepResult(observation="", done=True)

    def outcome(self) -> int:
        if self._built is None or self._answer is None:
            return -1
        score = self._built["dataset"].score_answer(self._answer, self._built["entry"])
        return 1 if score == 1.0 else -1

    def close(self) -> None:
        self._built = None

    @staticmethod
    def step_labels(config: EnvConfig, spec: dict[str, Any], actions: list[str | None]) -> list[StepLabel]:
        """The one step's label: its answer's correctness (+1 iff the verifier accepts it)."""
        if len(actions) != 1:
            raise ValueError(f"a reasoning-gym episode has one step, not {len(actions)}")
        env = ReasoningGymEnv()  # the worked example does not change the verdict
        env.reset(spec)
        env.step(actions[0])
        return [(env.outcome(), "answer")]

    @staticmethod
    def initial_specs(config: EnvConfig, seed: int) -> list[dict[str, Any]]:
        options = config.options
        return [
            {"dataset": options.dataset, "config": dict(options.dataset_config), "seed": slot_seed(seed, slot)}
            for slot in range(config.num_problems)
        ]

    @staticmethod
    def validate_spec(config: EnvConfig, spec: dict[str, Any]) -> None:
        if set(spec) != {"dataset", "config", "seed"}:
            raise ValueError(f"spec keys must be dataset, config, seed; got {sorted(spec)}")
        build_entry(spec)

    @staticmethod
    def rewrite_instructions(spec: dict[str, Any], direction: str) -> str:
        return (
            f"The problem generator is `{spec['dataset']}` with these difficulty parameters:\n"
            f"{json.dumps(spec['config'], sort_keys=True)}\n"
            f"Make the problems {direction} by changing these parameters (keep the same keys). "
            "Answer with the new parameters as one JSON object inside \\boxed{}."
        )

    @staticmethod
    def rule_rewrite(spec: dict[str, Any], direction: str) -> str:
        """Harder: every integer `max_*` knob +1. Easier: every `max_*` −1, not below its `min_*`
        partner (which then drops too, to at least 1)."""
        knobs = spec["config"]
        step = {"harder": 1, "easier": -1}[direction]
        new = {}
        for key, value in knobs.items():
            if key.startswith("max_") and isinstance(value, int) and not isinstance(value, bool):
                new[key] = max(1, value + step)
                low_key = "min_" + key[4:]
                if isinstance(knobs.get(low_key), int) and knobs[low_key] > new[key]:
                    new[low_key] = max(1, new[key])
        if not new or all(knobs[k] == v for k, v in new.items()):
            raise ValueError(f"no integer max_* knob to make {spec['dataset']} {direction}")
        return "\\boxed{" + json.dumps(new, sort_keys=True) + "}"

    @staticmethod
    def parse_rewrite(spec: dict[str, Any], text: str) -> dict[str, Any]:
        params = parse_json_box(text, set(spec["config"]) if spec["config"] else None)
        return {"dataset": spec["dataset"], "config": {**spec["config"], **params}, "seed": spec["seed"]}

    # --- held-out problems (evaluation) -------------------------------------------------------
    @staticmethod
    def heldout_specs(config: EnvConfig, split: str, n: int, seed: int) -> list[dict[str, Any]]:
        """in_domain: the training generator and knobs on evaluation seeds; ood: the same
        generator with every integer `max_*` knob two steps harder (the generator's defaults
        stand in for knobs the config leaves out).

        Kept apart: training seeds are `seeding.slot_seed(seed, slot)` (initial_specs) and rewrites
        change knobs, never the seed, so a training seed is ≡ slot (mod SLOT_STRIDE) for every run
        seed; evaluation seeds are ≡ 99_003..100_002 (`envs/heldout.py`), and any initial seed
        is dropped again explicitly."""
        from rlanything.envs.heldout import heldout_seeds

        knobs = dict(config.options.dataset_config)
        if split == "ood":
            knobs = _harder_knobs(config.options.dataset, knobs, steps=2)
        avoid = [s["seed"] for s in ReasoningGymEnv.initial_specs(config, seed)]
        return [
            {"dataset": config.options.dataset, "config": dict(knobs), "seed": s}
            for s in heldout_seeds(split, n, avoid)
        ]


def _harder_knobs(dataset: str, knobs: dict[str, Any], steps: int) -> dict[str, Any]:
    """`knobs` after `steps` of `rule_rewrite(…, "harder")`; with no integer `max_*` knob in
    `knobs`, those of the generator's default config are added first."""
    if not any(k.startswith("max_") and isinstance(v, int) and not isinstance(v, bool) for k, v in knobs.items()):
        import dataclasses

        from reasoning_gym.factory import DATASETS

        defaults = dataclasses.asdict(DATASETS[dataset][1]())
        knobs = {
            **{
                k: v
                for k, v in defaults.items()
                if k.startswith(("max_", "min_")) and isinstance(v, int) and not isinstance(v, bool)
            },
            **knobs,
        }
    spec = {"dataset": dataset, "config": knobs, "seed": 0}
    for _ in range(steps):
        spec = ReasoningGymEnv.parse_rewrite(spec, ReasoningGymEnv.rule_rewrite(spec, "harder"))
    return spec["config"]
