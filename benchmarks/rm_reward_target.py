"""What the paper's RM reward asks the step judge for, read from a run's labelled steps.

    python -m benchmarks.rm_reward_target RUN_DIR [--iterations 0-29]
    python -m benchmarks.rm_reward_target RUN_DIR/eval/NAME   # an evaluation's greedy episodes

With λ = 0 a judgment earns O·S_j: every step is pushed towards its episode's outcome, so a
class of steps the judge cannot tell apart is pushed towards +1 in proportion to 2·P(won) − 1
(`algo.rm_accuracy.consistency_target`). For the labelled steps before each episode's last (the
headline of the RM's process measures; last steps apart) this prints, per rule of the
environment's labels (replayed here where the evaluation did not judge), how many steps there are, the share of them in won episodes with its 95%
interval and the push that share gives; and the AUROC of the episode's outcome against the labels
with its interval: what a judge that gave every step its episode's outcome, the verdict the
reward pays for, would score. Near 0.5 the reward teaches nothing that tells a good step from a
bad one. A training run is read twice: every task, and the mixed tasks only (won and lost in the
same iteration, the ones the RM trains on when its band excludes 0 and 1). Needs an environment
with step labels (TextWorld). No model is loaded.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import pandas as pd

from rlanything.agent.eval_judge import held_out_labels
from rlanything.algo.metrics import wilson_interval
from rlanything.algo.rm_accuracy import (
    NEUTRAL_RULES,
    PROGRESS_RULES,
    SETBACK_RULES,
    auroc,
    auroc_interval,
    consistency_target,
    prefix_credit,
    rule_order_auroc,
)
from rlanything.config import load_config
from rlanything.storage.artifacts import read_artifact
from rlanything.storage.layout import RunLayout
from rlanything.storage.parquet import read_table
from rlanything.storage.schemas import EVAL_EPISODES, EVAL_STEP_LABELS


def training_steps(run_dir: Path, iterations: range | None) -> pd.DataFrame:
    """Labelled steps of a run's training rollouts: outcome, label, rule, action, last, mixed,
    iteration, and `credit` (`prefix_credit` within each iteration's task groups)."""
    layout, frames = RunLayout(run_dir), []
    done = sorted(int(p.name.split("_")[1]) for p in run_dir.glob("iter_*") if (p / "step_labels.parquet").exists())
    for it in [i for i in done if iterations is None or i in iterations]:
        outcomes = read_artifact(layout, it, "outcomes")
        outcomes = outcomes[outcomes["valid"]]
        won = outcomes.groupby("task_id")["outcome"].agg(lambda o: (o > 0).mean())
        labels = read_artifact(layout, it, "step_labels").merge(
            outcomes[["traj_id", "outcome", "num_steps"]], on="traj_id"
        )
        actions = read_artifact(layout, it, "rollouts")[["traj_id", "step_idx", "action"]]
        labels = labels.merge(actions, on=["traj_id", "step_idx"])
        labels["last"] = labels["step_idx"] == labels["num_steps"] - 1
        labels["mixed"] = labels["task_id"].map(won).between(0, 1, inclusive="neither")
        key = labels["task_id"].astype(str)
        credit = prefix_credit(key, labels["traj_id"], labels["step_idx"], labels["action"], labels["outcome"])
        frames.append(labels.assign(iteration=it, credit=credit))
    if not frames:
        sys.exit(f"{run_dir}: no iteration with step labels")
    return pd.concat(frames, ignore_index=True)


def eval_steps(eval_dir: Path) -> pd.DataFrame:
    """Labelled steps of an evaluation's episodes (one greedy episode per problem)."""
    episodes = read_table(eval_dir / "episodes.parquet", EVAL_EPISODES)
    episodes = episodes[episodes["valid"]]
    path = eval_dir / "step_labels.parquet"  # written where the RM judged (eval.rm)
    labels = read_table(path, EVAL_STEP_LABELS) if path.exists() else replayed_labels(eval_dir, episodes)
    return labels.merge(episodes[["split", "problem_idx", "outcome"]], on=["split", "problem_idx"])


def replayed_labels(eval_dir: Path, episodes: pd.DataFrame) -> pd.DataFrame:
    """The environment's labels of the episodes' steps, replayed as the evaluation would have."""
    config = load_config(eval_dir.parents[1] / "config.yaml")  # runs/NAME/eval/WHICH
    frames = []
    with tempfile.TemporaryDirectory() as scratch:
        for split, part in episodes.groupby("split"):
            path = held_out_labels(config.env, part, split, Path(scratch) / f"{split}.parquet")
            if path is None:
                sys.exit(f"{config.env.kind} labels no step")
            frames.append(read_table(path, EVAL_STEP_LABELS))
    return pd.concat(frames, ignore_index=True)


def report(name: str, steps: pd.DataFrame) -> dict | None:
    before = steps[~steps["last"]]
    won = int((steps.drop_duplicates(["traj_key"])["outcome"] > 0).sum())
    episodes = steps["traj_key"].nunique()
    print(f"\n{name}: {episodes} episodes ({won} won), {len(before)} labelled steps before the last")
    if before.empty:
        return None
    r = consistency_target(before["outcome"].to_numpy(), before["label"].to_numpy(), before["rule"].to_numpy())
    labels = before.groupby("rule")["label"].first()
    print("  rule        label  steps  in won episodes [95% CI]   push towards +1 (2p - 1)")
    for rule, (won, n) in r["by_rule"].items():
        low, high = wilson_interval(won, n)
        print(
            f"  {rule:<11} {int(labels[rule]):+d}   {n:>6}  {won / n:6.1%} [{low:.1%}, {high:.1%}]   {2 * won / n - 1:+.2f}"
        )
    print(f"  in won episodes: good steps {r['won_good']:.1%}, bad steps {r['won_bad']:.1%}")
    print(f"  AUROC of the episode's outcome for the label: {_auroc(r)}")
    order = rule_order_auroc(r["by_rule"], before["label"].to_numpy(), before["rule"].to_numpy())
    print(f"  AUROC of the rule's share in won episodes for the label: {_auroc(order)}")
    if "credit" in before:  # training rollouts: G episodes of each game, whose actions part ways
        credit, good = before["credit"].to_numpy(), before["label"].to_numpy() > 0
        low, high = auroc_interval(credit, good)
        share = (credit != 0).mean()
        print(f"  AUROC of the group's prefix credit for the label: {auroc(credit, good):.3f} [{low:.3f}, {high:.3f}]")
        print(f"    ({share:.0%} of the steps get a credit other than 0; mean credit by rule: ", end="")
        print(", ".join(f"{r} {c:+.3f}" for r, c in before.groupby("rule")["credit"].mean().items()) + ")")
        _paid(before)
    return r["by_rule"]


def _paid(before: pd.DataFrame) -> None:
    """The credit as an RM target (`algo.progress_source: siblings` pays the sign of the same
    quantity and drops the steps where it is 0): on those it pays, how it ranks progress steps
    above setbacks (the progress AUROC's rules; no-ops apart) and how often its sign is right."""
    paid = before[(before["credit"] != 0) & before["rule"].isin(PROGRESS_RULES + SETBACK_RULES)]
    if paid.empty:
        return
    credit, good = paid["credit"].to_numpy(), paid["rule"].isin(PROGRESS_RULES).to_numpy()
    low, high = auroc_interval(credit, good)
    right = int(((credit > 0) == good).sum())
    share_low, share_high = wilson_interval(right, len(paid))
    print(f"    where it is not 0, progress steps ({good.sum()}) against setbacks ({(~good).sum()}): ", end="")
    print(f"AUROC {auroc(credit, good):.3f} [{low:.3f}, {high:.3f}], sign right on {right}, ", end="")
    print(f"{right / len(paid):.1%} [{share_low:.1%}, {share_high:.1%}]")
    noop = before[(before["credit"] != 0) & before["rule"].isin(NEUTRAL_RULES)]
    print(f"    and {len(noop)} no-ops, {int((noop['credit'] > 0).sum())} of them paid +1")


def _auroc(r: dict) -> str:
    return f"{r['auroc']:.3f} [{r['auroc_low']:.3f}, {r['auroc_high']:.3f}]"


def heldout(eval_dir: Path, shares: dict[str, dict]) -> None:
    """The held-out steps before the last, each scored by its rule's share in a training set."""
    steps = eval_steps(eval_dir)
    for split, part in steps.groupby("split"):
        before = part[~part["last"]]
        print(f"\nheld out, {eval_dir} ({split}): {len(before)} labelled steps before the last")
        for name, by_rule in shares.items():
            r = rule_order_auroc(by_rule, before["label"].to_numpy(), before["rule"].to_numpy())
            unseen = f" ({r['unknown']} steps of a rule the run never met)" if r["unknown"] else ""
            print(f"  scored by the shares of the run's {name}: AUROC {_auroc(r)}{unseen}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("path", type=Path, help="a run folder, or an evaluation folder (episodes.parquet)")
    ap.add_argument("--iterations", help="a training run's iterations, 'A-B' (both included); default all")
    ap.add_argument("--heldout", type=Path, help="an evaluation folder whose steps the run's shares score")
    args = ap.parse_args()
    print("== rm_reward_target: what the RM reward pushes each kind of step towards (no model loaded)")
    if (args.path / "episodes.parquet").exists():
        steps = eval_steps(args.path)
        steps["traj_key"] = steps["split"] + ":" + steps["problem_idx"].astype(str)
        for split, part in steps.groupby("split"):
            report(f"{args.path} ({split})", part)
        return
    span = None
    if args.iterations:
        first, last = (int(x) for x in args.iterations.split("-"))
        span = range(first, last + 1)
    steps = training_steps(args.path, span)
    steps["traj_key"] = steps["iteration"].astype(str) + ":" + steps["traj_id"].astype(str)
    its = f"iterations {steps['iteration'].min()}-{steps['iteration'].max()}"
    shares = {"every task": report(f"{args.path}, {its}, every task", steps)}
    shares["mixed tasks"] = report(f"{args.path}, {its}, mixed tasks only", steps[steps["mixed"]])
    if args.heldout:
        heldout(args.heldout, {k: v for k, v in shares.items() if v})


if __name__ == "__main__":
    main()
