r"""TextWorld-Express games (`textworld-express`), above all `twc`, the ALFWorld-like tidy-up.

A spec is `{"game": "twc", "params": {"numLocations": 1, "numItemsToPutAway": 1,
"includeDoors": 0}, "seed": 7, "fold": "train"}`: TextWorld-Express generates the same game
from it every time (the seed picks the world, the fold the object split: train, dev or test).
The episode and the answer format are those of every text game here (`textgame.py`); the goal is
the game's task description, the commands its valid actions, sorted. Outcome: +1 iff the game
reports `tasksuccess`.

TextWorld-Express runs in a JVM (Java 17, through py4j). Starting one costs seconds and
~100 MB, and the rollout loop keeps `tasks × group_size` environments open at once, so every
environment of a process shares one JVM and owns one game object (`PythonInterface`) in it;
the JVM dies with the process.

Task adaptation changes the generation parameters (the game's own names, e.g. twc's
numLocations, numItemsToPutAway, includeDoors, limitInventorySize) and/or the seed; the game
itself checks them (`validate_spec` loads and generates the game). `rule_rewrite` moves the
game's main knob (`MAIN_KNOB`) by one.

No step labels (`envs.base.step_labels` gives None; the RM's process accuracy is not logged):
TextWorld-Express gives its gold path from the start of a game only, never the remaining one
from a later state, so the TextWorld rule (did the remaining shortest solution shrink) would
need a search over its valid actions in the JVM at every step.
"""

from __future__ import annotations

import json
import threading
from typing import TYPE_CHECKING, Any

from rlanything.envs.base import Environment, StepResult
from rlanything.envs.textgame import (
    JUDGE_HINT,
    WORDINGS,
    invalid_observation,
    judge_view,
    observation,
    parse_json_box,
    resolve_command,
    tidy,
    wording_name,
    worked_example,
)
from rlanything.seeding import slot_seed

if TYPE_CHECKING:
    from rlanything.config import EnvConfig

PARAMS = {
    "twc": ("numLocations", "numItemsToPutAway", "includeDoors", "limitInventorySize"),
    "cookingworld": ("numLocations", "numDistractorItems", "numIngredients", "includeDoors", "limitInventorySize"),
    "coin": ("numLocations", "numDistractorItems", "includeDoors", "limitInventorySize"),
    "mapreader": (
        "numLocations",
        "maxDistractorItemsPerLocation",
        "includeDoors",
        "limitInventorySize",
        "maxDistanceApart",
    ),
    "simonsays": ("gameLength", "numDistractors", "memorization", "verbose"),
    "arithmetic": (),
    "sorting": (),
    "peckingorder": (),
}  # the games' "Known properties"
MAIN_KNOB = {
    "twc": "numItemsToPutAway",
    "cookingworld": "numIngredients",
    "coin": "numLocations",
    "mapreader": "numLocations",
    "simonsays": "gameLength",
}

_JVM = None
_JVM_LOCK = threading.Lock()


def _new_game():
    """A fresh game object in this process's shared JVM (started on first use)."""
    global _JVM
    with _JVM_LOCK:
        if _JVM is None:
            from textworld_express import TextWorldExpressEnv as _Server

            _JVM = _Server(envStepLimit=10**9)  # we never use its step limit: the rollout loop caps steps
        return _JVM._gateway.jvm.textworldexpress.runtime.PythonInterface()


def _param_string(params: dict[str, Any]) -> str:
    """{"numLocations": 1, "includeDoors": 0} -> "includeDoors=0,numLocations=1"."""
    return ",".join(f"{k}={int(v)}" for k, v in sorted(params.items()))


def _check(spec: dict[str, Any]) -> None:
    if set(spec) != {"game", "params", "seed", "fold"}:
        raise ValueError(f"spec keys must be game, params, seed, fold; got {sorted(spec)}")
    if spec["game"] not in PARAMS:
        raise ValueError(f"unknown TextWorld-Express game {spec['game']!r}; one of {sorted(PARAMS)}")
    if spec["fold"] not in ("train", "dev", "test"):
        raise ValueError(f"fold must be train, dev or test; got {spec['fold']!r}")
    seed = spec["seed"]
    if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed < 2**31:
        raise ValueError(f"seed must be an integer in [0, 2**31), got {seed!r}")
    for key, value in spec["params"].items():
        if not isinstance(value, int) or isinstance(value, bool):
            raise ValueError(f"parameter {key} must be an integer, got {value!r}")


def _start(game, spec: dict[str, Any], gold: bool = False) -> dict[str, Any]:
    """Load and generate the spec's game in `game`; -> the first response (parsed JSON)."""
    _check(spec)
    message = game.load(spec["game"], _param_string(spec["params"]))
    if message:
        raise ValueError(f"TextWorld-Express refuses {spec['game']} {spec['params']}: {message.strip()}")
    try:
        return json.loads(game.generateNewGameJSON(spec["seed"], spec["fold"], gold))
    except Exception as err:  # py4j wraps the game's exceptions
        raise ValueError(f"TextWorld-Express could not generate {spec}: {str(err)[:300]}") from err


def gold_path(spec: dict[str, Any]) -> list[str]:
    """The game's own winning command sequence."""
    game = _new_game()
    _start(game, spec, gold=True)
    return list(game.getGoldActionSequence())


