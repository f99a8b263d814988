"""RM scoring (step 3 of docs/method.md) with and without the KV reuse of `engine.PrefixCache`.

    python -m benchmarks.rm_scoring [--trajectories 8] [--steps 6] [--judgments 2]
                                    [--new-tokens 24] [--verdict constrained|free] [--bf16]

Workload: `trajectories` text-game episodes of `steps` steps each (fixed, ALFWorld-like
replies and observations), every step judged `judgments` times by SmolLM2 through
`judge.judge_steps`, as the rm_score step calls it. A step's judge prompt holds the whole
history before it, so prompt tokens grow quadratically with the episode length.

Compared, in one process, on the same steps and seeds (interleaved, rotating order):
  full    `rm.kv_reuse_gb: 0`: every judgment prefills its whole prompt (repeats of the same
          prompt once), and the constrained verdict runs prompt + reasoning again
  reuse   the default: later steps reuse earlier steps' history, the verdict its reasoning
Printed: seconds per round, the time ratio reuse/full, and the tokens each fed through the
model (a forward hook: non-pad tokens of prefills and decode steps). --bf16 on a CPU without bf16
units (neither amx_bf16 nor avx512_bf16 in /proc/cpuinfo's flags, or in RLANYTHING_CPU_FLAGS when
set) times nothing and says so in one line: bf16 runs on slow emulation kernels there.

    python -m benchmarks.rm_scoring --replay RUN/iter_0000 [--config configs/smollm2-arith-full.yaml]
                                    [--batch-sizes 64,128]

judges a real iteration's steps instead (its rollouts, episodes and outcomes, as the rm_score step
reads them) as the step judges them (`agent.judging.judge_as_configured`: the config's RM settings and its
environment's judge hint), fp32, at each batch size: `in-pass`, the engine
decoding the constrained verdict in the generation pass (the default), against `two-pass`, the
verdict scored after the reasoning (what engines without `decodes_choices` do), and `in-rows`,
the default with the judge prompts' shared beginning copied into every row's cache instead of
held once (models/engines/prefix_attention.py). With direct verdicts (`rm.max_new_tokens: 0`,
constrained, as configs/smollm2-textworld.yaml ships) the modes are `per-step`, the default (one
scoring a step serves its m judgments), against `per-judgment`, what it cost before (each judgment
decoded in a row of its own). Printed per (mode, batch): seconds, forwards, mean rows per
forward, mean prompt and response tokens.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from benchmarks.common import TokensFed, header, timed_precisions
from rlanything.agent.judging import judge_as_configured
from rlanything.models.engines.transformers_engine import TransformersEngine
from rlanything.models.judge import judge_steps
from rlanything.models.loading import load_model, load_tokenizer, smollm2_model_dir


def episodes(trajectories: int, steps: int) -> list[dict]:
    """judge_steps' input: every step of every episode with the history before it."""
    out = []
    for t in range(trajectories):
        history = []
        for k in range(steps):
            response = (
                f"I have not found the apple yet, so I look at the next counter. \\boxed{{go to counter {k + 1}}}"
            )
            observation = f"You arrive at counter {k + 1}. On it you see a mug, a knife and a loaf of bread ({t})."
            out.append(
                {
                    "traj_id": t,
                    "task_id": f"t{t}",
                    "step_idx": k,
                    "history": list(history),
                    "task": f"Task {t}: put a clean apple in the fridge. You are in the middle of a kitchen.",
                    "response": response,
                    "observation": observation,
                }
            )
            history.append((response, observation))
    return out


class TwoPass(TransformersEngine):
    """The engine as an engine that cannot decode a Choice: the judge scores both verdicts after."""

    decodes_choices = False


class PrefixInRows(TransformersEngine):
    """The default engine without a SharedPrefix: every row's cache holds its whole prompt."""

    def _shared_prefix(self, prompts):
        return None


def replay(iteration_dir: str, config_path: str, batch_sizes: list[int]) -> None:
    """Time judge_steps on a run's iteration (see the module docstring)."""
    import pandas as pd

    from rlanything.agent.judging import judged_outcomes, steps_to_judge
    from rlanything.config import load_config
    from rlanything.models.engines.generation import PrefixCache

    config = load_config(config_path)
    rm = config.rm
    steps, episodes, outcomes = (
        pd.read_parquet(Path(iteration_dir) / f"{n}.parquet") for n in ("rollouts", "episodes", "outcomes")
    )
    judged = judged_outcomes(outcomes[outcomes.valid & ~outcomes.pending], config)  # as the rm_score step
    steps = steps_to_judge(steps, episodes, judged, rm.history_steps)
    header(
        f"RM scoring replay: {len(steps)} steps of {iteration_dir} × m={rm.judgments_per_step}, {rm.verdict} verdict"
    )
    path = smollm2_model_dir()
    tokenizer, model = load_tokenizer(path), load_model(path)
    print(
        f"   {'mode':12s} {'batch':>5s} {'seconds':>8s} {'forwards':>9s} {'rows/fwd':>9s} {'prompt':>7s} {'response':>9s}"
    )
    direct = rm.max_new_tokens == 0 and rm.verdict == "constrained"
    modes = [("per-step", TransformersEngine)] if direct else []
    modes = modes or [("two-pass", TwoPass), ("in-rows", PrefixInRows), ("in-pass", TransformersEngine)]
    for batch in batch_sizes:
        for name, kind in modes:
            engine = kind(model, tokenizer, batch_size=batch, keep_bytes=rm.kv_reuse_gb * 2**30)
            start = time.perf_counter()
            with TokensFed(model) as counter:
                rows = judge_as_configured(engine, tokenizer, steps, config, seed=1, prefix_cache=PrefixCache())
            _print_mode(name, batch, time.perf_counter() - start, counter, rows)
        if direct:  # what direct verdicts cost before: each of the m judgments decoded in its own row
            prompts = [r["prompt_ids"] for r in rows[:: rm.judgments_per_step]]
            _per_judgment(model, tokenizer, prompts, rm, batch)


