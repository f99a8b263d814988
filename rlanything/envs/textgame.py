r"""What the text household games share: the observation the policy reads and how its answer
becomes a game command.

TextWorld (`textworld.py`), TextWorld-Express (`textworld_express.py`) and ALFWorld
(`alfworld.py`) all expose, at every step, the goal, the game's feedback and the *admissible
commands*. The policy answers inside \boxed{} with either

* one admissible command, written as listed (case and spacing are ignored), or
* its number in the list shown in the last observation (1-based, as displayed).

Anything else (no box, an empty box, a command not in the list, a number out of range) is not
sent to the game: it is recorded like any action and answered with a "Nothing happens" observation
that lists the valid commands again; the episode goes on, and the step cap of the rollout loop
(`env.max_steps`) ends it as a failure. Only admissible commands reach the game, so an episode
is a pure function of the spec and the recorded answers (verify replays them).

An observation (TextWorld, custom game):

    Goal: Retrieve the TextWorld style key from the floor of the attic. ...

    -= Attic =-
    You've entered an attic. ...

    Valid commands:
    1. examine TextWorld style chest
    2. go west
    ...
    Answer with one command, or its number, inside \boxed{}.

**Worked example** (`options.worked_example`, TextWorld and TextWorld-Express): before the
episode's first observation the policy sees one won episode of *another* game of the same type
and options, turn by turn: each observation as a user turn, the winning command boxed as the
assistant's answer (`worked_example`). SmolLM2-135M narrates instead of answering without it
(0 wins in 32, 255 of 256 replies unboxed); a model copies the format of the turns it sees
answered. The example game's seed is `envs.heldout.EXAMPLE_SEED` (then that seed plus multiples
of SLOT_STRIDE where generation fails), never a training or evaluation seed; a rewritten task's
example follows its new options.

**Wording** (`options.wording`, TextWorld and TextWorld-Express): the system prompt, the labels,
the layout of the command list, the answer line and which reserved game the worked example shows
are one `Wording`. `shipped` is the one every earlier run trained on; `held_out` is a wording no
training run uses (measure whether a skill survives a rephrasing: `rlanything eval --wording
held_out`); `varied` draws one of `TRAINING_WORDINGS` per task (by its seed), so a policy trained
on it has seen several. The game, its commands and how an answer is read are the same in all.
"""

from __future__ import annotations

import json
import re
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rlanything.envs.base import Environment, StepResult, parse_json_box  # noqa: F401  (text games import parse_json_box from here)
from rlanything.envs.heldout import EXAMPLE_SEED
from rlanything.seeding import SLOT_STRIDE

JUDGE_HINT = (
    "In this text game a good step picks one of the listed valid commands that brings the agent "
    "closer to the goal (finding, taking, opening or placing what the goal needs, going where it is); "
    "an invalid command, a repeated useless command, or wandering away from the goal is a bad step."
)


@dataclass(frozen=True)
class Wording:
    """How a text game is put into words for the policy (module docstring, "Wording")."""

    system_prompt: str
    goal: str  # the label before the goal
    header: str  # opens the list of valid commands that ends an observation (`judge_view` cuts there)
    item: str  # one listed command: .format(k=its 1-based number, command=its text)
    answer_line: str
    example_game: int  # which reserved worked-example game is shown (0: the first that plays)


WORDINGS = {
    "shipped": Wording(
        system_prompt=(
            "You are playing a text-based household game. Each turn you see the goal, what just happened and "
            "the numbered list of valid commands. Think briefly about which command brings you closer to the "
            "goal, then answer with exactly one valid command, or its number in the list, inside \\boxed{}."
        ),
        goal="Goal",
        header="Valid commands:\n",
        item="{k}. {command}",
        answer_line="Answer with one command, or its number, inside \\boxed{}.",
        example_game=0,
    ),
    "plain": Wording(
        system_prompt=(
            "You control a character in a small house made of text. Every turn shows your task, the result "
            "of your last move and the moves you may make. Choose the move that gets the task done soonest "
            "and write it, or its number, inside \\boxed{}."
        ),
        goal="Task",
        header="Moves you may make:\n",
        item="{k}) {command}",
        answer_line="Write one move, or its number, inside \\boxed{}.",
        example_game=2,
    ),
    "terse": Wording(
        system_prompt="Text adventure. Reach the objective. Reply with one listed action, or its number, in \\boxed{}.",
        goal="Objective",
        header="Actions:\n",
        item="[{k}] {command}",
        answer_line="One action or its number in \\boxed{}.",
        example_game=3,
    ),
    "held_out": Wording(
        system_prompt=(
            "This is an interactive fiction game set in a home. On each turn you are told what to achieve, "
            "what your last action did, and which actions are possible right now. Pick the action that moves "
            "you towards what you must achieve, and reply with that action, or its number, inside \\boxed{}."
        ),
        goal="What to achieve",
        header="Possible actions:\n",
        item="- ({k}) {command}",
        answer_line="Reply with a single action (or its number) inside \\boxed{}.",
        example_game=1,
    ),
}
TRAINING_WORDINGS = ("shipped", "plain", "terse")  # what `varied` draws from: never `held_out`