class TextWorldExpressEnv(Environment):
    judge_hint = JUDGE_HINT
    judge_view = staticmethod(judge_view)

    def __init__(self, config: EnvConfig) -> None:
        self.config = config
        self._game = None
        self._goal, self._commands = "", []
        self._won = self._done = False
        self.example: tuple[tuple[str, str], ...] | None = None
        """A won episode of another game of the same settings (`textgame.worked_example`), or None."""
        self.wording = WORDINGS["shipped"]
        """How the game is put to the policy (`options.wording`), set by `reset`."""

    @property
    def system_prompt(self) -> str:
        return self.wording.system_prompt

    def reset(self, spec: dict[str, Any]) -> str:
        self.wording = WORDINGS[wording_name(self.config.options.wording, spec)]
        if self.config.options.worked_example:  # before this game loads: the example has its own
            self.example = worked_example(self, spec, gold_path)
        if self._game is None:
            self._game = _new_game()
        first = _start(self._game, spec)
        self._goal = tidy(self._game.getTaskDescription())
        self._commands = sorted(first["validActions"])
        self._won = self._done = False
        return observation(self._goal, tidy(first["observation"]), self._commands, self.wording)

    def step(self, action: str | None) -> StepResult:
        command = resolve_command(action, self._commands)
        if command is None or self._done:
            return StepResult(invalid_observation(self._goal, action, self._commands, self.wording), done=False)
        info = json.loads(self._game.stepJSON(command))
        self._won = bool(info["tasksuccess"]) or info["score"] >= 1.0
        self._done = self._won or bool(info["taskfailure"])
        self._commands = sorted(info["validActions"])
        feedback = tidy(info["observation"])
        if self._done:
            return StepResult(feedback, done=True)
        return StepResult(observation(self._goal, feedback, self._commands, self.wording), done=False)

    def outcome(self) -> int:
        return 1 if self._won else -1

    def close(self) -> None:
        self._game = None  # py4j releases the Java object; the shared JVM stays

    # --- specs and rewrites -------------------------------------------------------------------
    @staticmethod
    def initial_specs(config: EnvConfig, seed: int) -> list[dict[str, Any]]:
        twx = config.options
        return [
            {"game": twx.game, "params": dict(twx.params), "seed": slot_seed(seed, slot) % 2**31, "fold": twx.fold}
            for slot in range(config.num_problems)
        ]

    @staticmethod
    def validate_spec(config: EnvConfig, spec: dict[str, Any]) -> None:
        if not gold_path(spec):
            raise ValueError(f"TextWorld-Express gives no gold path for {spec}")

    @staticmethod
    def rewrite_instructions(spec: dict[str, Any], direction: str) -> str:
        current = json.dumps({**spec["params"], "seed": spec["seed"]}, sort_keys=True)
        names = ", ".join(PARAMS[spec["game"]]) or "(none)"
        return (
            f"The game is TextWorld-Express `{spec['game']}` with these integer settings:\n{current}\n"
            f"Make it {direction} by changing some of them (the game's settings: {names}; 0/1 for "
            "include*/limit* switches) or the seed, which gives a different world of the same size.\n"
            "Answer with only the settings you change, as one JSON object inside \\boxed{}."
        )

    @staticmethod
    def parse_rewrite(spec: dict[str, Any], text: str) -> dict[str, Any]:
        params = parse_json_box(text, set(PARAMS[spec["game"]]) | set(spec["params"]) | {"seed"})
        seed = params.pop("seed", spec["seed"])
        new = {**spec, "params": {**spec["params"], **params}, "seed": seed}
        _check(new)
        return new

    @staticmethod
    def rule_rewrite(spec: dict[str, Any], direction: str) -> str:
        knob = MAIN_KNOB.get(spec["game"])
        if knob is None:
            raise ValueError(f"no difficulty knob for {spec['game']}")
        value = int(spec["params"].get(knob, 1)) + {"harder": 1, "easier": -1}[direction]
        if value < 1:
            raise ValueError(f"{knob} cannot go below 1")
        return "\\boxed{" + json.dumps({knob: value}) + "}"

    # --- held-out problems (evaluation) -------------------------------------------------------
    @staticmethod
    def heldout_specs(config: EnvConfig, split: str, n: int, seed: int) -> list[dict[str, Any]]:
        """Games of TextWorld-Express's own `test` fold (its held-out objects and rooms) on
        evaluation seeds. in_domain: the training game and parameters; ood: a bigger world
        (numLocations + 2 where the game has it) and the main knob one step harder.

        Kept apart: training specs keep the configured fold (rewrites change parameters and
        seed only) and initial seeds are `seeding.slot_seed(seed, slot) % 2**31`; evaluation
        seeds have a residue modulo SLOT_STRIDE no slot has (`envs/heldout.py`), the run's initial seeds
        are dropped explicitly, and the evaluation drops any seed the run's buffer holds (a
        model rewrite may pick any)."""
        from rlanything.envs.heldout import heldout_seeds

        twx = config.options
        params = dict(twx.params)
        if split == "ood":
            if "numLocations" in PARAMS.get(twx.game, ()):
                params["numLocations"] = int(params.get("numLocations", 1)) + 2
            knob = MAIN_KNOB.get(twx.game)
            if knob is not None and knob != "numLocations":
                params[knob] = int(params.get(knob, 1)) + 1
        avoid = [s["seed"] for s in TextWorldExpressEnv.initial_specs(config, seed)]
        return [
            {"game": twx.game, "params": dict(params), "seed": s, "fold": "test"}
            for s in heldout_seeds(split, n, avoid)
        ]
