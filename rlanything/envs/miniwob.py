r"""MiniWoB++ web tasks in a real headless Chromium: the GUI-agent setting.

Each turn the policy sees the task's instruction, the page's elements as compact text and what
its last action did, and answers ONE action inside \boxed{}. The action grammar:

    click(REF)          click element [REF] (any listed element with a ref, not only buttons)
    type(REF, "TEXT")   click [REF] to focus it, then type TEXT (appended; \" and \\ escape)
    key(NAME)           press a key: Enter, Tab, Backspace, Delete, Escape, Space, ArrowUp,
                        ArrowDown, ArrowLeft, ArrowRight, PageUp, PageDown, Home, End or one
                        printable character, optionally with modifiers: Ctrl+A, Shift+Tab, Alt+X

Names are case-insensitive; REF may be written [REF]; TEXT and NAME may be single-quoted.
Anything else (no box, an unknown action, a ref not on the page) is recorded and answered with
an error observation; the page is untouched and the episode goes on.

An observation (click-checkboxes):

    Task: Select 6hvqq, ky7 and click Submit.
    Last action: click(7) -> clicked [7] label "6hvqq"
    Elements ([ref] tag "text" state @x,y wxh; interactive first):
    [5] label "z72vdFA" @2,59 65x11
    [6] input_checkbox "z72vdFA" unchecked @6,55 20x13
    [13] button "Submit" @2,139 95x31
    Text:
    [8] span "consectetur malesuada" @2,136 150x11
    - "lorem" @29,59 38x11

Interactive elements (buttons, links, inputs, labels, selects) come first with their own text,
else their subtree's text (an input inside a label gets the label's); other elements and text
fragments (`-`, no ref: they cannot be clicked) follow when they carry text. Text-less containers
are left out. At most `env.options.max_elements` lines.

Outcome: +1 iff the task ended with a raw reward > 0 (MiniWoB's reward without its time
discount), else −1, a task that never ended included; the rollout loop enforces max_steps.

Determinism, which verify relies on (it replays the recorded actions in a fresh environment):
every reset reloads the task page, seeds the page's Math.random with the spec's seed
(`Math.seedrandom`, as miniwob does) and switches off MiniWoB's 10 s episode timer, whose expiry
while the policy thinks would otherwise end rollouts that replay does not; element refs are
assigned by a DOM walk after every executed action, the same walk in rollout and replay. The
same property lets an episode rebuild its page on any browser of the pool (see
`envs/browser_pool.py`).

Where we depart from `miniwob`'s gymnasium env: we drive its task pages (and its JS core:
`core.getDOMInfo`, `core.elementClick`, seeding) with our own Selenium session, because we need
one browser to serve many tasks (navigate, not relaunch), offline Chromium flags, a process
group to kill, a timeout on every call and the episode timer off; the outcome uses the raw
reward, not the time-discounted one.

Task adaptation picks among verified variants only (like the authors' OSWorld variant, every
accepted task keeps a real verifier): the next easier/harder task of the same family (`FAMILIES`),
the family's hint added to or dropped from the instruction, or a new seed.

No step labels (`envs.base.step_labels` gives None; the RM's process accuracy is not logged).
A label would need the set of good actions in each page state: the scripted expert
(tests/envs/test_miniwob.py, benchmarks/miniwob_expert.py) picks one action per state by reading
the DOM, while most tasks accept several (checkboxes in any order, a field clicked before it is
typed into or not), so "not the expert's action" is not "a bad step"; and reading the state
takes a live browser replay per trajectory, which verify would pay for every episode.
"""

from __future__ import annotations

import io
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlanything.algo.parsing import extract_last_boxed
from rlanything.envs.base import Environment, StepResult
from rlanything.envs.browser_pool import process_pool
from rlanything.seeding import slot_seed

if TYPE_CHECKING:
    from rlanything.config import EnvConfig
    from rlanything.environment import MiniWoBOptions

TASK_WIDTH, TASK_HEIGHT = 160, 210  # MiniWoB's task area, top-left of the page (CSS px)

