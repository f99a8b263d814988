r"""TextWorld games generated offline, the way `tw-make` makes them (multi-turn).

A spec is `{"game": TYPE, "options": {...}, "seed": int}`: TYPE is one of `tw-make`'s game
types (`custom`, `tw-simple`, `tw-cooking`, `tw-treasure_hunter`, `tw-coin_collector`) and
`options` are its command-line settings with `_` for `-`; `true` stands for a bare flag.
`{"game": "custom", "options": {"world_size": 3, "nb_objects": 4, "quest_length": 2}, "seed": 1234}`
is the game of `tw-make custom --world-size 3 --nb-objects 4 --quest-length 2 --seed 1234`.
The options are parsed by `tw-make`'s own argument definitions (the custom ones are mirrored
here, the challenges' come from `textworld.challenges`), so a spec holds exactly what `tw-make`
accepts, plus a few size caps (`CAPS`) that keep generation time bounded.

Games are generated on first use, in this process (as `tw-make` does, minus a Python start-up
per game), and cached under `env.options.games_dir` (default
`<cache_dir()>/textworld/<type>-<hash of spec and textworld version>/`), built in a temporary
folder and renamed into place so a folder that exists is complete. Generation also plays the
game's walkthrough once: a game its own walkthrough cannot win is refused (ValueError), which is
what `validate_spec` relies on.

The episode: see `textgame.py` (goal + feedback + numbered admissible commands; the answer is a
command or its number in \boxed{}; anything else costs a step and changes nothing).
Outcome: +1 iff the game reports `won`.

Step labels (`step_labels`, the RM's process accuracy): a step is good (+1) iff after it the
goal is no farther: the number of commands TextWorld's quest tracker still needs to win (the
length of `policy_commands`, `EnvInfos(policy_commands=True)`: the walkthrough, updated after
every command, shortened where the state allows, lengthened by the commands that undo a detour;
0 once won) did not grow. The trajectory's actions are replayed from reset, reading the length
before and after each. The cases, as the `rule` column names them: `closer` +1 (it shrank);
`unchanged` +1 (an admissible command the goal does not need: look, examine, inventory);
`farther` −1 (it grew: leaving the room the goal is in, closing the container to take from);
`lost` −1 (the game is lost); `invalid` −1 (not an admissible command, or no command: nothing
reaches the game and the state is unchanged).
Why an admissible no-op is +1 and an invalid answer −1, though neither changes the state: the
first can gather what the goal needs (TextWorld's own walkthroughs hold such steps; tw-cooking's
starts with `inventory`, `examine cookbook`), the second only brings back the list of valid
commands, a step wasted. TextWorld's `intermediate_reward` counts both 0; the `rule` column keeps
`unchanged` apart for a stricter reading (only `closer` good). The rule is local: a step that
undoes an earlier detour (going back) is `closer`. Where the tracker gives up (an irreversible
command it cannot plan around leaves no policy though the game goes on), that command and the
later admissible ones get no label (an invalid one is still −1).

Task adaptation changes the generation knobs (`REWRITE_KNOBS`) and/or the seed; the game type
stays. `rule_rewrite` moves the main knob by one step (quest length, recipe size, level...).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import tempfile
import threading
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import textworld
import textworld.challenges
from textworld.generator import compile_game

from rlanything.envs.base import StepLabel
from rlanything.envs.textgame import (
    WORDINGS,
    TextGameEnv,
    forget_parse_failures,
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

GAMES = ("custom", "tw-simple", "tw-cooking", "tw-treasure_hunter", "tw-coin_collector")
CAPS = {
    "world_size": 12,
    "nb_objects": 40,
    "quest_length": 12,
    "quest_max_length": 12,
    "quest_breadth": 5,
    "nb_parallel_quests": 4,
    "recipe": 5,
    "take": 5,
}
REWRITE_KNOBS = {
    "custom": {
        "world_size": "rooms",
        "nb_objects": "minimum number of objects",
        "quest_length": "actions the quest needs",
        "quest_breadth": "sub-quests",
        "nb_parallel_quests": "quests to complete",
    },
    "tw-cooking": {
        "recipe": "ingredients in the recipe (1-5)",
        "take": "ingredients to find (<= recipe)",
        "go": "rooms: 1, 6, 9 or 12",
        "open": "containers/doors must be opened (true/false)",
        "cook": "ingredients must be cooked (true/false)",
        "cut": "ingredients must be cut (true/false)",
        "drop": "limited inventory (true/false)",
    },
    "tw-treasure_hunter": {"level": "difficulty 1-30"},
    "tw-coin_collector": {"level": "difficulty 1-300"},
    "tw-simple": {"rewards": "dense, balanced or sparse", "goal": "detailed, brief or none"},
}
INFOS = textworld.EnvInfos(
    admissible_commands=True, objective=True, description=True, won=True, lost=True, extras=["walkthrough"]
)
LABEL_INFOS = textworld.EnvInfos(admissible_commands=True, policy_commands=True, won=True, lost=True)
_GENERATION_LOCK = threading.Lock()  # textworld's generator is not made for concurrent use


# ---------------------------------------------------------------------------------------------
# Options -> tw-make arguments -> a game file


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse would exit the process
        raise ValueError(f"{self.prog}: {message}")


def _add_custom_arguments(parser: argparse.ArgumentParser) -> None:
    """`tw-make custom`'s settings (the script defines them inline, so they are mirrored here)."""
    for flag, default in (
        ("--world-size", 5),
        ("--nb-objects", 10),
        ("--nb-parallel-quests", 1),
        ("--quest-length", None),
        ("--quest-breadth", None),
        ("--quest-min-length", 1),
        ("--quest-max-length", 5),
        ("--quest-min-breadth", 1),
        ("--quest-max-breadth", 5),
        ("--quest-min-depth", 1),
        ("--quest-max-depth", 5),
    ):
        parser.add_argument(flag, type=int, default=default)
    parser.add_argument("--theme", default="house")
    for flag in (
        "--include-adj",
        "--blend-descriptions",
        "--ambiguous-instructions",
        "--only-last-action",
        "--blend-instructions",
        "--entity-numbering",
    ):
        parser.add_argument(flag, action="store_true")


