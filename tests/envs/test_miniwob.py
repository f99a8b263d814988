"""MiniWoB++ in a real headless Chromium, no mocks.

A scripted expert reads the DOM from the observation and answers through the rollout loop
(`play`) like a policy would; the verify path (`replay_outcome`) must agree. Also: replay
determinism, malformed actions, screenshots, a killed or hung browser, rewrites.
"""

import io
import os
import re
import signal
import time
from pathlib import Path

import pytest

from rlanything.agent.play import play
from rlanything.config import build_config
from rlanything.envs import env_class, initial_specs, make_env
from rlanything.envs.browser_pool import BrowserFailure, process_pool
from rlanything.envs.miniwob import FAMILIES, MiniWoBEnv, page_elements, parse_action
from rlanything.envs.verification import replay_outcome
from rlanything.models.engines.generation import Generation

ALL_TASKS = [task for ladder in FAMILIES.values() for task in ladder]


def env_config(**miniwob):
    data = {"kind": "miniwob", "max_steps": 15, "num_problems": 3, "options": {"pool_size": 2, **miniwob}}
    return build_config({"env": data}).env


def pool_of(cfg):
    m = cfg.options
    return process_pool(m.pool_size, m.chromium, m.chromedriver, m.launch_timeout_s)


# --- a DOM-reading expert ------------------------------------------------------------------------
LINE = re.compile(r'^\[(\d+)\] (\S+) "([^"]*)"(.*?) @-?\d+,-?\d+ \d+x\d+$')


def read_observation(obs: str) -> tuple[str, list[dict]]:
    task = obs.splitlines()[0].removeprefix("Task: ")
    elements = []
    for line in obs.splitlines():
        if m := LINE.match(line):
            elements.append({"ref": int(m.group(1)), "tag": m.group(2), "text": m.group(3), "state": m.group(4)})
    return task, elements


def expert(obs: str, wrong: bool = False) -> str:
    """The next action that solves the task (or, with `wrong`, a click on the wrong button)."""
    task, els = read_observation(obs)

    def ref(tag=None, text=None, nth=0):
        hits = [e for e in els if (tag is None or e["tag"] == tag) and (text is None or e["text"] == text)]
        return hits[nth]["ref"]

    def fill(pairs, submit):  # type each (input, value) that is not yet right, then submit
        for element, value in pairs:
            if f'value="{value}"' not in element["state"]:
                return f'type({element["ref"]}, "{value}")'
        return f"click({ref('button', submit)})"

    if m := re.fullmatch(r'Click on the "(.+)" button\.', task):
        buttons = [e for e in els if e["tag"] == "button"]
        target = [e for e in buttons if (e["text"] == m.group(1)) != wrong][0]
        return f"click({target['ref']})"
    if task == "Click the button.":
        return f"click({ref('button')})"
    if m := re.fullmatch(r"Click button (\w+)\.", task):
        return f"click({ref('button', m.group(1))})"
    if m := re.fullmatch(r'Click on the link "(.+)"\.', task):
        return f"click({ref(text=m.group(1))})"
    if task.startswith("Close the dialog box"):
        return f"click({ref('button', 'Close')})"
    if task == "Focus into the textbox.":
        return f"click({ref('input_text')})"
    if m := re.fullmatch(r"Focus into the (\d)\w\w input textbox\.", task):
        return f"click({ref('input_text', nth=int(m.group(1)) - 1)})"
    inputs = {tag: [e for e in els if e["tag"] == tag] for tag in ("input_text", "input_password")}
    if m := re.fullmatch(r'Enter "(.+)" into the text field and press Submit\.', task):
        return fill([(inputs["input_text"][0], m.group(1))], "Submit")
    if m := re.fullmatch(r'Type "(.+)" in all (upper|lower) case letters .*', task):
        value = m.group(1).upper() if m.group(2) == "upper" else m.group(1).lower()
        return fill([(inputs["input_text"][0], value)], "Submit")
    if m := re.fullmatch(r'Enter the password "(.+)" into both text fields .*', task):
        return fill([(e, m.group(1)) for e in inputs["input_password"]], "Submit")
    if m := re.fullmatch(r'Enter the username "(.+)" and the password "(.+)" into .*', task):
        pairs = [(inputs["input_text"][0], m.group(1)), (inputs["input_password"][0], m.group(2))]
        return fill(pairs, "Login")
    if m := re.fullmatch(r"Select (.+) and click Submit\.", task):
        wanted = set(re.split(r",\s*", m.group(1))) - {"nothing"}
        for e in els:
            if e["tag"] in ("input_checkbox", "input_radio") and (e["text"] in wanted) == ("unchecked" in e["state"]):
                return f"click({e['ref']})"
        return f"click({ref('button', 'Submit')})"
    raise AssertionError(f"the expert does not know this task: {task}")


