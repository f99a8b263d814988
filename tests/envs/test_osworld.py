"""The OSWorld adapter.

Specs, rewrites, observations and action checks run everywhere, on a small examples folder in
OSWorld's layout. The episode logic runs against a stand-in `desktop_env` module with
DesktopEnv's signatures (no VM here). Tests against the real package skip only when OSWorld
(`desktop_env`) is not installed; the live episode also needs a VM: set RLANYTHING_OSWORLD to
a JSON `env.options` section of kind osworld (examples_dir, desktop_env arguments).
"""

import inspect
import json
import os
import sys
import types

import pytest
from scripted_policy import ScriptedPolicy, tasks_of

from rlanything.agent.play import play
from rlanything.config import build_config
from rlanything.envs import env_class, initial_specs, make_env, osworld
from rlanything.envs.osworld import OSWorldEnv, check_action, linearize_tree
from rlanything.envs.verification import verify_episode

TREE = """<desktop-frame xmlns:st="https://accessibility.ubuntu.example.org/ns/state"
  xmlns:cp="https://accessibility.ubuntu.example.org/ns/component">
  <push-button name="Save" st:showing="true" cp:screencoord="(100, 200)" cp:size="(80, 30)"/>
  <push-button name="Hidden" st:showing="false" cp:screencoord="(1, 2)" cp:size="(3, 4)"/>
  <label name="" cp:screencoord="(5, 6)" cp:size="(50, 10)">File name</label>
  <filler cp:screencoord="(0, 0)" cp:size="(10, 10)"/>
</desktop-frame>"""


def write_examples(root, domain="os", n=3):
    folder = root / "examples" / domain
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        example = {
            "id": f"task-{i}",
            "instruction": f"Do thing number {i}.",
            "config": [],
            "evaluator": {"func": "exact_match", "result": {"type": "vm_command_line"}},
        }
        (folder / f"task-{i}.json").write_text(json.dumps(example))
    return str(root)


def env_config(examples_dir, **osworld):
    data = {
        "kind": "osworld",
        "num_problems": 4,
        "max_steps": 5,
        "options": {"examples_dir": examples_dir, "pause_s": 0, **osworld},
    }
    return build_config({"env": data}).env


def test_specs_and_rewrites_stay_among_examples_with_evaluators(tmp_path):
    root = write_examples(tmp_path)
    write_examples(tmp_path, "chrome", 2)
    cfg = env_config(root, domains=["os"])
    specs = initial_specs(cfg, seed=0)
    assert len(specs) == 4 and {s["domain"] for s in specs} == {"os"}
    assert initial_specs(cfg, seed=0) == specs
    spec = {"examples_dir": root, "domain": "os", "example_id": "task-1"}
    OSWorldEnv.validate_spec(cfg, spec)
    with pytest.raises(ValueError, match="no OSWorld example"):
        OSWorldEnv.validate_spec(cfg, {**spec, "example_id": "task-9"})
    text = OSWorldEnv.rewrite_instructions(spec, "easier")
    assert "1. Do thing number 2." in text and "2. Do thing number 0." in text and "number 1." not in text
    assert OSWorldEnv.parse_rewrite(spec, OSWorldEnv.rule_rewrite(spec, "harder"))["example_id"] == "task-2"
    assert OSWorldEnv.parse_rewrite(spec, "\\boxed{2}")["example_id"] == "task-0"
    for bad in ("no box", "\\boxed{3}", "\\boxed{two}"):
        with pytest.raises(ValueError):
            OSWorldEnv.parse_rewrite(spec, bad)
    assert env_class("osworld") is OSWorldEnv


def test_tree_linearization_and_action_checks():
    assert linearize_tree(TREE, 1000).splitlines() == [
        'push-button "Save" @100,200 80x30',
        'label "" File name @5,6 50x10',
    ]
    assert "more elements not shown" in linearize_tree(TREE, 40)
    assert linearize_tree(None, 100) == "(no accessibility tree)"
    assert check_action("pyautogui.click(100, 200)") is None and check_action("DONE") is None
    assert "no action" in check_action(None)
    assert "pyautogui" in check_action("import os; os.system('x')")
    assert "not valid Python" in check_action("pyautogui.click(1,")


class StandInDesktopEnv:
    """OSWorld's DesktopEnv surface (same signatures), without a VM."""

    created = 0

    def __init__(self, provider_name="vmware", action_space="pyautogui", require_a11y_tree=True, **kwargs):
        assert action_space == "pyautogui" and require_a11y_tree
        StandInDesktopEnv.created += 1
        self.history = []

    def _obs(self):
        return {"screenshot": b"\x89PNG\r\n\x1a\nfake", "accessibility_tree": TREE, "terminal": None, "instruction": ""}

    def reset(self, task_config=None, seed=None, options=None):
        self.history = []
        return self._obs()

    def step(self, action, pause=2):
        self.history.append(action)
        return self._obs(), 0, action in ("DONE", "FAIL"), {}

    def evaluate(self):
        return 1.0 if "pyautogui.click(100, 200)" in self.history and self.history[-1] == "DONE" else 0.0

    def close(self):
        pass