def tw_make_argv(spec: dict[str, Any]) -> list[str]:
    """The `tw-make` command line of a spec.

    >>> tw_make_argv({"game": "custom", "options": {"world_size": 3, "include_adj": True}, "seed": 7})
    ['custom', '--include-adj', '--world-size', '3', '--seed', '7']
    """
    argv = [spec["game"]]
    for key, value in sorted(spec["options"].items()):
        if value is True:
            argv.append("--" + key.replace("_", "-"))
        elif value is not False and value is not None:
            argv += ["--" + key.replace("_", "-"), str(value)]
    return argv + ["--seed", str(spec["seed"])]


def parse_options(spec: dict[str, Any]) -> argparse.Namespace:
    """tw-make's settings of a spec; ValueError naming what tw-make (or a cap) refuses."""
    if set(spec) != {"game", "options", "seed"}:
        raise ValueError(f"spec keys must be game, options, seed; got {sorted(spec)}")
    game, options, seed = spec["game"], spec["options"], spec["seed"]
    if game not in GAMES:
        raise ValueError(f"unknown TextWorld game type {game!r}; one of {list(GAMES)}")
    if not isinstance(options, dict):
        raise ValueError("options must be a mapping of tw-make settings")
    if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed < 2**31:
        raise ValueError(f"seed must be an integer in [0, 2**31), got {seed!r}")
    for key, cap in CAPS.items():
        value = options.get(key)
        if isinstance(value, int) and value > cap:
            raise ValueError(f"{key}={value} is above the cap {cap} (generation time grows fast)")
    parser = _Parser(prog=f"tw-make {game}", add_help=False)
    if game == "custom":
        _add_custom_arguments(parser)
    else:
        textworld.challenges.CHALLENGES[game][2](parser)
    return parser.parse_args(tw_make_argv(spec)[1:-2])


