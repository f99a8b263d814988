r"""ALFWorld's text games (package `alfworld`), for users who have its data locally.

ALFWorld's games are PDDL problems in `<data>/<task folder>/<trial>/game.tw-pddl`, fetched by
`alfworld-download` (not shipped in the wheel, and never downloaded by us). They are played
with TextWorld's PDDL backend, which needs `fast-downward-textworld` (pulled in by
`textworld[pddl]`; on Python versions without its wheel it compiles from source, ~10 minutes);
ALFWorld's own wrappers give objects their "apple 1" names, as in the papers.

A spec is `{"task_type": "pick_and_place_simple", "index": 12}`: the 12th game (sorted by path,
modulo their number) of that task type under `env.options.data_path`; held-out specs add
`"split": "valid_seen"` or `"valid_unseen"`, ALFWorld's evaluation folders beside it. Like ALFWorld's loader we
skip games marked unsolvable and the `movable`/`Sliced` variants. Specs are small and portable
across machines holding the same data; the game file behind each is in `game_path`.

The episode is that of every text game here (`textgame.py`): the goal is ALFWorld's "Your task is
to: ..." line, the commands its admissible commands. Outcome: +1 iff the game reports `won`.

Task adaptation picks another game: a different task type and/or index. `TASK_TYPES` is ordered
from easier to harder (our reading of ALFWorld's per-type success rates: placing one object,
examining in light, then clean/heat/cool before placing, then placing two); `rule_rewrite`
moves one type along it.

No step labels (`envs.base.step_labels` gives None; the RM's process accuracy is not logged).
The PDDL backend can replan from any state (`EnvInfos(policy_commands=True)`, a fast-downward
search per step), so the TextWorld rule would carry over; it is not wired, since it cannot be
tested without ALFWorld's data.
"""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlanything.environment import ALFWORLD_TASK_TYPES
from rlanything.envs.textgame import TextGameEnv, forget_parse_failures, observation, parse_json_box, tidy
from rlanything.seeding import slot_seed

if TYPE_CHECKING:
    from rlanything.config import EnvConfig

TASK_TYPES = ALFWORLD_TASK_TYPES  # easier to harder; the options' default lists them all
HELDOUT_FOLDERS = ("valid_seen", "valid_unseen")  # ALFWorld's held-out games, beside train/
INSTALL_HINT = "pip install alfworld==0.4.2 (needs textworld[pddl]) and run alfworld-download"


def data_path(config: EnvConfig) -> Path:
    if config.options.data_path:
        return Path(config.options.data_path).expanduser()
    root = os.environ.get("ALFWORLD_DATA", "~/.cache/alfworld")
    return Path(root).expanduser() / "json_2.1.1" / "train"


@functools.cache
def _games(root: str) -> dict[str, tuple[str, ...]]:
    """task type -> sorted game files under `root` (solvable ones, as ALFWorld's loader keeps)."""
    found: dict[str, list[str]] = {t: [] for t in TASK_TYPES}
    for game in sorted(Path(root).rglob("game.tw-pddl")):
        folder = game.parent
        if "movable" in str(folder) or "Sliced" in str(folder) or not (folder / "traj_data.json").is_file():
            continue
        task_type = json.loads((folder / "traj_data.json").read_text()).get("task_type")
        if task_type in found and json.loads(game.read_text()).get("solvable", False):
            found[task_type].append(str(game))
    return {t: tuple(files) for t, files in found.items()}


def game_path(config: EnvConfig, spec: dict[str, Any]) -> Path:
    """The game file of a spec; ValueError if the spec is malformed or the data lacks it."""
    if set(spec) - {"split"} != {"task_type", "index"}:
        raise ValueError(f"spec keys must be task_type, index[, split]; got {sorted(spec)}")
    if spec.get("split", HELDOUT_FOLDERS[0]) not in HELDOUT_FOLDERS:
        raise ValueError(f"split must be one of {list(HELDOUT_FOLDERS)}; got {spec['split']!r}")
    if spec["task_type"] not in TASK_TYPES:
        raise ValueError(f"unknown ALFWorld task type {spec['task_type']!r}; one of {list(TASK_TYPES)}")
    if not isinstance(spec["index"], int) or isinstance(spec["index"], bool) or spec["index"] < 0:
        raise ValueError(f"index must be a non-negative integer, got {spec['index']!r}")
    root = data_path(config)
    if "split" in spec:  # a held-out game: the sibling folder of the training data
        root = root.parent / spec["split"]
    if not root.is_dir():
        raise ValueError(f"no ALFWorld data at {root}: set env.options.data_path ({INSTALL_HINT})")
    games = _games(str(root.resolve()))[spec["task_type"]]
    if not games:
        raise ValueError(f"no solvable {spec['task_type']} game under {root}")
    return Path(games[spec["index"] % len(games)])