class ExpertEngine:
    """GenerationEngine whose answers come from the expert reading the prompt's last observation."""

    def __init__(self, tokenizer, wrong=False, before_step=None):
        self.tokenizer, self.wrong, self.before_step, self.calls = tokenizer, wrong, before_step, 0

    def generate(self, prompts, *, max_new_tokens, temperature, top_p, seed, prefix_cache=None):
        if self.before_step is not None:
            self.before_step(self.calls)
        self.calls += 1
        out = []
        for ids in prompts:
            text = self.tokenizer.decode(ids)
            obs = text.rsplit("<|im_start|>user\n", 1)[1].split("<|im_end|>")[0]
            answer = f"I act on the page. \\boxed{{{expert(obs, self.wrong)}}}"
            tokens = self.tokenizer.encode(answer, add_special_tokens=False)
            out.append(Generation(tokens, [0.0] * len(tokens), answer, "stop"))
        return out


def run_episodes(cfg, tokenizer, specs, play_kw=None, **engine_kw):
    tasks = [
        {"task_id": f"s{i:03d}v00", "slot": i, "version": 0, "spec": s, "pending": False} for i, s in enumerate(specs)
    ]
    rows, trajectories = play(
        ExpertEngine(tokenizer, **engine_kw),
        tokenizer,
        lambda: make_env(cfg),
        tasks,
        group_size=1,
        max_steps=cfg.max_steps,
        max_new_tokens=32,
        temperature=1.0,
        top_p=1.0,
        seed=0,
        **(play_kw or {}),
    )
    actions = {t["traj_id"]: [r["action"] for r in rows if r["traj_id"] == t["traj_id"]] for t in trajectories}
    return rows, trajectories, actions


# --- tests ---------------------------------------------------------------------------------------
def test_expert_solves_every_task_through_the_rollout_loop_and_verify_agrees(tiny_tokenizer):
    cfg = env_config(tasks=ALL_TASKS)
    specs = [{"task": task, "seed": 11 + i} for i, task in enumerate(ALL_TASKS)]
    rows, trajectories, actions = run_episodes(cfg, tiny_tokenizer, specs)
    for spec, traj in zip(specs, trajectories):
        assert traj["termination"] == "done", (spec, traj["error"])
        assert replay_outcome(cfg, spec, actions[traj["traj_id"]]) == 1, (spec, actions[traj["traj_id"]])
    assert max(t["num_steps"] for t in trajectories) >= 4  # multi-step tasks really are multi-step
    assert all(r["action_status"] == "ok" for r in rows)


def test_wrong_click_fails_and_verify_agrees(tiny_tokenizer):
    cfg = env_config()
    spec = {"task": "click-button", "seed": 5}
    _, trajectories, actions = run_episodes(cfg, tiny_tokenizer, [spec], wrong=True)
    assert trajectories[0]["termination"] == "done" and trajectories[0]["num_steps"] == 1
    assert replay_outcome(cfg, spec, actions[0]) == -1