# Families, easiest first: task adaptation moves one rung along a ladder.
FAMILIES: dict[str, tuple[str, ...]] = {
    "click": ("click-test", "click-test-2", "click-button", "click-link", "click-dialog"),
    "text": ("focus-text", "focus-text-2", "enter-text", "enter-text-2", "enter-password", "login-user"),
    "select": ("click-option", "click-checkboxes", "click-checkboxes-large"),
}
HINTS: dict[str, str] = {
    "click": "Find the element whose text the task names and click it with click(REF).",
    "text": 'Use type(REF, "TEXT") on the text field with exactly the text the task asks for, then '
    "click the submit button if there is one.",
    "select": "Click the checkbox or radio button of each label the task names, then click Submit.",
    "other": "Read the task, find the element it refers to, and act on that element's ref.",
}

_INTERACTIVE = {"button", "a", "label", "textarea", "select", "option"}
_KEYS = {
    "enter": "<Enter>",
    "return": "<Enter>",
    "tab": "<Tab>",
    "backspace": "<Backspace>",
    "delete": "<Delete>",
    "escape": "<Escape>",
    "esc": "<Escape>",
    "space": "<Space>",
    "arrowup": "<ArrowUp>",
    "up": "<ArrowUp>",
    "arrowdown": "<ArrowDown>",
    "down": "<ArrowDown>",
    "arrowleft": "<ArrowLeft>",
    "left": "<ArrowLeft>",
    "arrowright": "<ArrowRight>",
    "right": "<ArrowRight>",
    "pageup": "<PageUp>",
    "pagedown": "<PageDown>",
    "home": "<Home>",
    "end": "<End>",
}
_MODIFIERS = {"ctrl": "C-", "control": "C-", "shift": "S-", "alt": "A-", "meta": "M-", "cmd": "M-"}
_READ_JS = """return {done: WOB_DONE_GLOBAL, raw_reward: WOB_RAW_REWARD_GLOBAL,
    utterance: core.getUtterance(), dom: WOB_DONE_GLOBAL ? null : core.getDOMInfo()};"""
_START_JS = """core.EPISODE_MAX_TIME = 2000000000; if (core.EP_TIMER !== null) { clearTimeout(core.EP_TIMER); }
    Math.seedrandom(arguments[0]); core.setDataMode('train'); core.startEpisodeReal();"""


def html_dir() -> Path:
    import miniwob

    return Path(miniwob.__file__).parent / "html" / "miniwob"


def family_of(task: str) -> str:
    return next((name for name, ladder in FAMILIES.items() if task in ladder), "other")


# --- the page as text -------------------------------------------------------------------------
@dataclass(frozen=True)
class Element:
    ref: int  # > 0: clickable by ref; < 0: a text fragment
    tag: str
    text: str
    state: str
    box: tuple[int, int, int, int]  # x, y, w, h
    interactive: bool

    def line(self) -> str:
        ref = f"[{self.ref}]" if self.ref > 0 else "-"
        tag = f" {self.tag}" if self.ref > 0 else ""
        state = f" {self.state}" if self.state else ""
        x, y, w, h = self.box
        return f'{ref}{tag} "{self.text}"{state} @{x},{y} {w}x{h}'


def _clip(text: str, n: int = 60) -> str:
    """One line, at most n characters, no double quote (they delimit texts in observations)."""
    text = " ".join(text.split()).replace('"', "'")
    return text if len(text) <= n else text[: n - 1] + "…"


def _subtree_text(node: dict) -> str:
    if node.get("text"):
        return node["text"]
    return " ".join(t for t in (_subtree_text(c) for c in node["children"]) if t)