def wording_name(option: str, spec: dict[str, Any]) -> str:
    """The wording the option `wording` gives the game `spec`: that wording, or with `varied` one
    of `TRAINING_WORDINGS` by the spec's seed (the same game always gets the same one).

    >>> wording_name("held_out", {"seed": 3}), wording_name("varied", {"seed": 4})
    ('held_out', 'plain')
    """
    if option == "varied":
        return TRAINING_WORDINGS[int(spec["seed"]) % len(TRAINING_WORDINGS)]
    return option


# TextWorld's tatsu parsers, one per module (game logic, text grammar, and their PDDL twins)
TATSU_PARSERS = (
    ("textworld.logic", "_PARSER"),
    ("textworld.textgen", "TextGrammar._PARSER"),
    ("textworld.envs.pddl.logic", "_PARSER"),
    ("textworld.envs.pddl.textgen", "_PARSER"),
)


def forget_parse_failures() -> None:
    """Drop the failed match each of TextWorld's parsers keeps after a parse that succeeded.

    A tatsu parser keeps the furthest failed token match of its last parse (`_furthest_exception`)
    until its next parse. That exception's traceback holds every frame of the call that parsed,
    with their locals: where a rollout loads or makes a game, the policy engine, its model and its
    KV cache (1.37 GiB on SmolLM2), which stayed alive through the iteration's later steps.
    Called after every game TextWorld or ALFWorld starts; parsers not imported are skipped."""
    for module, attr in TATSU_PARSERS:
        parser = sys.modules.get(module)
        for name in attr.split("."):
            parser = getattr(parser, name, None)
        if getattr(parser, "_furthest_exception", None) is not None:
            parser._furthest_exception = None


def normalize(command: str) -> str:
    """Case- and whitespace-insensitive form of a command.

    >>> normalize("  Take   TextWorld style KEY ")
    'take textworld style key'
    """
    return " ".join(command.lower().split())


def resolve_command(action: str | None, commands: list[str]) -> str | None:
    """The admissible command an answer names (by text or 1-based number), or None.

    >>> resolve_command("2", ["go west", "look"]), resolve_command("GO  West", ["go west", "look"])
    ('look', 'go west')
    >>> resolve_command("go north", ["go west", "look"]) is None
    True
    """
    if action is None:
        return None
    text = action.strip().strip("`'\".()[]").strip()
    if re.fullmatch(r"\d{1,4}", text):
        index = int(text) - 1
        return commands[index] if 0 <= index < len(commands) else None
    by_name = {normalize(c): c for c in commands}
    return by_name.get(normalize(text))


def command_list(commands: list[str], wording: Wording) -> str:
    return wording.header + "\n".join(wording.item.format(k=k, command=c) for k, c in enumerate(commands, 1))


def observation(goal: str, feedback: str, commands: list[str], wording: Wording) -> str:
    """The observation of a step that leaves the game running."""
    return f"{wording.goal}: {goal}\n\n{feedback.strip()}\n\n{command_list(commands, wording)}\n{wording.answer_line}"


def invalid_observation(goal: str, action: str | None, commands: list[str], wording: Wording) -> str:
    """The answer to an action that is not an admissible command (nothing reaches the game)."""
    if action is None:
        why = "Nothing happens: your reply held no command inside \\boxed{}."
    else:
        shown = action if len(action) <= 80 else action[:77] + "..."
        why = f'Nothing happens: "{shown}" is not one of the valid commands.'
    listed = command_list(commands, wording)
    return f"{why}\n\n{wording.goal}: {goal}\n\n{listed}\n{wording.answer_line}"


def judge_view(text: str) -> str:
    """An observation as the RM reads it with `rm.compact_observations`: without the numbered
    list of valid commands and the answer line, which are written for the policy (a quarter of a
    two-room game's judge prompt). What the game said stays, and so does the goal.

    >>> judge_view(observation("Take the key.", "You see a key.", ["look", "take key"], WORDINGS["shipped"]))
    'Goal: Take the key.\\n\\nYou see a key.'
    >>> judge_view("You take the key. You won!")
    'You take the key. You won!'
    """
    for wording in WORDINGS.values():
        text = text.split("\n\n" + wording.header, 1)[0]
    return text