def _generate(spec: dict[str, Any], folder: Path) -> None:
    """Write `folder/game.z8` (+ .json, .ni), as `tw-make` would, then check its walkthrough wins."""
    args = parse_options(spec)
    options = textworld.GameOptions()
    options.seeds = spec["seed"]
    options.path = str(folder / "game.z8")
    options.file_ext = ".z8"
    options.force_recompile = True
    try:
        if spec["game"] == "custom":
            options.nb_rooms, options.nb_objects = args.world_size, args.nb_objects
            options.nb_parallel_quests = args.nb_parallel_quests
            chaining = options.chaining
            chaining.min_length, chaining.max_length = args.quest_min_length, args.quest_max_length
            chaining.min_breadth, chaining.max_breadth = args.quest_min_breadth, args.quest_max_breadth
            chaining.min_depth, chaining.max_depth = args.quest_min_depth, args.quest_max_depth
            if args.quest_length:
                chaining.min_length = chaining.max_length = chaining.max_depth = args.quest_length
            if args.quest_breadth:
                chaining.min_breadth = chaining.max_breadth = args.quest_breadth
            grammar = options.grammar
            grammar.theme, grammar.include_adj = args.theme, args.include_adj
            grammar.only_last_action, grammar.blend_instructions = args.only_last_action, args.blend_instructions
            grammar.blend_descriptions = args.blend_descriptions
            grammar.ambiguous_instructions = args.ambiguous_instructions
            grammar.allowed_variables_numbering = args.entity_numbering
            textworld.make(options)
        else:
            make_game = textworld.challenges.CHALLENGES[spec["game"]][1]
            compile_game(make_game(settings={**vars(args), "seed": spec["seed"]}, options=options), options)
    except Exception as err:  # QuestGenerationError, MissingTextGrammar, challenge ValueErrors...
        raise ValueError(f"tw-make {' '.join(tw_make_argv(spec)[1:])} failed: {type(err).__name__}: {err}") from err
    walkthrough = _check_walkthrough(folder / "game.z8")
    (folder / "walkthrough.json").write_text(json.dumps(walkthrough))
    (folder / "spec.json").write_text(json.dumps({**spec, "tw_make": "tw-make " + " ".join(tw_make_argv(spec))}))


def start_game(path: Path, infos: textworld.EnvInfos = INFOS):
    """A TextWorld environment playing the game file `path`, reporting `infos`."""
    try:
        with warnings.catch_warnings():
            # jericho warns on every load of a TextWorld-made game that it lacks per-game score and
            # move tracking; TextWorld tracks those itself, so the warning is noise here.
            warnings.filterwarnings("ignore", message=r"Game '.*' is not fully supported")
            return textworld.start(str(path), infos)
    finally:
        forget_parse_failures()  # also the generator's, where this game was just made


def _check_walkthrough(path: Path) -> list[str]:
    env = start_game(path)
    try:
        state = env.reset()
        walkthrough = list(state["extra.walkthrough"] or [])
        for command in walkthrough:
            state, _, done = env.step(command)
            if done:
                break
        if not state.won:
            raise ValueError(f"the generated game's walkthrough {walkthrough} does not win it")
        return walkthrough
    finally:
        env.close()


def games_dir(config: EnvConfig) -> Path:
    if config.options.games_dir:
        return Path(config.options.games_dir).expanduser()
    from rlanything.paths import cache_dir

    return cache_dir() / "textworld"


def spec_key(spec: dict[str, Any]) -> str:
    """Folder name of a spec's game: game type + hash of (spec, textworld version)."""
    blob = json.dumps({"spec": spec, "textworld": textworld.__version__}, sort_keys=True).encode()
    return f"{spec['game']}-{hashlib.sha256(blob).hexdigest()[:16]}"


def game_file(config: EnvConfig, spec: dict[str, Any]) -> Path:
    """The spec's compiled game, generated (atomically) on first use."""
    target = games_dir(config) / spec_key(spec)
    if (target / "spec.json").is_file():
        return target / "game.z8"
    parse_options(spec)  # refuse a bad spec before taking the lock
    target.parent.mkdir(parents=True, exist_ok=True)
    with _GENERATION_LOCK:
        if not (target / "spec.json").is_file():
            tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
            try:
                _generate(spec, tmp)
                tmp.chmod(0o755)
                os.replace(tmp, target)  # fails if another process got there first: theirs is as good
            except OSError:
                if not (target / "spec.json").is_file():
                    raise
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
    return target / "game.z8"