def page_elements(dom: dict) -> tuple[list[Element], dict[int, Element]]:
    """MiniWoB's DOM tree (`core.getDOMInfo()`) -> (elements worth listing, in DOM order;
    every element with a positive ref, listed or not)."""
    listed: list[Element] = []
    by_ref: dict[int, Element] = {}

    def walk(node: dict, inside_interactive: bool, label_text: str) -> None:
        tag = node["tag"].lower()
        interactive = tag in _INTERACTIVE or tag.startswith("input_")
        text = node.get("text") or ""
        if interactive and not text:
            text = _subtree_text(node) or (label_text if tag.startswith("input_") else "")
        state = []
        if tag in ("input_checkbox", "input_radio"):
            state.append("checked" if node.get("value") else "unchecked")
        elif "value" in node:
            state.append(f'value="{_clip(str(node["value"]), 40)}"' if node["value"] else "empty")
        if node.get("focused"):
            state.append("focused")
        box = tuple(int(round(node[k])) for k in ("left", "top", "width", "height"))
        element = Element(int(node["ref"]), tag, _clip(text), " ".join(state), box, interactive)
        if element.ref > 0:
            by_ref[element.ref] = element
        if interactive or (text and not inside_interactive):
            listed.append(element)
        label_text = _clip(_subtree_text(node)) if tag == "label" else label_text
        for child in node["children"]:
            walk(child, inside_interactive or interactive, label_text)

    walk(dom, False, "")
    return listed, by_ref


def render_page(elements: list[Element], max_elements: int) -> str:
    interactive = [e for e in elements if e.interactive]
    other = [e for e in elements if not e.interactive]
    shown_i, shown_o = interactive[:max_elements], other[: max(0, max_elements - len(interactive))]
    lines = ['Elements ([ref] tag "text" state @x,y wxh; interactive first):']
    lines += [e.line() for e in shown_i] or ["(no interactive element)"]
    if shown_o:
        lines += ["Text:"] + [e.line() for e in shown_o]
    hidden = len(elements) - len(shown_i) - len(shown_o)
    if hidden:
        lines.append(f"({hidden} more elements not shown)")
    return "\n".join(lines)


# --- actions ------------------------------------------------------------------------------------
class ActionError(ValueError):
    """The policy's action does not follow the grammar."""


_CALL = re.compile(r"^\s*([A-Za-z_]+)\s*\((.*)\)\s*$", re.S)
_REF = r"\s*\[?\s*(?:ref\s*=\s*)?(\d+)\s*\]?\s*"
_CLICK_ARGS = re.compile(rf"^{_REF}$")
_TYPE_ARGS = re.compile(rf"^{_REF},\s*(?:text\s*=\s*)?([\"'])(.*)\2\s*$", re.S)
_KEY_ARGS = re.compile(r"^\s*([\"']?)(.+?)\1\s*$", re.S)
GRAMMAR = 'click(REF), type(REF, "TEXT") or key(NAME)'


def parse_action(action: str) -> tuple[str, int | None, str | None]:
    """'click(5)' -> ('click', 5, None); 'type([4], "hi")' -> ('type', 4, 'hi');
    'key(Ctrl+A)' -> ('key', None, 'C-a'); ActionError otherwise."""
    call = _CALL.match(action)
    if call is None:
        raise ActionError(f"cannot read the action; use {GRAMMAR}")
    name, args = call.group(1).lower(), call.group(2)
    if name == "click" and (m := _CLICK_ARGS.match(args)):
        return "click", int(m.group(1)), None
    if name == "type" and (m := _TYPE_ARGS.match(args)):
        return "type", int(m.group(1)), re.sub(r"\\(.)", r"\1", m.group(3), flags=re.S)
    if name in ("key", "press") and (m := _KEY_ARGS.match(args)):
        return "key", None, _key_name(m.group(2))
    if name not in ("click", "type", "key", "press"):
        raise ActionError(f"unknown action {name!r}; use {GRAMMAR}")
    raise ActionError(f"bad arguments for {name}; use {GRAMMAR}")


def _key_name(text: str) -> str:
    """'Enter' -> '<Enter>', 'Ctrl+a' -> 'C-a', 'x' -> 'x' (miniwob's key syntax)."""
    *mods, key = [p.strip() for p in text.split("+")] if len(text) > 1 else [text]
    prefix = ""
    for mod in mods:
        if mod.lower() not in _MODIFIERS:
            raise ActionError(f"unknown modifier {mod!r}; use Ctrl, Shift or Alt")
        prefix += _MODIFIERS[mod.lower()]
    if key.lower() in _KEYS:
        return prefix + _KEYS[key.lower()]
    if len(key) == 1 and key.isprintable():
        return prefix + key
    raise ActionError(f"unknown key {key!r}; use Enter, Tab, Backspace, Escape, an arrow key or one character")