def test_replay_is_deterministic_for_random_action_sequences():
    """Random (mostly wrong) actions on every family task: a second environment replaying them
    (on whichever browser the pool gives it) sees the same observations and outcome."""
    import random

    cfg = env_config()
    rng = random.Random(0)
    for i, task in enumerate(ALL_TASKS):
        spec = {"task": task, "seed": 100 + i}
        env = make_env(cfg)
        observations, actions = [env.reset(spec)], []
        for _ in range(4):
            _, els = read_observation(observations[-1])
            refs = [e["ref"] for e in els] or [1]
            action = rng.choice([f"click({rng.choice(refs)})", f'type({rng.choice(refs)}, "ab")', "key(Tab)"])
            result = env.step(action)
            actions.append(action)
            observations.append(result.observation)
            if result.done:
                break
        outcome = env.outcome()
        env.close()
        replay = make_env(cfg)
        assert replay.reset(spec) == observations[0]
        assert [replay.step(a).observation for a in actions] == observations[1:], task
        assert replay.outcome() == outcome
        replay.close()


def test_episodes_run_concurrently_within_the_pool_size():
    """Threads each playing an episode: the pool lends each its own browser, none is shared."""
    from concurrent.futures import ThreadPoolExecutor

    cfg = env_config(pool_size=3)

    def solve(seed):
        env = make_env(cfg)
        obs, done = env.reset({"task": "click-checkboxes", "seed": seed}), False
        while not done:
            result = env.step(expert(obs))
            obs, done = result.observation, result.done
        env.close()
        return env.outcome()

    with ThreadPoolExecutor(3) as threads:
        assert list(threads.map(solve, [21, 22, 23])) == [1, 1, 1]
    assert len(pool_of(cfg).browsers) <= 3


def test_malformed_actions_are_answered_not_fatal():
    env = make_env(env_config())
    first = env.reset({"task": "click-button", "seed": 1})
    for bad, says in [
        (None, "no action"),
        ("clik(3)", "unknown action"),
        ("click(three)", "bad arguments"),
        ("click(999)", "there is no element [999]"),
        ("key(Hyper)", "unknown key"),
        ("just words", "cannot read"),
    ]:
        result = env.step(bad)
        assert not result.done and f"-> error: {says}" in result.observation, (bad, result.observation)
        assert result.observation.split("\n", 2)[2] == first.split("\n", 1)[1]  # page unchanged
    assert env.outcome() == -1  # never finished
    env.close()


def test_action_grammar():
    assert parse_action("click(5)") == ("click", 5, None)
    assert parse_action(" Click( [12] ) ") == ("click", 12, None)
    assert parse_action('type(4, "say \\"hi\\"")') == ("type", 4, 'say "hi"')
    assert parse_action("type([4], 'abc')") == ("type", 4, "abc")
    assert parse_action("key(Enter)") == ("key", None, "<Enter>")
    assert parse_action('key("Shift+Tab")') == ("key", None, "S-<Tab>")
    assert parse_action("key(a)") == ("key", None, "a")
    env = make_env(env_config())
    env.reset({"task": "enter-text", "seed": 0})
    assert "Last action: key(Shift+Tab) -> pressed Shift+Tab" in env.step("key(Shift+Tab)").observation
    env.close()


