r"""OSWorld desktop tasks through the user's own OSWorld install (`desktop_env.DesktopEnv`).

OSWorld runs real desktop VMs (VMware, VirtualBox, Docker or a cloud provider) and ships its
tasks as JSON files (`evaluation_examples/examples/<domain>/<id>.json`, each with an
instruction, set-up steps and an evaluator). We do not install it (its pins clash with ours:
torch 2.5, transformers 4.35): install it beside rlanything, point `env.options.examples_dir`
at its examples and pass `DesktopEnv`'s arguments in `env.options.desktop_env`:

    env:
      kind: osworld
      max_steps: 15
      options:
        examples_dir: /data/OSWorld/evaluation_examples
        domains: [os, chrome]
        desktop_env: {provider_name: docker, os_type: Ubuntu, headless: true}

Protocol mapping. reset(spec) = `DesktopEnv.reset(task_config=example)`; the observation is the
instruction, the last action's effect and the accessibility tree, linearised one element a line
(`tag "name" text @x,y wxh`, clipped to `max_tree_chars`). The policy answers in \boxed{} with
one line of pyautogui code (`pyautogui.click(X, Y)`, `pyautogui.typewrite("TEXT")`,
`pyautogui.hotkey("ctrl", "s")` …) or WAIT, DONE (finished) or FAIL (infeasible); anything else is
answered with an error observation and not sent to the VM. DONE/FAIL end the episode, and the task's
evaluator runs right then (`DesktopEnv.evaluate()`); the outcome is +1 iff its score > 0.
`last_screenshot()` is the PNG OSWorld returned with the last observation.

VMs. One `DesktopEnv` (one VM) per live episode: the rollout loop keeps every episode of an
iteration alive at once, so the provider must run tasks_per_iteration × group_size VMs. They
are pooled per process and reused across episodes (`reset` reverts the VM's snapshot).

Verify. The repository's verify step replays an episode's actions in a fresh environment. A
desktop is not deterministic under replay (timing, network, app state), and a replay costs a
VM reset. `replayable = False` marks that: the rollout loop asks the evaluator when the live
episode ends (`live_outcome` in episodes.parquet) and verify keeps that verdict.

Task adaptation picks among verified variants only: another example of the same domain (every
example carries OSWorld's own evaluator), never a free-form rewrite without a checker.
"""

from __future__ import annotations

import json
import random
import threading
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlanything.algo.parsing import extract_last_boxed
from rlanything.envs.base import Environment, StepResult

if TYPE_CHECKING:
    from rlanything.config import EnvConfig
    from rlanything.environment import OSWorldOptions

SPECIAL = ("WAIT", "DONE", "FAIL")
MAX_VARIANTS = 8  # sibling examples offered to the environment model


# --- tasks on disk ------------------------------------------------------------------------------
def example_path(spec: dict[str, Any]) -> Path:
    return Path(spec["examples_dir"]) / "examples" / spec["domain"] / f"{spec['example_id']}.json"


def load_example(spec: dict[str, Any]) -> dict[str, Any]:
    path = example_path(spec)
    if not path.is_file():
        raise ValueError(f"no OSWorld example {spec['domain']}/{spec['example_id']} under {spec['examples_dir']}")
    example = json.loads(path.read_text())
    if "instruction" not in example or "evaluator" not in example:
        raise ValueError(f"{path} has no instruction or evaluator")
    return example


def domain_examples(examples_dir: str, domain: str) -> list[str]:
    return sorted(p.stem for p in (Path(examples_dir) / "examples" / domain).glob("*.json"))


# --- observations -------------------------------------------------------------------------------
def _attr(node: ET.Element, name: str) -> str | None:
    """Attribute by local name, whatever OSWorld's namespace for it."""
    for key, value in node.attrib.items():
        if key.rsplit("}", 1)[-1] == name:
            return value
    return None


def linearize_tree(xml: str | None, max_chars: int) -> str:
    """OSWorld's accessibility tree (XML) -> one visible, named element a line:
    `tag "name" text @x,y wxh`, clipped to `max_chars` characters."""
    if not xml:
        return "(no accessibility tree)"
    try:
        root = ET.fromstring(xml)
    except ET.ParseError as err:
        return f"(unreadable accessibility tree: {err})"
    lines = []
    for node in root.iter():
        if _attr(node, "showing") == "false" or _attr(node, "visible") == "false":
            continue
        name, text = (_attr(node, "name") or "").strip(), " ".join((node.text or "").split())
        coord, size = _attr(node, "screencoord"), _attr(node, "size")
        if not (name or text) or not coord or not size:
            continue
        try:
            (x, y), (w, h) = (json.loads(v.replace("(", "[").replace(")", "]")) for v in (coord, size))
        except (ValueError, TypeError):
            continue
        if w <= 0 or h <= 0:
            continue
        tag = node.tag.rsplit("}", 1)[-1]
        lines.append(f'{tag} "{name}" {text[:80]} @{x},{y} {w}x{h}'.replace("  @", " @"))
    out, used = [], 0
    for line in lines:
        if used + len(line) + 1 > max_chars:
            out.append(f"({len(lines) - len(out)} more elements not shown)")
            break
        out.append(line)
        used += len(line) + 1
    return "\n".join(out) or "(no visible named element)"