def _key_label(key: str) -> str:
    """miniwob's key syntax back to the policy's: 'C-S-<Tab>' -> 'Ctrl+Shift+Tab'."""
    names = {v: k for k, v in _MODIFIERS.items() if k in ("ctrl", "shift", "alt", "meta")}
    prefix = ""
    while key[:2] in names:
        prefix, key = prefix + names[key[:2]].capitalize() + "+", key[2:]
    return prefix + re.sub(r"^<(\w+)>$", r"\1", key)


def _execute(driver, kind: str, ref: int | None, text: str | None) -> tuple[str | None, Any]:
    """-> (error message or None, page state); a JS-level refusal is not a broken browser."""
    from miniwob.selenium_actions import execute_press_key, execute_type_text

    if kind in ("click", "type"):
        result = driver.execute_script(f"return core.elementClick({ref});")
        if result is not True:
            return f"clicking [{ref}] failed: {result}", None
    if kind == "type":
        execute_type_text(text, driver)
    if kind == "key":
        execute_press_key(text, driver)
    return None, driver.execute_script(_READ_JS)


def _load(driver, url: str, seed: int) -> Any:
    driver.get(url)
    driver.execute_script(_START_JS, seed)
    for _ in range(100):  # some tasks build their page asynchronously
        if driver.execute_script("return WOB_TASK_READY;"):
            break
        time.sleep(0.02)
    else:
        raise RuntimeError("task page never became ready")
    return driver.execute_script(_READ_JS)


def _screenshot(driver) -> bytes:
    from PIL import Image

    image = Image.open(io.BytesIO(driver.get_screenshot_as_png())).crop((0, 0, TASK_WIDTH, TASK_HEIGHT))
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()