def test_observation_lists_interactive_elements_first_with_text_state_and_position():
    dom = {
        "tag": "BODY",
        "ref": 1,
        "left": 0,
        "top": 0,
        "width": 160,
        "height": 210,
        "children": [
            {
                "tag": "SPAN",
                "ref": 2,
                "left": 2,
                "top": 60,
                "width": 50,
                "height": 11,
                "text": "some words",
                "children": [],
            },
            {
                "tag": "LABEL",
                "ref": 3,
                "left": 2,
                "top": 80,
                "width": 60,
                "height": 11,
                "children": [
                    {
                        "tag": "INPUT_checkbox",
                        "ref": 4,
                        "left": 6,
                        "top": 78,
                        "width": 20,
                        "height": 13,
                        "value": True,
                        "children": [],
                    },
                    {
                        "tag": "t",
                        "ref": -1,
                        "left": 29,
                        "top": 80,
                        "width": 30,
                        "height": 11,
                        "text": "abc",
                        "children": [],
                    },
                ],
            },
            {
                "tag": "INPUT_text",
                "ref": 5,
                "left": 2,
                "top": 100,
                "width": 128,
                "height": 21,
                "value": "hey",
                "focused": True,
                "children": [],
            },
        ],
    }
    listed, by_ref = page_elements(dom)
    assert set(by_ref) == {1, 2, 3, 4, 5}
    lines = [e.line() for e in listed]
    assert lines == [
        '[2] span "some words" @2,60 50x11',
        '[3] label "abc" @2,80 60x11',
        '[4] input_checkbox "abc" checked @6,78 20x13',
        '[5] input_text "" value="hey" focused @2,100 128x21',
    ]


def test_screenshot_is_a_png_of_the_task_area():
    from PIL import Image

    env = make_env(env_config())
    env.reset({"task": "enter-text", "seed": 2})
    before = env.last_screenshot()
    assert before.startswith(b"\x89PNG\r\n\x1a\n")
    Image.open(io.BytesIO(before)).verify()
    assert Image.open(io.BytesIO(before)).size == (160, 210)
    _, els = read_observation(env.step("key(Tab)").observation)
    env.step(f"type({els[0]['ref']}, 'typed text')")
    assert env.last_screenshot() != before  # the state after the last step, not a stale one
    env.close()


def test_the_rollout_loop_keeps_a_screenshot_per_step_and_counts_failed_ones(tiny_tokenizer, monkeypatch):
    from PIL import Image

    saved, errors = {}, []

    def save(traj_id, step_idx, png):
        saved[(traj_id, step_idx)] = png
        return f"t{traj_id}-{step_idx}"

    spec = {"task": "enter-text", "seed": 4}  # focus, type, submit: three steps
    rows, trajectories, _ = run_episodes(
        env_config(), tiny_tokenizer, [spec], {"save_screenshot": save, "screenshot_errors": errors}
    )
    assert trajectories[0]["termination"] == "done" and len(rows) >= 2 and not errors
    assert trajectories[0]["first_screenshot"] == "t0-None" and trajectories[0]["live_outcome"] is None  # replayable
    assert [r["screenshot"] for r in rows] == [f"t0-{r['step_idx']}" for r in rows]
    assert set(saved) == {(0, None)} | {(0, r["step_idx"]) for r in rows}
    assert all(Image.open(io.BytesIO(png)).size == (160, 210) for png in saved.values())
    assert saved[(0, None)] != saved[(0, 1)]  # typing changed the page

    def broken(self):
        raise RuntimeError("screen capture failed")

    monkeypatch.setattr(MiniWoBEnv, "last_screenshot", broken)  # a failing capture costs the picture only
    rows, trajectories, actions = run_episodes(
        env_config(), tiny_tokenizer, [spec], {"save_screenshot": save, "screenshot_errors": errors}
    )
    assert trajectories[0]["termination"] == "done" and trajectories[0]["first_screenshot"] is None
    assert all(r["screenshot"] is None for r in rows) and len(errors) == len(rows) + 1
    assert "RuntimeError: screen capture failed" in errors[0]
    assert replay_outcome(env_config(), spec, actions[0]) == 1


