"""Which step target tells good steps from bad ones: the paper's (the episode's outcome) or a
Monte-Carlo progress target (the policy plays on K times from before and after the step).

    python -m benchmarks.progress_target EVAL_DIR POLICY -c CONFIG [--set k=v] [--steps 64] [--k 4]

EVAL_DIR: an evaluation of a text game (episodes.parquet, steps.parquet, step_labels.parquet);
POLICY: the weights that play the continuations (the evaluation's, or any other). A sample of
`--steps` labelled steps before an episode's last is drawn; for each, the states before and after
it are valued by `agent.branching.state_values` (K continuations at the config's policy
temperature, one core's batch), and the step's progress is V(after) − V(before)
(`algo.mc_progress`). Printed, for the same steps: the AUROC of progress steps (closer) against
setbacks (farther, invalid, lost) for the progress target, for its episode's outcome (what the
paper's reward pays), and for the evaluation's judge (its mean verdict, where it judged); the
no-op steps (unchanged) apart; and what the values cost (seconds, continuations, turns, tokens).
One row per step goes to `--csv`.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import pandas as pd

from benchmarks.common import cpu_line, header
from rlanything.agent.branching import BranchPoint, state_values
from rlanything.algo.mc_progress import branch_states, progress_targets
from rlanything.algo.rm_accuracy import NEUTRAL_RULES, PROGRESS_RULES, SETBACK_RULES, auroc, auroc_interval
from rlanything.config import load_config
from rlanything.envs import make_env
from rlanything.models.engines.make import make_engine
from rlanything.models.precision import precision_of


def sampled_steps(eval_dir: Path, n: int, seed: int) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """`n` labelled steps before an episode's last (ranked or neutral rules), drawn with `seed`
    -> (those steps with outcome and judge mean, the episodes, their step rows)."""
    episodes = pd.read_parquet(eval_dir / "episodes.parquet")
    episodes = episodes[episodes["valid"]].set_index("problem_idx")
    labels = pd.read_parquet(eval_dir / "step_labels.parquet")
    rules = PROGRESS_RULES + SETBACK_RULES + NEUTRAL_RULES
    labels = labels[~labels["last"] & labels["rule"].isin(rules) & labels["problem_idx"].isin(episodes.index)]
    picked = labels.sample(n=min(n, len(labels)), random_state=seed).sort_values(["problem_idx", "step_idx"])
    picked["outcome"] = picked["problem_idx"].map(episodes["outcome"]).astype(float)
    judged = eval_dir / "judgments.parquet"
    if judged.exists():
        j = pd.read_parquet(judged)
        means = j[j["parsed"]].groupby(["problem_idx", "step_idx"])["step_score"].mean()
        picked["judge"] = [means.get((p, s), np.nan) for p, s in zip(picked["problem_idx"], picked["step_idx"])]
    steps = pd.read_parquet(eval_dir / "steps.parquet").sort_values(["problem_idx", "step_idx"])
    return picked.reset_index(drop=True), episodes, steps


def branch_point(episode, steps: pd.DataFrame, k: int) -> BranchPoint:
    """The state after the episode's first `k` actions, with what the policy had seen there."""
    taken = steps[steps["problem_idx"] == episode.name].head(k)
    return BranchPoint(
        spec=json.loads(episode["spec"]),
        observations=(episode["first_observation"], *taken["observation"]),
        responses=tuple(taken["response"]),
        actions=tuple(a if isinstance(a, str) else None for a in list(episode["actions"])[:k]),
    )