def tidy(text: str) -> str:
    """Strip indentation, trailing spaces and runs of blank lines from game text."""
    lines = [line.strip() for line in text.strip().splitlines()]
    return re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip()


def boxed(command: str) -> str:
    """A worked example's answer: the command as the policy must write it."""
    return f"\\boxed{{{command}}}"


def solved_turns(env: Environment, spec: dict[str, Any], commands: list[str]) -> tuple[tuple[str, str], ...]:
    """The (observation, answer) turns of playing `commands` in `spec`'s game from reset, up to
    the step that ends it; ValueError unless they win it."""
    try:
        shown, turns = env.reset(spec), []
        for command in commands:
            turns.append((shown, boxed(command)))
            result = env.step(command)
            if result.done:
                break
            shown = result.observation
        if env.outcome() != 1:
            raise ValueError(f"the winning commands {commands} do not win {spec}")
        return tuple(turns)
    finally:
        env.close()


EXAMPLE_TRIES = 4  # example seeds tried before giving up (generation can fail for a seed)
_EXAMPLES: dict[str, tuple[tuple[str, str], ...]] = {}  # played once per process and game settings
_EXAMPLES_LOCK = threading.Lock()


def worked_example(
    env: Environment, spec: dict[str, Any], winning: Callable[[dict[str, Any]], list[str]]
) -> tuple[tuple[str, str], ...]:
    """The turns of a won episode of `spec`'s game type and options at a reserved seed (module
    docstring), played by a fresh environment of `env`'s class without an example of its own;
    `winning(spec)` gives a game's winning commands. Cached per process and settings.

    The seed is the only thing that differs from `spec`: the example game has the same size,
    objects and quest length as the one the policy is about to play."""
    wording = wording_name(env.config.options.wording, spec)  # the example speaks the game's words
    settings = [type(env).__name__, env.config.model_dump(mode="json"), {**spec, "seed": None}, wording]
    key = json.dumps(settings, sort_keys=True)
    with _EXAMPLES_LOCK:
        if key not in _EXAMPLES:
            options = env.config.options.model_copy(update={"worked_example": False, "wording": wording})
            player = type(env)(env.config.model_copy(update={"options": options}))
            errors = []
            first = WORDINGS[wording].example_game * EXAMPLE_TRIES  # each wording its own reserved game
            for k in range(first, first + EXAMPLE_TRIES):
                example = {**spec, "seed": EXAMPLE_SEED + k * SLOT_STRIDE}
                try:
                    _EXAMPLES[key] = solved_turns(player, example, winning(example))
                    break
                except ValueError as err:
                    errors.append(str(err))
            else:
                raise ValueError(f"no worked example for {spec} at {EXAMPLE_TRIES} reserved seeds: {errors}")
        return _EXAMPLES[key]


class TextGameEnv(Environment):
    """Turn logic shared by the games whose engine answers `step(command) -> (state, score,
    done)` with `state.won / feedback / admissible_commands` (TextWorld, ALFWorld).
    Subclasses implement `reset` and the spec/rewrite static methods."""

    judge_hint = JUDGE_HINT
    judge_view = staticmethod(judge_view)

    def __init__(self, config) -> None:
        self.config = config
        self._game = None
        self._goal, self._commands = "", []
        self._won = self._done = False
        self.example: tuple[tuple[str, str], ...] | None = None
        """A won episode of another game of the same settings (`worked_example`), or None."""
        self.wording = WORDINGS["shipped"]
        """How the game is put to the policy; a game with the `wording` option sets it in `reset`."""

    @property
    def system_prompt(self) -> str:
        return self.wording.system_prompt

    def clean(self, text: str) -> str:
        """The game's feedback as the policy reads it."""
        return tidy(text)

    def step(self, action: str | None) -> StepResult:
        command = resolve_command(action, self._commands)
        if command is None or self._done:
            return StepResult(invalid_observation(self._goal, action, self._commands, self.wording), done=False)
        state, _, done = self._game.step(command)
        self._won, self._done = bool(state.won), bool(done)
        self._commands = sorted(state.admissible_commands or [])
        feedback = self.clean(state.feedback)
        if done:
            return StepResult(feedback, done=True)
        return StepResult(observation(self._goal, feedback, self._commands, self.wording), done=False)

    def outcome(self) -> int:
        return 1 if self._won else -1

    def close(self) -> None:
        if self._game is not None:
            self._game.close()
            self._game = None