def _start(path: Path, policy_commands: bool = False):
    import textworld
    from alfworld.agents.environment.alfred_tw_env import AlfredDemangler, AlfredInfos

    infos = textworld.EnvInfos(won=True, admissible_commands=True, policy_commands=policy_commands)
    try:
        return textworld.start(str(path), infos, wrappers=[AlfredDemangler(shuffle=False), AlfredInfos])
    finally:
        forget_parse_failures()  # the PDDL parsers' kept failure would hold the caller's frames


def expert_plan(config: EnvConfig, spec: dict[str, Any]) -> list[str]:
    """A winning command sequence from the PDDL planner (fast-downward)."""
    game = _start(game_path(config, spec), policy_commands=True)
    try:
        return list(game.reset().policy_commands)
    finally:
        game.close()


def split_intro(text: str) -> tuple[str, str]:
    """ALFWorld's first text -> (goal, room description).

    >>> split_intro("-= Welcome to TextWorld, ALFRED! =-\\n\\nYou see a fridge 1.\\n\\nYour task is to: cool an apple.")
    ('cool an apple.', 'You see a fridge 1.')
    """
    body = text.split("=-", 2)[-1] if text.lstrip().startswith("-=") else text
    room, _, goal = body.partition("Your task is to:")
    return tidy(goal), tidy(room)


class AlfWorldEnv(TextGameEnv):
    def reset(self, spec: dict[str, Any]) -> str:
        path = game_path(self.config, spec)
        self.close()
        self._game = _start(path)
        state = self._game.reset()
        forget_parse_failures()  # the reset parses the PDDL problem again
        self._goal, room = split_intro(state.feedback)
        self._commands = sorted(state.admissible_commands)
        self._won = self._done = False
        return observation(self._goal, room, self._commands, self.wording)

    # --- specs and rewrites -------------------------------------------------------------------
    @staticmethod
    def initial_specs(config: EnvConfig, seed: int) -> list[dict[str, Any]]:
        types = [t for t in config.options.task_types if t in TASK_TYPES]
        if not types:
            raise ValueError(f"env.options.task_types holds no known task type; one of {list(TASK_TYPES)}")
        return [
            {"task_type": types[slot % len(types)], "index": slot_seed(seed, slot // len(types)) % 2**31}
            for slot in range(config.num_problems)
        ]

    @staticmethod
    def validate_spec(config: EnvConfig, spec: dict[str, Any]) -> None:
        game = _start(game_path(config, spec))
        try:
            game.reset()
        except Exception as err:  # a broken game file
            raise ValueError(f"ALFWorld game of {spec} does not load: {type(err).__name__}: {err}") from err
        finally:
            game.close()

    @staticmethod
    def rewrite_instructions(spec: dict[str, Any], direction: str) -> str:
        return (
            f"The task is an ALFWorld household game of type `{spec['task_type']}` (game number "
            f"{spec['index']}). Task types from easier to harder: {', '.join(TASK_TYPES)}.\n"
            f"Make it {direction} by choosing another task type and/or another game number.\n"
            'Answer with a JSON object with "task_type" and/or "index" inside \\boxed{}.'
        )

    @staticmethod
    def parse_rewrite(spec: dict[str, Any], text: str) -> dict[str, Any]:
        params = parse_json_box(text, {"task_type", "index"})
        new = {**spec, **params}
        if new["task_type"] not in TASK_TYPES:
            raise ValueError(f"unknown ALFWorld task type {new['task_type']!r}; one of {list(TASK_TYPES)}")
        if not isinstance(new["index"], int) or isinstance(new["index"], bool) or new["index"] < 0:
            raise ValueError(f"index must be a non-negative integer, got {new['index']!r}")
        return new

    @staticmethod
    def rule_rewrite(spec: dict[str, Any], direction: str) -> str:
        position = TASK_TYPES.index(spec["task_type"]) + {"harder": 1, "easier": -1}[direction]
        if not 0 <= position < len(TASK_TYPES):
            raise ValueError(f"no task type {direction} than {spec['task_type']}")
        return "\\boxed{" + json.dumps({"task_type": TASK_TYPES[position]}) + "}"

    # --- held-out problems (evaluation) -------------------------------------------------------
    @staticmethod
    def heldout_specs(config: EnvConfig, split: str, n: int, seed: int) -> list[dict[str, Any]]:
        """ALFWorld's own evaluation games, in the folders beside the training data:
        in_domain = `valid_seen` (rooms seen in training, games not), ood = `valid_unseen`
        (rooms never seen), the configured task types in turn, games in order.

        Kept apart: training specs have no `split` key, so they always name a game of the
        training folder (`game_path`), and no rewrite adds one; the held-out games live in
        other folders of ALFWorld's data. `seed` is unused: the games are listed in order."""
        from rlanything.envs.heldout import check_split

        check_split(split)
        types = [t for t in config.options.task_types if t in TASK_TYPES] or list(TASK_TYPES)
        folder = HELDOUT_FOLDERS[0] if split == "in_domain" else HELDOUT_FOLDERS[1]
        return [{"task_type": types[k % len(types)], "index": k // len(types), "split": folder} for k in range(n)]