def ranked_auroc(scores: np.ndarray, rule: np.ndarray) -> str:
    """AUROC of progress steps against setbacks with its 95% interval, for `scores`."""
    keep = np.isin(rule, PROGRESS_RULES + SETBACK_RULES) & ~np.isnan(scores)
    good = np.isin(rule[keep], PROGRESS_RULES)
    if good.all() or not good.any():
        return "n/a (one class)"
    low, high = auroc_interval(scores[keep], good)
    return f"{auroc(scores[keep], good):.3f} [{low:.3f}, {high:.3f}] ({good.sum()} closer, {(~good).sum()} setbacks)"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("eval_dir", type=Path)
    ap.add_argument("policy", type=Path, help="the weights that play the continuations")
    ap.add_argument("-c", "--config", type=Path, required=True)
    ap.add_argument("--set", dest="overrides", action="append", default=[], help="a config override, k=v")
    ap.add_argument("--steps", type=int, default=64, help="labelled steps before the last to value")
    ap.add_argument("--k", type=int, default=4, help="continuations per state")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--csv", type=Path, help="write one row per step here")
    args = ap.parse_args()
    header("progress_target: the Monte-Carlo progress target against the outcome, on held-out steps")
    print(f"   {cpu_line()}")
    config = load_config(args.config, args.overrides)
    picked, episodes, steps = sampled_steps(args.eval_dir, args.steps, args.seed)
    ends = {int(p): (int(e["num_steps"]), float(e["outcome"])) for p, e in episodes.iterrows()}
    states = branch_states(picked["problem_idx"].to_numpy(), picked["step_idx"].to_numpy(), ends)
    points = [branch_point(episodes.loc[p], steps, k) for p, k in states]
    engine, tokenizer = make_engine(config.policy, "policy", args.policy, precision_of(config, "policy"))
    sampling = {"max_new_tokens": config.policy.max_new_tokens, "temperature": config.policy.temperature}
    start = time.perf_counter()
    values, counts = state_values(
        engine,
        tokenizer,
        lambda: make_env(config.env),
        points,
        k=args.k,
        max_steps=config.env.max_steps,
        sampling={**sampling, "top_p": config.policy.top_p},
        seed=args.seed,
        answer_fallback=config.env.answer_fallback,
    )
    seconds = time.perf_counter() - start
    by_state = dict(zip(states, values))
    picked["v_before"] = [by_state.get((p, s), np.nan) for p, s in zip(picked["problem_idx"], picked["step_idx"])]
    picked["progress"] = progress_targets(picked["problem_idx"], picked["step_idx"], by_state, ends)
    report(picked, counts, seconds, len(states), args.k)
    if args.csv:
        args.csv.parent.mkdir(parents=True, exist_ok=True)
        picked.to_csv(args.csv, index=False)


def report(picked: pd.DataFrame, counts: dict, seconds: float, states: int, k: int) -> None:
    rule = picked["rule"].to_numpy()
    print(
        f"\n{len(picked)} steps before the last ({picked['problem_idx'].nunique()} episodes), {states} states x K = {k}"
    )
    print(f"  by rule: {picked['rule'].value_counts().to_dict()}")
    print(f"  AUROC, progress target:   {ranked_auroc(picked['progress'].to_numpy(), rule)}")
    print(f"  AUROC, its sign:          {ranked_auroc(np.sign(picked['progress'].to_numpy()), rule)}")
    print(f"  AUROC, episode's outcome: {ranked_auroc(picked['outcome'].to_numpy(), rule)}")
    if "judge" in picked:
        print(f"  AUROC, the eval's judge:  {ranked_auroc(picked['judge'].to_numpy(), rule)}")
    means = picked.groupby("rule")["progress"].agg(["mean", "count"]).round(3)
    print(f"  mean progress by rule: {means.to_dict('index')}")
    zero = float((picked["progress"] == 0).mean())
    print(f"  steps whose progress is 0: {zero:.0%}; not valued (NaN): {int(picked['progress'].isna().sum())}")
    print(
        f"  cost: {seconds:.0f} s for {counts['continuations']} continuations ({seconds / max(states, 1):.1f} s a state), "
        f"{counts['steps_played']} turns, {counts['response_tokens']} tokens generated; "
        f"env errors {counts['env_errors']}, replay mismatches {counts['replay_mismatch']}"
    )


if __name__ == "__main__":
    main()
