"""A one-word smoke / learning-check environment: answer with a word that starts with a given letter.

Not a benchmark. It exists so that a random-init model can show learning within a few CPU
minutes: the right answer is any word whose first letter is one of `letters` (default "a"), so
even a model that writes random tokens succeeds now and then (about 8% of the SmolLM2
vocabulary's tokens start with an "a", 27% with a vowel), and reinforcement alone can make its
greedy answer a right one. The learning test (tests/flows/test_learning.py) runs it through
the real training flow with configs/tiny-learn.yaml.

A spec is `{"letters": str, "seed": int}`. The seed only picks the topic words shown in the
prompt, so problems differ while the rule stays the same: held-out problems (seeds never used
in training) check that what was learned does not hang on one prompt. The answer is the
content of the last \\boxed{} or, with `env.answer_fallback: first_word`, the response's
first word. Difficulty knob (task adaptation): fewer letters is harder, more is easier.
"""

from __future__ import annotations

import json
import random
from typing import TYPE_CHECKING, Any

from rlanything.envs.base import Environment, StepResult, parse_json_box
from rlanything.seeding import slot_seed

if TYPE_CHECKING:
    from rlanything.config import EnvConfig

TOPICS = (
    "river stone cloud garden window bridge candle forest market winter mirror ladder "
    "engine harbor pencil meadow castle rocket violin thunder basket lantern desert island"
).split()
# The order letters are added in (easier) or dropped in (harder): by how many tokens of the
# SmolLM2 vocabulary start with them, so "easier" raises a random model's base rate the most.
LETTER_ORDER = "csapiredmtobflhguwnvkjyqzx"


def _letters(value: Any) -> str:
    if not isinstance(value, str) or not value or not value.isalpha() or not value.islower():
        raise ValueError(f"letters must be a non-empty string of lowercase letters a-z, got {value!r}")
    if len(set(value)) != len(value) or not set(value) <= set(LETTER_ORDER):
        raise ValueError(f"letters must be distinct letters a-z, got {value!r}")
    return value


class FirstLetterEnv(Environment):
    system_prompt = "Answer with a single word."
    judge_hint = "A good step answers with one word that starts with a letter the task allows."

    def __init__(self, config: EnvConfig | None = None) -> None:
        self._letters: str | None = None
        self._answer: str | None = None

    def reset(self, spec: dict[str, Any]) -> str:
        self._letters, self._answer = _letters(spec["letters"]), None
        topics = random.Random(int(spec["seed"])).sample(TOPICS, 3)
        allowed = ", ".join(f"'{c}'" for c in self._letters)
        return f"Topic words: {', '.join(topics)}. Reply with one word that starts with one of the letters {allowed}."

    def step(self, action: str | None) -> StepResult:
        self._answer = action
        return StepResult(observation="", done=True)

    def outcome(self) -> int:
        if self._letters is None or not self._answer:
            return -1
        return 1 if self._answer[0].lower() in self._letters else -1

    def close(self) -> None:
        self._letters = None

    @staticmethod
    def initial_specs(config: EnvConfig, seed: int) -> list[dict[str, Any]]:
        letters = _letters(config.options.letters)
        return [{"letters": letters, "seed": slot_seed(seed, slot)} for slot in range(config.num_problems)]

    @staticmethod
    def heldout_specs(config: EnvConfig, split: str, n: int, seed: int) -> list[dict[str, Any]]:
        """in_domain: the training letters on evaluation seeds (other topic words); ood: the
        letters after two rule steps harder (fewer letters allowed, at least one).

        Kept apart as in every seeded environment: training seeds are `seeding.slot_seed(seed, slot)`
        and rewrites keep the seed; evaluation seeds have a residue no slot has
        (`envs/heldout.py`), and the run's initial seeds are dropped explicitly."""
        from rlanything.envs.heldout import heldout_seeds

        letters = _letters(config.options.letters)
        if split == "ood":
            letters = "".join(sorted(letters, key=LETTER_ORDER.index)[: max(1, len(letters) - 2)])
        avoid = [s["seed"] for s in FirstLetterEnv.initial_specs(config, seed)]
        return [{"letters": letters, "seed": s} for s in heldout_seeds(split, n, avoid)]

    @staticmethod
    def validate_spec(config: EnvConfig, spec: dict[str, Any]) -> None:
        if set(spec) != {"letters", "seed"}:
            raise ValueError(f"spec keys must be letters, seed; got {sorted(spec)}")
        if not isinstance(spec["seed"], int) or isinstance(spec["seed"], bool):
            raise ValueError(f"seed must be an integer, got {spec['seed']!r}")
        _letters(spec["letters"])

    @staticmethod
    def rewrite_instructions(spec: dict[str, Any], direction: str) -> str:
        return (
            f"A right answer is a word that starts with one of the letters {json.dumps(spec['letters'])}. "
            f"Make the problem {direction}: fewer letters is harder, more letters is easier. "
            'Answer with the new letters as one JSON object inside \\boxed{}, e.g. {"letters": "..."}.'
        )

    @staticmethod
    def rule_rewrite(spec: dict[str, Any], direction: str) -> str:
        """Harder: drop the least frequent letter (at least one stays). Easier: add the most
        frequent letter not yet allowed."""
        letters = _letters(spec["letters"])
        if direction == "harder":
            if len(letters) == 1:
                raise ValueError(f"letters {letters!r}: a single letter cannot get harder")
            new = "".join(sorted(letters, key=LETTER_ORDER.index)[:-1])
        elif direction == "easier":
            missing = [c for c in LETTER_ORDER if c not in letters]
            if not missing:
                raise ValueError("every letter is already allowed")
            new = letters + missing[0]
        else:
            raise ValueError(f"direction must be harder or easier, got {direction!r}")
        return "\\boxed{" + json.dumps({"letters": new}) + "}"

    @staticmethod
    def parse_rewrite(spec: dict[str, Any], text: str) -> dict[str, Any]:
        params = parse_json_box(text, {"letters"})
        return {"letters": _letters(params["letters"]), "seed": spec["seed"]}
