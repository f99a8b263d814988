"""MiniWoB++ throughput: the scripted DOM-reading expert (tests/envs/test_miniwob.py) plays
family tasks through the rollout loop (`play`), G episodes per task interleaved, first with a
browser per episode, then with fewer browsers than episodes (the pool then rebuilds an episode's
page when the episode gets a browser another one used). Prints episodes per minute, and per step: the time inside `env.step`, the part
spent in Selenium calls on the page, and the rest — the pool's overhead (lease, timeout thread,
page rebuilds, reading the DOM back into an observation).

    python -m benchmarks.miniwob_expert [--tasks 6] [--group 2] [--shared 2]

Needs Debian's chromium + chromium-driver (`make system-deps`). Ratios compare the two pool
settings measured in the same process.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time
from pathlib import Path

from rlanything.agent.play import play
from rlanything.config import build_config
from rlanything.envs import browser_pool, make_env
from rlanything.envs.miniwob import FAMILIES, MiniWoBEnv
from rlanything.models.loading import load_tokenizer, resolve_model_path

REPO = Path(__file__).resolve().parents[1]


def expert_tests():
    """tests/envs/test_miniwob.py, where the expert lives with the tests that check it, loaded
    from its file (tests/ is not a package)."""
    spec = importlib.util.spec_from_file_location("miniwob_expert_tests", REPO / "tests" / "envs" / "test_miniwob.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


EXPERT_TESTS = expert_tests()
ALL_TASKS, ExpertEngine = EXPERT_TESTS.ALL_TASKS, EXPERT_TESTS.ExpertEngine


class Clock:
    """Seconds spent inside MiniWoBEnv.step and inside Selenium calls (Browser.run's fn)."""

    def __init__(self):
        self.step_s = self.driver_s = 0.0
        self.steps, self.in_step = 0, False

    def install(self):
        step, run = MiniWoBEnv.step, browser_pool.Browser.run
        clock = self

        def timed_step(env, action):
            start, clock.in_step = time.perf_counter(), True
            try:
                return step(env, action)
            finally:
                clock.step_s += time.perf_counter() - start
                clock.steps, clock.in_step = clock.steps + 1, False

        def timed_run(browser, fn, timeout_s):
            def inner(driver):
                start = time.perf_counter()
                try:
                    return fn(driver)
                finally:
                    if clock.in_step:  # `play` steps episodes one after another, so a flag suffices
                        clock.driver_s += time.perf_counter() - start

            return run(browser, inner, timeout_s)

        MiniWoBEnv.step, browser_pool.Browser.run = timed_step, timed_run
        return lambda: (setattr(MiniWoBEnv, "step", step), setattr(browser_pool.Browser, "run", run))


def measure(pool_size: int, specs: list[dict], group: int, tokenizer) -> dict:
    cfg = build_config(
        {
            "env": {
                "kind": "miniwob",
                "max_steps": 15,
                "num_problems": 1,
                "options": {"pool_size": pool_size, "tasks": ALL_TASKS},
            }
        }
    ).env
    tasks = [
        {"task_id": f"s{i:03d}v00", "slot": i, "version": 0, "spec": s, "pending": False} for i, s in enumerate(specs)
    ]
    # a first pass launches the pool's browsers; the timed second pass plays the same episodes
    play(
        ExpertEngine(tokenizer),
        tokenizer,
        lambda: make_env(cfg),
        tasks,
        group_size=group,
        max_steps=15,
        max_new_tokens=32,
        temperature=1.0,
        top_p=1.0,
        seed=0,
    )
    clock = Clock()
    restore = clock.install()
    try:
        start = time.perf_counter()
        rows, episodes = play(
            ExpertEngine(tokenizer),
            tokenizer,
            lambda: make_env(cfg),
            tasks,
            group_size=group,
            max_steps=15,
            max_new_tokens=32,
            temperature=1.0,
            top_p=1.0,
            seed=0,
        )
        wall = time.perf_counter() - start
    finally:
        restore()
        browser_pool.shutdown_all()
    done = sum(e["termination"] == "done" for e in episodes)
    return {
        "episodes": len(episodes),
        "done": done,
        "steps": len(rows),
        "wall": wall,
        "step_ms": 1e3 * clock.step_s / clock.steps,
        "driver_ms": 1e3 * clock.driver_s / clock.steps,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", type=int, default=6, help="distinct tasks, taken in turn from the families")
    parser.add_argument("--group", type=int, default=2, help="rollouts per task (G), played concurrently")
    parser.add_argument("--shared", type=int, default=2, help="browsers in the second, smaller pool")
    args = parser.parse_args()
    tokenizer = load_tokenizer(resolve_model_path("builtin:tiny-random"))
    ladders = list(FAMILIES.values())
    tasks = [ladders[i % len(ladders)][(i // len(ladders)) % len(ladders[i % len(ladders)])] for i in range(args.tasks)]
    specs = [{"task": task, "seed": 500 + i} for i, task in enumerate(tasks)]
    n = args.tasks * args.group
    results = {
        f"{n} browsers (one each)": measure(n, specs, args.group, tokenizer),
        f"{args.shared} browsers (shared)": measure(args.shared, specs, args.group, tokenizer),
    }
    print(f"{n} expert episodes ({', '.join(tasks)}; G={args.group}), interleaved by `play` (one step of each in turn)")
    print(
        f"{'pool':24} {'episodes/min':>12} {'ended':>7} {'steps':>6} {'env.step ms':>12} {'in Selenium ms':>15} {'pool overhead ms':>17}"
    )
    for name, r in results.items():
        overhead = r["step_ms"] - r["driver_ms"]
        print(
            f"{name:24} {60 * r['episodes'] / r['wall']:12.1f} {r['done']:>3}/{r['episodes']:<3} {r['steps']:6d} "
            f"{r['step_ms']:12.1f} {r['driver_ms']:15.1f} {overhead:10.1f} ({overhead / r['step_ms']:.0%})"
        )
    own, shared = results.values()
    print(f"ratio: the shared pool takes {shared['wall'] / own['wall']:.2f}x the wall time of a browser per episode")


if __name__ == "__main__":
    main()