@pytest.fixture
def stand_in(monkeypatch):
    package = types.ModuleType("desktop_env")
    module = types.ModuleType("desktop_env.desktop_env")
    module.DesktopEnv = StandInDesktopEnv
    monkeypatch.setitem(sys.modules, "desktop_env", package)
    monkeypatch.setitem(sys.modules, "desktop_env.desktop_env", module)
    monkeypatch.setattr(osworld, "_IDLE", {})  # the stand-in never reaches the real pool
    StandInDesktopEnv.created = 0


def test_episode_logic_against_a_stand_in_desktop(tmp_path, stand_in):
    cfg = env_config(write_examples(tmp_path), desktop_env={"provider_name": "docker"})
    spec = initial_specs(cfg, seed=1)[0]
    for actions, outcome in [(["pyautogui.click(100, 200)", "DONE"], 1), (["oops", "DONE"], -1)]:
        env = make_env(cfg)
        first = env.reset(spec)
        assert first.startswith("Task: Do thing number") and 'push-button "Save" @100,200 80x30' in first
        results = [env.step(a) for a in actions]
        assert [r.done for r in results] == [False, True]
        assert env.outcome() == outcome and env.last_screenshot().startswith(b"\x89PNG")
        env.close()
    assert "-> error: use one line of pyautogui" in results[0].observation
    assert StandInDesktopEnv.created == 1  # the VM was reused by the second episode


def test_rollouts_keep_the_live_verdict_and_screens_and_verify_does_not_replay(tmp_path, stand_in, tiny_tokenizer):
    """A desktop cannot be replayed: the rollout loop asks the evaluator when the episode ends
    (live_outcome) and verify keeps that verdict, marked `live`."""
    cfg = env_config(write_examples(tmp_path), desktop_env={"provider_name": "docker"})
    specs = initial_specs(cfg, seed=1)[:2]
    solver = f"number {specs[0]['example_id'].split('-')[1]}."  # the first task is solved, the second given up
    plans = {True: ["\\boxed{pyautogui.click(100, 200)}", "\\boxed{DONE}"], False: ["\\boxed{DONE}"]}
    policy = ScriptedPolicy(tiny_tokenizer, lambda obs: plans[solver in obs[0]][len(obs) - 1])
    saved = {}
    rows, episodes = play(
        policy,
        tiny_tokenizer,
        lambda: make_env(cfg),
        tasks_of(specs),
        group_size=1,
        max_steps=5,
        max_new_tokens=16,
        temperature=1.0,
        top_p=1.0,
        seed=0,
        save_screenshot=lambda t, s, png: saved.setdefault((t, s), png) and f"{t}/{s}",
    )
    assert specs[0] != specs[1] and [e["live_outcome"] for e in episodes] == [1, -1]
    assert [e["num_steps"] for e in episodes] == [2, 1]
    assert all(e["termination"] == "done" and e["first_screenshot"] == f"{e['traj_id']}/None" for e in episodes)
    assert [r["screenshot"] for r in rows] == [f"{r['traj_id']}/{r['step_idx']}" for r in rows]
    assert set(saved.values()) == {b"\x89PNG\r\n\x1a\nfake"}
    created = StandInDesktopEnv.created
    for episode, spec in zip(episodes, specs):
        row = verify_episode(cfg, episode, json.dumps(spec), actions=[])  # no actions: a replay would fail
        assert (row["outcome"], row["valid"], row["verified_by"]) == (episode["live_outcome"], True, "live")
    assert StandInDesktopEnv.created == created  # no VM was started to verify
    lost = verify_episode(cfg, {**episodes[0], "live_outcome": None}, json.dumps(specs[0]), actions=[])
    assert lost["valid"] is False and "no live outcome" in lost["error"]
    capped = verify_episode(cfg, {**episodes[0], "termination": "max_steps"}, json.dumps(specs[0]), actions=[])
    assert (capped["outcome"], capped["valid"], capped["verified_by"]) == (-1, True, "step_cap")


def test_adapter_matches_the_installed_desktop_env():
    pytest.importorskip("desktop_env", reason="OSWorld (pip package desktop-env) is not installed")
    from desktop_env.desktop_env import DesktopEnv

    init = inspect.signature(DesktopEnv.__init__).parameters
    assert {"action_space", "require_a11y_tree"} <= set(init)
    assert "task_config" in inspect.signature(DesktopEnv.reset).parameters
    assert "pause" in inspect.signature(DesktopEnv.step).parameters
    assert callable(DesktopEnv.evaluate) and callable(DesktopEnv.close)


def test_live_episode_on_the_users_vm():
    pytest.importorskip("desktop_env", reason="OSWorld (pip package desktop-env) is not installed")
    if "RLANYTHING_OSWORLD" not in os.environ:
        pytest.skip("set RLANYTHING_OSWORLD to a JSON env.options section (kind osworld) to run an episode on a VM")
    cfg = build_config(
        {"env": {"kind": "osworld", "num_problems": 1, "options": json.loads(os.environ["RLANYTHING_OSWORLD"])}}
    ).env
    spec = initial_specs(cfg, seed=0)[0]
    env = make_env(cfg)
    try:
        assert env.reset(spec).startswith("Task: ")
        assert env.step("WAIT").done is False
        assert env.step("DONE").done is True
        assert env.outcome() in (-1, 1) and env.last_screenshot().startswith(b"\x89PNG")
    finally:
        env.close()
