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
"""

from __future__ import annotations

import re

from rlanything.envs.base import Environment, StepResult, parse_json_box  # noqa: F401  (text games import parse_json_box from here)

SYSTEM_PROMPT = (
    "You are playing a text-based household game. Each turn you see the goal, what just happened and "
    "the numbered list of valid commands. Think briefly about which command brings you closer to the "
    "goal, then answer with exactly one valid command, or its number in the list, inside \\boxed{}."
)
JUDGE_HINT = (
    "In this text game a good step picks one of the listed valid commands that brings the agent "
    "closer to the goal (finding, taking, opening or placing what the goal needs, going where it is); "
    "an invalid command, a repeated useless command, or wandering away from the goal is a bad step."
)
ANSWER_LINE = "Answer with one command, or its number, inside \\boxed{}."


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
    text = action.strip().strip("`'\".").strip()
    if re.fullmatch(r"\d{1,4}", text):
        index = int(text) - 1
        return commands[index] if 0 <= index < len(commands) else None
    by_name = {normalize(c): c for c in commands}
    return by_name.get(normalize(text))


def command_list(commands: list[str]) -> str:
    return "Valid commands:\n" + "\n".join(f"{k}. {c}" for k, c in enumerate(commands, 1))


def observation(goal: str, feedback: str, commands: list[str]) -> str:
    """The observation of a step that leaves the game running."""
    return f"Goal: {goal}\n\n{feedback.strip()}\n\n{command_list(commands)}\n{ANSWER_LINE}"


def invalid_observation(goal: str, action: str | None, commands: list[str]) -> str:
    """The answer to an action that is not an admissible command (nothing reaches the game)."""
    if action is None:
        why = "Nothing happens: your reply held no command inside \\boxed{}."
    else:
        shown = action if len(action) <= 80 else action[:77] + "..."
        why = f'Nothing happens: "{shown}" is not one of the valid commands.'
    return f"{why}\n\nGoal: {goal}\n\n{command_list(commands)}\n{ANSWER_LINE}"


def tidy(text: str) -> str:
    """Strip indentation, trailing spaces and runs of blank lines from game text."""
    lines = [line.strip() for line in text.strip().splitlines()]
    return re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip()


class TextGameEnv(Environment):
    """Turn logic shared by the games whose engine answers `step(command) -> (state, score,
    done)` with `state.won / feedback / admissible_commands` (TextWorld, ALFWorld).
    Subclasses implement `reset` and the spec/rewrite static methods."""

    system_prompt = SYSTEM_PROMPT
    judge_hint = JUDGE_HINT

    def __init__(self, config) -> None:
        self.config = config
        self._game = None
        self._goal, self._commands = "", []
        self._won = self._done = False

    def clean(self, text: str) -> str:
        """The game's feedback as the policy reads it."""
        return tidy(text)

    def step(self, action: str | None) -> StepResult:
        command = resolve_command(action, self._commands)
        if command is None or self._done:
            return StepResult(invalid_observation(self._goal, action, self._commands), done=False)
        state, _, done = self._game.step(command)
        self._won, self._done = bool(state.won), bool(done)
        self._commands = sorted(state.admissible_commands or [])
        feedback = self.clean(state.feedback)
        if done:
            return StepResult(feedback, done=True)
        return StepResult(observation(self._goal, feedback, self._commands), done=False)

    def outcome(self) -> int:
        return 1 if self._won else -1

    def close(self) -> None:
        if self._game is not None:
            self._game.close()
            self._game = None