# --- the environment ----------------------------------------------------------------------------
class MiniWoBEnv(Environment):
    system_prompt = (
        "You operate a web page to complete the task shown. Each turn you see the task, the page's "
        'elements as [REF] tag "text" state @x,y wxh, and what your last action did. Think briefly, '
        "then give exactly one action inside \\boxed{}: click(REF) clicks element REF; "
        'type(REF, "TEXT") clicks element REF and types TEXT; key(NAME) presses a key such as Enter or Tab.'
    )
    judge_hint = (
        "Here a step is one browser action on the page described in the observation. A good step acts "
        "on the element the task refers to (the right ref, exactly the text the task asks to type) and "
        "moves the page toward completing the task; an error, a malformed action, a click on an "
        "unrelated element or an action that changes nothing is a bad step."
    )

    def __init__(self, config: EnvConfig) -> None:
        self.cfg: MiniWoBOptions = config.options
        cfg = self.cfg
        self._pool = process_pool(cfg.pool_size, cfg.chromium, cfg.chromedriver, cfg.launch_timeout_s)
        self._token = object()  # whose page state a browser holds
        self._spec: dict[str, Any] | None = None
        self._actions: list[str | None] = []
        self._elements: list[Element] = []
        self._by_ref: dict[int, Element] = {}
        self._utterance = ""
        self._done = False
        self._raw_reward = 0.0

    # --- browser state ----------------------------------------------------------------------
    def _read(self, state: dict) -> None:
        self._done, self._raw_reward = bool(state["done"]), float(state["raw_reward"] or 0.0)
        self._utterance = state["utterance"]
        if state["dom"] is not None:
            self._elements, self._by_ref = page_elements(state["dom"])

    def _apply(self, browser, action: str | None) -> str:
        """Run one action on the page (or explain why not); returns what it did."""
        if action is None:
            return "error: no action found; put exactly one action inside \\boxed{}"
        try:
            kind, ref, text = parse_action(action)
        except ActionError as err:
            return f"error: {err}"
        if ref is not None and ref not in self._by_ref:
            return f"error: there is no element [{ref}] on the page"
        error, state = browser.run(lambda d: _execute(d, kind, ref, text), self.cfg.call_timeout_s)
        if error is not None:
            return f"error: {error}"
        target = self._by_ref.get(ref) if ref is not None else None
        self._read(state)
        if kind == "click":
            return f'clicked [{ref}] {target.tag} "{target.text}"'
        if kind == "type":
            return f'typed "{text}" into [{ref}] {target.tag}'
        return f"pressed {_key_label(text)}"

    def _rebuild(self, browser) -> None:
        """Load the task, then replay this episode's actions: the page as the episode left it."""
        url = (html_dir() / f"{self._spec['task']}.html").as_uri()
        self._read(browser.run(lambda d: _load(d, url, int(self._spec["seed"])), self.cfg.call_timeout_s))
        browser.owner, browser.owner_steps = self._token, 0
        for action in self._actions:
            self._apply(browser, action)
            browser.owner_steps += 1

    def _ensure_state(self, browser) -> None:
        if browser.owner is not self._token or browser.owner_steps != len(self._actions):
            self._rebuild(browser)

    def _observation(self, last: str | None) -> str:
        lines = [f"Task: {self._utterance}"]
        if self._spec.get("hint"):
            lines.append(f"Hint: {HINTS[family_of(self._spec['task'])]}")
        if last is not None:
            lines.append(f"Last action: {last}")
        lines.append("The episode is over." if self._done else render_page(self._elements, self.cfg.max_elements))
        return "\n".join(lines)

    # --- Protocol -----------------------------------------------------------------------------
    def reset(self, spec: dict[str, Any]) -> str:
        self._spec, self._actions = dict(spec), []
        with self._pool.lease(self._token) as browser:
            self._rebuild(browser)
        return self._observation(None)

    def step(self, action: str | None) -> StepResult:
        if self._spec is None or self._done:
            raise RuntimeError("step() before reset() or after the episode ended")
        with self._pool.lease(self._token) as browser:
            self._ensure_state(browser)
            effect = self._apply(browser, action)
            self._actions.append(action)
            browser.owner_steps = len(self._actions)
        shown = "(no action)" if action is None else " ".join(action.split())[:80]
        return StepResult(self._observation(f"{shown} -> {effect}"), self._done)

    def outcome(self) -> int:
        return 1 if self._done and self._raw_reward > 0 else -1

    def last_screenshot(self) -> bytes:
        """PNG of the task area (160×210) as the last reset/step left it."""
        if self._spec is None:
            raise RuntimeError("no episode yet")
        with self._pool.lease(self._token) as browser:
            self._ensure_state(browser)
            return browser.run(_screenshot, self.cfg.call_timeout_s)

    def close(self) -> None:
        self._pool.release(self._token)

    # --- specs and rewrites -------------------------------------------------------------------
    @staticmethod
    def initial_specs(config: EnvConfig, seed: int) -> list[dict[str, Any]]:
        tasks = config.options.tasks
        if not tasks:
            raise ValueError("env.options.tasks is empty")
        return [
            {"task": tasks[slot % len(tasks)], "seed": slot_seed(seed, slot), "hint": config.options.hint}
            for slot in range(config.num_problems)
        ]

    @staticmethod
    def validate_spec(config: EnvConfig, spec: dict[str, Any]) -> None:
        if not {"task", "seed"} <= set(spec) <= {"task", "seed", "hint"}:
            raise ValueError(f"spec keys must be task, seed[, hint]; got {sorted(spec)}")
        task, seed = spec["task"], spec["seed"]
        if not isinstance(task, str) or not isinstance(seed, int) or not isinstance(spec.get("hint", False), bool):
            raise ValueError(f"spec needs task: str, seed: int, hint: bool; got {spec}")
        if task.startswith("flight.") or not (html_dir() / f"{task}.html").is_file():
            raise ValueError(f"no MiniWoB++ task {task!r} in the miniwob wheel")
        env = MiniWoBEnv(config)
        try:
            env.reset(spec)
        except Exception as err:
            raise ValueError(f"task {task!r} did not reset: {type(err).__name__}: {err}") from err
        finally:
            env.close()

    @staticmethod
    def variants(spec: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
        """Every verified variant of `spec` as (direction, description, spec), in a fixed order
        (the numbers the environment model answers with)."""
        task, out = spec["task"], []
        ladder = FAMILIES.get(family_of(task), ())
        if task in ladder:
            i = ladder.index(task)
            if i > 0:
                out.append(("easier", f"the easier task `{ladder[i - 1]}`", {**spec, "task": ladder[i - 1]}))
            if i + 1 < len(ladder):
                out.append(("harder", f"the harder task `{ladder[i + 1]}`", {**spec, "task": ladder[i + 1]}))
        if spec.get("hint"):
            out.append(("harder", "the same task without the hint", {**spec, "hint": False}))
        else:
            out.append(("easier", "the same task with a hint in the instruction", {**spec, "hint": True}))
        new_seed = (int(spec["seed"]) * 1_103_515_245 + 12_345) % 2**31
        out.append(("either", "a new instance of the same task (another seed)", {**spec, "seed": new_seed}))
        return out

    @staticmethod
    def rewrite_instructions(spec: dict[str, Any], direction: str) -> str:
        hint = ", with a hint" if spec.get("hint") else ""
        options = [
            f"{n}. {description}"
            for n, (way, description, _) in enumerate(MiniWoBEnv.variants(spec), 1)
            if way in (direction, "either")
        ]
        return (
            f"The task is the MiniWoB++ web task `{spec['task']}` (seed {spec['seed']}{hint}). It can only be "
            "replaced by one of these verified variants:\n" + "\n".join(options) + "\n"
            f"Answer with the number of the variant that makes the task {direction}, inside \\boxed{{}}."
        )

    @staticmethod
    def rule_rewrite(spec: dict[str, Any], direction: str) -> str:
        """One rung along the family ladder; at its end, the hint (easier: add, harder: drop)."""
        for n, (way, _, _) in enumerate(MiniWoBEnv.variants(spec), 1):
            if way == direction:
                return f"\\boxed{{{n}}}"
        raise ValueError(f"no {direction} variant of {spec['task']}")

    @staticmethod
    def parse_rewrite(spec: dict[str, Any], text: str) -> dict[str, Any]:
        boxed = extract_last_boxed(text)
        if boxed is None:
            raise ValueError("no \\boxed{...} with the variant's number")
        choice, options = boxed.strip().strip("`'\". "), MiniWoBEnv.variants(spec)
        if choice.isdigit() and 1 <= int(choice) <= len(options):
            return options[int(choice) - 1][2]
        by_task = [new for _, _, new in options if new["task"] == choice and choice != spec["task"]]
        if by_task:
            return by_task[0]
        raise ValueError(f"{boxed!r} is not one of the variants 1..{len(options)}")

    # --- held-out problems (evaluation) -------------------------------------------------------
    @staticmethod
    def heldout_specs(config: EnvConfig, split: str, n: int, seed: int) -> list[dict[str, Any]]:
        """in_domain: the configured tasks in turn on evaluation seeds; ood: tasks of no
        family ladder (OOD_TASKS), which no configured task can be rewritten into, on
        evaluation seeds. No hint in either.

        Kept apart: initial seeds are `seeding.slot_seed(seed, slot)` (≡ slot mod SLOT_STRIDE for every
        run seed) and the only rewrite that changes a seed maps it into [0, 2**31); evaluation
        seeds are 2**31 and above with a residue no slot has (`envs/heldout.py`), so no
        training episode can share one. Rewrites move only along FAMILIES ladders, so an OOD
        task is never trained on."""
        from rlanything.envs.heldout import STRIDE, heldout_seeds

        ood = [t for t in OOD_TASKS if t not in config.options.tasks]
        tasks = list(config.options.tasks) if split == "in_domain" else ood
        if not tasks:
            raise ValueError("env.options.tasks is empty" if split == "in_domain" else "no MiniWoB++ OOD task left")
        base = -(-(2**31) // STRIDE) * STRIDE  # the first multiple of STRIDE above 2**31
        avoid = [s["seed"] for s in MiniWoBEnv.initial_specs(config, seed)]
        return [
            {"task": tasks[k % len(tasks)], "seed": s, "hint": False}
            for k, s in enumerate(heldout_seeds(split, n, avoid, base=base))
        ]


# Out-of-distribution tasks: simple single-page tasks outside every FAMILIES ladder.
OOD_TASKS = (
    "click-widget",
    "click-tab",
    "click-collapsible",
    "click-button-sequence",
    "choose-list",
    "enter-text-dynamic",
    "click-dialog-2",
    "click-color",
)