def _per_judgment(model, tokenizer, prompts: list[list[int]], rm, batch: int) -> None:
    """Direct verdicts as they were judged before one scoring served a step's m judgments: m
    copies of each prompt, the verdict decoded in the generation pass (`Choice`)."""
    from rlanything.models.engines.generation import PrefixCache
    from rlanything.models.judge import verdict_choice

    engine = TransformersEngine(model, tokenizer, batch_size=batch, keep_bytes=rm.kv_reuse_gb * 2**30)
    jobs = [p for p in prompts for _ in range(rm.judgments_per_step)]
    start = time.perf_counter()
    with TokensFed(model) as counter:
        gens = engine.generate(
            jobs, max_new_tokens=0, temperature=rm.temperature, top_p=rm.top_p, seed=1,
            prefix_cache=PrefixCache(), choice=verdict_choice(tokenizer),
        )  # fmt: skip
    rows = [{"prompt_ids": p, "response_ids": g.token_ids} for p, g in zip(jobs, gens)]
    _print_mode("per-judgment", batch, time.perf_counter() - start, counter, rows)


def _print_mode(name: str, batch: int, seconds: float, counter, rows: list[dict]) -> None:
    forwards = len(counter.calls)
    rows_per = sum(r for r, _ in counter.calls) / forwards
    prompt = sum(len(r["prompt_ids"]) for r in rows) / len(rows)
    response = sum(len(r["response_ids"]) for r in rows) / len(rows)
    print(
        f"   {name:12s} {batch:5d} {seconds:8.1f} {forwards:9d} {rows_per:9.1f} {prompt:7.0f} {response:9.1f}",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trajectories", type=int, default=8)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--judgments", type=int, default=2, help="m")
    parser.add_argument("--new-tokens", type=int, default=24, help="reasoning budget")
    parser.add_argument("--verdict", choices=["constrained", "free"], default="constrained")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--bf16", action="store_true", help="the RM in bfloat16")
    parser.add_argument("--replay", help="judge this iteration folder's steps instead")
    parser.add_argument("--config", default="configs/smollm2-arith-full.yaml", help="with --replay: RM settings")
    parser.add_argument("--batch-sizes", default="64,128", help="with --replay")
    args = parser.parse_args()
    if args.replay:
        return replay(args.replay, args.config, [int(b) for b in args.batch_sizes.split(",")])
    dtype = "bfloat16" if args.bf16 else "float32"
    header(
        f"RM scoring: SmolLM2-135M {dtype}, {args.trajectories} episodes × {args.steps} steps × "
        f"m={args.judgments}, {args.new_tokens} reasoning tokens, {args.verdict} verdict"
    )
    if args.bf16 and not timed_precisions(["bf16"]):
        return  # a CPU without bf16 units: bf16 would time its emulation (the line printed says so)
    path = smollm2_model_dir()
    tokenizer, model = load_tokenizer(path), load_model(path, dtype)
    steps = episodes(args.trajectories, args.steps)
    engines = {
        "full": TransformersEngine(model, tokenizer, keep_bytes=0),
        "reuse": TransformersEngine(model, tokenizer, keep_bytes=2 * 2**30),
    }
    seconds, fed = {n: 0.0 for n in engines}, {n: 0 for n in engines}
    names = list(engines)
    for r in range(args.rounds):
        for name in names[r % 2 :] + names[: r % 2]:
            start = time.perf_counter()
            with TokensFed(model) as counter, torch.no_grad():
                rows = judge_steps(
                    engines[name],
                    tokenizer,
                    steps,
                    judgments_per_step=args.judgments,
                    verdict=args.verdict,
                    max_new_tokens=args.new_tokens,
                    temperature=1.0,
                    top_p=1.0,
                    seed=r,
                )
            seconds[name] += time.perf_counter() - start
            fed[name] += counter.total
        print(f"   ... round {r}: " + ", ".join(f"{n} {seconds[n]:.1f} s" for n in names), flush=True)
    prompt_tokens, reasoning = sum(len(r["prompt_ids"]) for r in rows), sum(len(r["response_ids"]) for r in rows)
    print(f"   a round: {len(rows)} judgments, {prompt_tokens} prompt + {reasoning} response tokens")
    print(f"   {'':6s} {'s/round':>8s} {'tokens fed/round':>17s}")
    for name in names:
        print(f"   {name:6s} {seconds[name] / args.rounds:8.1f} {fed[name] // args.rounds:17d}")
    print(f"   reuse / full time: {seconds['reuse'] / seconds['full']:.2f}")


if __name__ == "__main__":
    main()