def walkthrough(config: EnvConfig, spec: dict[str, Any]) -> list[str]:
    """The commands that win the spec's game (checked at generation)."""
    return json.loads((game_file(config, spec).parent / "walkthrough.json").read_text())


def remaining_commands(state: textworld.core.GameState) -> int | None:
    """Commands the quest tracker still needs to win from `state` (0 once won); None when it has
    no policy: the game is lost, or an irreversible command left the quest untracked."""
    if state["won"]:
        return 0
    return len(state["policy_commands"]) or None


def label_step(before: int | None, state: textworld.core.GameState) -> StepLabel | None:
    """The label of an admissible command that left the game in `state`, `before` the commands
    the tracker needed before it (module docstring); None where it knows no length.

    >>> from textworld.core import GameState
    >>> after = lambda n, **kw: GameState(won=False, lost=False, policy_commands=["c"] * n) | kw
    >>> label_step(2, after(1)), label_step(2, after(2)), label_step(2, after(3))
    ((1, 'closer'), (1, 'unchanged'), (-1, 'farther'))
    >>> label_step(1, after(0, won=True)), label_step(1, after(0, lost=True)), label_step(None, after(1))
    ((1, 'closer'), (-1, 'lost'), None)
    """
    if state["lost"]:
        return (-1, "lost")
    after = remaining_commands(state)
    if before is None or after is None:
        return None
    return (1, "closer") if after < before else (1, "unchanged") if after == before else (-1, "farther")


def clean_feedback(text: str) -> str:
    """Game text without the status line, the prompt and the end-of-game menu."""
    text = text.split("Would you like to RESTART")[0]
    cut = text.rfind("\n>")
    return tidy(text[:cut] if cut >= 0 else text)


# ---------------------------------------------------------------------------------------------
# The environment