def check_action(action: str | None) -> str | None:
    """None if `action` may go to the VM, else the error to show the policy."""
    if action is None:
        return "no action found; put exactly one action inside \\boxed{}"
    if action in SPECIAL:
        return None
    if not action.startswith("pyautogui.") or "\n" in action.strip():
        return "use one line of pyautogui code (pyautogui.click(X, Y), ...) or WAIT, DONE, FAIL"
    try:
        compile(action, "<action>", "exec")
    except SyntaxError as err:
        return f"not valid Python: {err.msg}"
    return None


# --- one DesktopEnv (VM) per live episode, reused across episodes -----------------------------------
_IDLE: dict[str, list[Any]] = {}
_LOCK = threading.Lock()


def _desktop(cfg: OSWorldOptions) -> Any:
    key = json.dumps(cfg.desktop_env, sort_keys=True)
    with _LOCK:
        if _IDLE.get(key):
            return _IDLE[key].pop()
    from desktop_env.desktop_env import DesktopEnv

    return DesktopEnv(**{**cfg.desktop_env, "action_space": "pyautogui", "require_a11y_tree": True})


def _give_back(cfg: OSWorldOptions, desktop: Any) -> None:
    with _LOCK:
        _IDLE.setdefault(json.dumps(cfg.desktop_env, sort_keys=True), []).append(desktop)