def test_killed_browser_is_an_env_error_and_the_pool_recovers(tiny_tokenizer):
    cfg = env_config(pool_size=1)
    pool = pool_of(cfg)
    pool.shutdown()  # start from no browser: the one launched below is the episode's
    spec = {"task": "click-checkboxes", "seed": 3}  # several steps

    def kill_at_step_one(call):
        if call == 1:
            (browser,) = [b for b in pool.browsers if b.owner is not None]
            os.kill(browser.pids()[1], signal.SIGKILL)  # the Chromium main process

    started = time.perf_counter()
    _, trajectories, _ = run_episodes(cfg, tiny_tokenizer, [spec], before_step=kill_at_step_one)
    assert trajectories[0]["termination"] == "env_error" and "BrowserFailure" in trajectories[0]["error"]
    assert time.perf_counter() - started < 60
    launches = pool.launches
    _, trajectories, actions = run_episodes(cfg, tiny_tokenizer, [spec])  # a fresh browser
    assert trajectories[0]["termination"] == "done" and replay_outcome(cfg, spec, actions[0]) == 1
    assert pool.launches == launches + 1


def test_hung_browser_call_times_out_and_the_browser_is_killed():
    cfg = env_config()
    pool = pool_of(cfg)
    with pool.lease(object()) as browser:
        pids = browser.pids()
        started = time.perf_counter()
        with pytest.raises(BrowserFailure, match="still running"):
            browser.run(lambda driver: driver.execute_script("while (true) {}"), timeout_s=2)
        assert time.perf_counter() - started < 10
    assert not browser.alive and browser not in pool.browsers
    time.sleep(0.5)
    alive = [p for p in pids if os.path.exists(f"/proc/{p}") and "zombie" not in Path(f"/proc/{p}/status").read_text()]
    assert not alive


def test_specs_validation_and_rewrites_keep_a_real_verifier():
    cfg = env_config(tasks=["click-button", "enter-text"])
    specs = initial_specs(cfg, seed=4)
    assert [s["task"] for s in specs] == ["click-button", "enter-text", "click-button"]
    assert len({s["seed"] for s in specs}) == 3
    for bad, reason in [
        ({"task": "no-such-task", "seed": 1}, "no MiniWoB"),
        ({"task": "click-button"}, "spec keys"),
        ({"task": "click-button", "seed": "1"}, "seed: int"),
        ({"task": "flight.Alaska", "seed": 1}, "no MiniWoB"),
    ]:
        with pytest.raises(ValueError, match=reason):
            MiniWoBEnv.validate_spec(cfg, bad)
    spec = {"task": "click-button", "seed": 7, "hint": False}
    harder = MiniWoBEnv.rewrite_instructions(spec, "harder")
    assert "click-link" in harder and "click-test-2" not in harder and "\\boxed{}" in harder
    easier = MiniWoBEnv.rewrite_instructions(spec, "easier")
    assert "click-test-2" in easier and "with a hint" in easier
    for direction in ("harder", "easier"):
        new = MiniWoBEnv.parse_rewrite(spec, MiniWoBEnv.rule_rewrite(spec, direction))
        MiniWoBEnv.validate_spec(cfg, new)  # resets in a real browser
        assert new != spec
    assert MiniWoBEnv.parse_rewrite(spec, "\\boxed{click-link}")["task"] == "click-link"
    assert MiniWoBEnv.parse_rewrite(spec, "\\boxed{4}")["seed"] != 7  # a new instance
    hinted = MiniWoBEnv.parse_rewrite(spec, "\\boxed{3}")
    assert hinted["hint"] and "Hint:" in make_env(cfg).reset(hinted)
    for bad in ("no box", "\\boxed{9}", "\\boxed{click-button}", "\\boxed{tic-tac-toe}"):
        with pytest.raises(ValueError):
            MiniWoBEnv.parse_rewrite(spec, bad)
    top = {"task": "click-dialog", "seed": 1, "hint": True}
    assert MiniWoBEnv.parse_rewrite(top, MiniWoBEnv.rule_rewrite(top, "harder")) == {**top, "hint": False}
    with pytest.raises(ValueError, match="no harder variant"):
        MiniWoBEnv.rule_rewrite({**top, "hint": False}, "harder")
    assert env_class("miniwob") is MiniWoBEnv
