"""A text-game setting's starting point: the base policy's greedy win rate on held-out games, and
what one rollout turn costs.

    python -m benchmarks.textgame_base [-c configs/smollm2-textworld.yaml] [-n 64] [--split in_domain]
        [--set KEY=VALUE ...]

Plays `n` held-out games of `split` once each, greedily, with the config's policy (by default
the shipped SmolLM2 TextWorld config), exactly as `rlanything eval` plays them
(`agent.eval_play.heldout_problems`, `play_greedy_steps`), without Prefect, MLflow or the RM, and
prints per turn: the games still running, their longest and mean prompt (tokens), the seconds
the engine took and the tokens it sampled per game; then the wins with their 95% Wilson interval,
the format (what share of the replies were read from a box) and the time. Used to choose the
shipped settings of a text game (docs/learning.md, "Text games: where SmolLM2 starts"): the
base win rate should leave room to learn, and a turn should be cheap enough for an iteration.

Games are generated (and cached) before the first turn; the generation time is printed apart.
One process, one setting: run it once per candidate, with nothing else on the cores (two torch
processes on two cores slow each other down several times over).
"""

from __future__ import annotations

import argparse
import collections
import os
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-c", "--config", default=str(REPO / "configs/smollm2-textworld.yaml"))
    parser.add_argument("-n", "--problems", type=int, default=64)
    parser.add_argument("--split", default="in_domain", choices=["in_domain", "ood"])
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args()
    os.environ.setdefault("MKL_CBWR", "AUTO,STRICT")  # as the CLI sets it

    import torch

    from rlanything.agent.eval_play import heldout_problems, play_greedy_steps
    from rlanything.algo.metrics import wilson_interval
    from rlanything.config import load_config
    from rlanything.envs import make_env
    from rlanything.models.engines.make import make_engine
    from rlanything.models.loading import resolve_model_path
    from rlanything.models.precision import precision_of

    config = load_config(args.config, args.overrides)
    specs, _ = heldout_problems(config.env, args.split, args.problems, config.run.seed, [])
    start = time.perf_counter()
    for spec in specs:  # generate (or find) every game and its worked example before timing turns
        env = make_env(config.env)
        env.reset(spec)
        env.close()
    print(f"{len(specs)} {args.split} games of {config.env.kind} ready in {time.perf_counter() - start:.1f} s")
    precision = precision_of(config, "policy")  # the config's, resolved on this machine
    engine, tokenizer = make_engine(config.policy, "policy", resolve_model_path(config.policy.model), precision)
    generate = engine.generate

    def timed(prompts, **kwargs):
        began = time.perf_counter()
        out = generate(prompts, **kwargs)
        lengths = [len(p) for p in prompts]
        sampled = sum(len(g.token_ids) for g in out) / len(out)
        print(
            f"turn: {len(prompts):3d} games, prompt max {max(lengths):5d} mean {sum(lengths) // len(lengths):5d} "
            f"tokens, {time.perf_counter() - began:6.1f} s, {sampled:.1f} tokens sampled per game",
            flush=True,
        )
        return out

    engine.generate = timed
    began = time.perf_counter()
    rows, steps = play_greedy_steps(
        engine, tokenizer, config.env, specs, args.split, max_new_tokens=config.policy.max_new_tokens
    )
    seconds = time.perf_counter() - began
    wins = sum(bool(r["strict_success"]) for r in rows)
    low, high = wilson_interval(wins, len(rows))
    statuses = collections.Counter(s["action_status"] for s in steps)
    print(
        f"strict wins {wins}/{len(rows)} = {100 * wins / len(rows):.1f}% [{100 * low:.1f}, {100 * high:.1f}]; "
        f"replies boxed {statuses['ok']}/{len(steps)}; {seconds:.1f} s playing; "
        f"torch threads {torch.get_num_threads()}"
    )


if __name__ == "__main__":
    main()