class TextWorldEnv(TextGameEnv):
    def clean(self, text: str) -> str:
        return clean_feedback(text)

    def reset(self, spec: dict[str, Any]) -> str:
        path = game_file(self.config, spec)
        self.close()
        self._game = start_game(path)
        state = self._game.reset()
        self._goal = tidy(state.objective)
        self._commands = sorted(state.admissible_commands)
        self._won = self._done = False
        self.wording = WORDINGS[wording_name(self.config.options.wording, spec)]
        if self.config.options.worked_example:
            self.example = worked_example(self, spec, lambda example: walkthrough(self.config, example))
        return observation(self._goal, clean_feedback(state.description), self._commands, self.wording)

    @staticmethod
    def step_labels(config: EnvConfig, spec: dict[str, Any], actions: list[str | None]) -> list[StepLabel | None]:
        """One label per action (module docstring), replaying them from reset as `step` plays
        them, with the quest tracker on (`LABEL_INFOS`)."""
        game = start_game(game_file(config, spec), LABEL_INFOS)
        try:
            state, done = game.reset(), False
            before, labels = remaining_commands(state), []
            for action in actions:
                command = None if done else resolve_command(action, sorted(state["admissible_commands"] or []))
                if command is None:  # nothing reaches the game: a step wasted
                    labels.append((-1, "invalid"))
                    continue
                state, _, done = game.step(command)
                labels.append(label_step(before, state))
                before = remaining_commands(state)
            return labels
        finally:
            game.close()

    # --- specs and rewrites -------------------------------------------------------------------
    @staticmethod
    def initial_specs(config: EnvConfig, seed: int) -> list[dict[str, Any]]:
        tw = config.options
        return [
            {"game": tw.game, "options": dict(tw.tw_make), "seed": slot_seed(seed, slot) % 2**31}
            for slot in range(config.num_problems)
        ]

    @staticmethod
    def validate_spec(config: EnvConfig, spec: dict[str, Any]) -> None:
        game_file(config, spec)  # parses, generates (or finds) the game and checks its walkthrough

    @staticmethod
    def rewrite_instructions(spec: dict[str, Any], direction: str) -> str:
        knobs = REWRITE_KNOBS[spec["game"]]
        listed = "\n".join(f"- {key}: {meaning}" for key, meaning in knobs.items())
        current = json.dumps({**spec["options"], "seed": spec["seed"]}, sort_keys=True)
        return (
            f"The game is generated by `tw-make {spec['game']}` with these settings:\n{current}\n"
            f"Make the game {direction} by changing some of these settings:\n{listed}\n"
            "- seed: any other integer gives a different world of the same size\n"
            "Answer with only the settings you change, as one JSON object inside \\boxed{}."
        )

    @staticmethod
    def parse_rewrite(spec: dict[str, Any], text: str) -> dict[str, Any]:
        params = parse_json_box(text, set(REWRITE_KNOBS[spec["game"]]) | {"seed"})
        seed = params.pop("seed", spec["seed"])
        new = {"game": spec["game"], "options": {**spec["options"], **params}, "seed": seed}
        parse_options(new)
        return new

    @staticmethod
    def rule_rewrite(spec: dict[str, Any], direction: str) -> str:
        """One step of the main knob: quest length (custom; more objects with it), recipe size
        (tw-cooking, `take` follows), level (treasure hunter, coin collector), reward density
        (tw-simple)."""
        step = {"harder": 1, "easier": -1}[direction]
        game, options = spec["game"], spec["options"]
        if game == "custom":
            length = int(options.get("quest_length") or options.get("quest_max_length", 5))
            new = {"quest_length": length + step}
            if step > 0:
                new["nb_objects"] = int(options.get("nb_objects", 10)) + 1
            if new["quest_length"] < 1 or new["quest_length"] > CAPS["quest_length"]:
                raise ValueError(f"quest_length cannot go {direction} than {length}")
        elif game == "tw-cooking":
            recipe = int(options.get("recipe", 1)) + step
            if not 1 <= recipe <= CAPS["recipe"]:
                raise ValueError(f"recipe cannot go {direction} than {recipe - step}")
            new = {"recipe": recipe, "take": min(int(options.get("take", 0)) + max(step, 0), recipe)}
        elif game in ("tw-treasure_hunter", "tw-coin_collector"):
            level, top = int(options["level"]) + step, 30 if game == "tw-treasure_hunter" else 300
            if not 1 <= level <= top:
                raise ValueError(f"level cannot go {direction} than {level - step}")
            new = {"level": level}
        else:
            order = ["dense", "balanced", "sparse"]
            index = order.index(options["rewards"]) + step
            if not 0 <= index < len(order):
                raise ValueError(f"rewards cannot go {direction} than {options['rewards']}")
            new = {"rewards": order[index]}
        return "\\boxed{" + json.dumps(new, sort_keys=True) + "}"

    # --- held-out problems (evaluation) -------------------------------------------------------
    @staticmethod
    def heldout_specs(config: EnvConfig, split: str, n: int, seed: int) -> list[dict[str, Any]]:
        """in_domain: the training game type and options on evaluation seeds; ood: the same type
        two `rule_rewrite` steps harder (as far as the caps allow) and, for `custom`, a world two
        rooms bigger.

        Kept apart: initial seeds are `seeding.slot_seed(seed, slot) % 2**31` and rule rewrites
        keep the seed; evaluation seeds have a residue modulo SLOT_STRIDE no slot has
        (`envs/heldout.py`), and the run's initial seeds are dropped explicitly (they can wrap
        for run seeds above 21_474). A model rewrite may pick any seed: the evaluation drops
        held-out games whose seed the run's buffer holds."""
        from rlanything.envs.heldout import heldout_seeds

        tw = config.options
        base = {"game": tw.game, "options": dict(tw.tw_make), "seed": 0}
        if split == "ood":
            for _ in range(2):
                try:
                    base = TextWorldEnv.parse_rewrite(base, TextWorldEnv.rule_rewrite(base, "harder"))
                except ValueError:  # at a cap: as hard as the knob goes
                    break
            if tw.game == "custom":
                rooms = min(int(base["options"].get("world_size", 5)) + 2, CAPS["world_size"])
                base = {**base, "options": {**base["options"], "world_size": rooms}}
        avoid = [s["seed"] for s in TextWorldEnv.initial_specs(config, seed)]
        return [{**base, "options": dict(base["options"]), "seed": s} for s in heldout_seeds(split, n, avoid)]