class OSWorldEnv(Environment):
    replayable = False  # see the module docstring: verify keeps the live outcome
    system_prompt = (
        "You control a computer's desktop to complete the task shown. Each turn you see the task, what "
        'your last action did and the screen\'s accessibility tree, one element a line as tag "name" '
        "text @x,y wxh. Think briefly, then give exactly one action inside \\boxed{}: one line of "
        "pyautogui code (pyautogui.click(X, Y), pyautogui.typewrite(TEXT), pyautogui.hotkey(KEYS), ...), "
        "or WAIT, or DONE when the task is complete, or FAIL if it cannot be done."
    )
    judge_hint = (
        "Here a step is one desktop action (pyautogui code, WAIT, DONE or FAIL). A good step acts on "
        "the element the task needs (coordinates inside it, the right text or keys) or ends the episode "
        "correctly; an error, a click on empty space or an unrelated element, or DONE before the task "
        "is complete is a bad step."
    )

    def __init__(self, config: EnvConfig) -> None:
        self.cfg = config.options
        self._desktop: Any = None
        self._example: dict[str, Any] | None = None
        self._obs: dict[str, Any] = {}
        self._done = False
        self.score: float | None = None  # the evaluator's score, once the episode ended

    def _observation(self, last: str | None) -> str:
        lines = [f"Task: {self._example['instruction']}"]
        if last is not None:
            lines.append(f"Last action: {last}")
        if self._done:
            lines.append("The episode is over.")
        else:
            tree = linearize_tree(self._obs.get("accessibility_tree"), self.cfg.max_tree_chars)
            lines.append(f"Accessibility tree:\n{tree}")
        return "\n".join(lines)

    def reset(self, spec: dict[str, Any]) -> str:
        self._example, self._done, self.score = load_example(spec), False, None
        if self._desktop is None:
            self._desktop = _desktop(self.cfg)
        self._obs = self._desktop.reset(task_config=self._example)
        return self._observation(None)

    def step(self, action: str | None) -> StepResult:
        if self._example is None or self._done:
            raise RuntimeError("step() before reset() or after the episode ended")
        shown = "(no action)" if action is None else " ".join(action.split())[:120]
        error = check_action(action)
        if error is not None:
            return StepResult(self._observation(f"{shown} -> error: {error}"), False)
        self._obs, _, done, _ = self._desktop.step(action, pause=self.cfg.pause_s)
        if done:
            self._done = True
            self.score = float(self._desktop.evaluate())
        return StepResult(self._observation(f"{shown} -> done"), self._done)

    def outcome(self) -> int:
        return 1 if self.score is not None and self.score > 0 else -1

    def last_screenshot(self) -> bytes | None:
        return self._obs.get("screenshot")

    def close(self) -> None:
        if self._desktop is not None:
            _give_back(self.cfg, self._desktop)
            self._desktop = None

    # --- specs and rewrites ---------------------------------------------------------------------
    @staticmethod
    def initial_specs(config: EnvConfig, seed: int) -> list[dict[str, Any]]:
        cfg = config.options
        if cfg.examples_dir is None:
            raise ValueError("env.options.examples_dir is not set (OSWorld's evaluation_examples folder)")
        root = Path(cfg.examples_dir) / "examples"
        domains = cfg.domains or sorted(p.name for p in root.iterdir() if p.is_dir())
        pool = [(d, e) for d in domains for e in domain_examples(cfg.examples_dir, d)]
        if not pool:
            raise ValueError(f"no OSWorld examples for domains {domains} under {root}")
        picks = random.Random(seed).sample(pool, len(pool))
        return [
            {"examples_dir": cfg.examples_dir, "domain": d, "example_id": e}
            for d, e in (picks[slot % len(picks)] for slot in range(config.num_problems))
        ]

    @staticmethod
    def validate_spec(config: EnvConfig, spec: dict[str, Any]) -> None:
        """The example exists and carries an evaluator (no VM is started to check it)."""
        if set(spec) != {"examples_dir", "domain", "example_id"}:
            raise ValueError(f"spec keys must be examples_dir, domain, example_id; got {sorted(spec)}")
        load_example(spec)

    @staticmethod
    def variants(spec: dict[str, Any]) -> list[dict[str, Any]]:
        """Up to MAX_VARIANTS other examples of the same domain, following this one in id order."""
        ids = domain_examples(spec["examples_dir"], spec["domain"])
        start = ids.index(spec["example_id"]) + 1 if spec["example_id"] in ids else 0
        others = [i for i in ids[start:] + ids[:start] if i != spec["example_id"]][:MAX_VARIANTS]
        return [{**spec, "example_id": i} for i in others]

    @staticmethod
    def rewrite_instructions(spec: dict[str, Any], direction: str) -> str:
        lines = []
        for n, variant in enumerate(OSWorldEnv.variants(spec), 1):
            instruction = " ".join(load_example(variant)["instruction"].split())[:200]
            lines.append(f"{n}. {instruction}")
        return (
            f"The task is an OSWorld `{spec['domain']}` task. It can only be replaced by another task of the "
            "same application, each with its own checker:\n" + "\n".join(lines) + "\n"
            f"Answer with the number of the task that is {direction} for the agent, inside \\boxed{{}}."
        )

    @staticmethod
    def rule_rewrite(spec: dict[str, Any], direction: str) -> str:
        """OSWorld has no difficulty order: the next example of the domain, either way (the
        acceptance test then keeps it only if the accuracy moved the right way)."""
        if not OSWorldEnv.variants(spec):
            raise ValueError(f"no other example in domain {spec['domain']}")
        return "\\boxed{1}"

    @staticmethod
    def parse_rewrite(spec: dict[str, Any], text: str) -> dict[str, Any]:
        boxed = extract_last_boxed(text)
        if boxed is None:
            raise ValueError("no \\boxed{...} with the task's number")
        options = OSWorldEnv.variants(spec)
        choice = boxed.strip()
        if not choice.isdigit() or not 1 <= int(choice) <= len(options):
            raise ValueError(f"{boxed!r} is not one of the tasks 1..{len(options)}")
        return options[int(choice) - 1]

    # --- held-out problems (evaluation) -------------------------------------------------------
    @staticmethod
    def heldout_specs(config: EnvConfig, split: str, n: int, seed: int) -> list[dict[str, Any]]:
        """in_domain: examples of the configured domains outside the run's initial buffer;
        ood: examples of the other domains (none when every domain is configured).

        Kept apart: rewrites only move to another example of the same domain, so an OOD
        example is never trained on. In-domain examples are outside `initial_specs(config,
        seed)`, but a rewrite can reach any example of its domain: the evaluation drops the
        ones the run's buffer holds."""
        from rlanything.envs.heldout import check_split

        check_split(split)
        cfg = config.options
        if cfg.examples_dir is None:
            raise ValueError("env.options.examples_dir is not set (OSWorld's evaluation_examples folder)")
        every = sorted(p.name for p in (Path(cfg.examples_dir) / "examples").iterdir() if p.is_dir())
        domains = cfg.domains or every
        if split == "ood":
            domains = [d for d in every if d not in domains]
            if not domains:
                raise ValueError("no OSWorld domain is left out of env.options.domains for an OOD split")
        used = {(s["domain"], s["example_id"]) for s in OSWorldEnv.initial_specs(config, seed)}
        pool = [(d, e) for d in domains for e in domain_examples(cfg.examples_dir, d) if (d, e) not in used]
        random.Random(0).shuffle(pool)
        return [{"examples_dir": cfg.examples_dir, "domain": d, "example_id": e} for d, e in pool[:n]]
