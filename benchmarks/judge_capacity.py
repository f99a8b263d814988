"""Can the step judge learn the game's own step labels at all? An offline test of its capacity,
apart from the loop's noisy targets and its one or two updates an iteration.

    python -m benchmarks.judge_capacity probe EVAL_DIR [EVAL_DIR ...] [--rm builtin:smollm2-135m-instruct]
    python -m benchmarks.judge_capacity finetune EVAL_DIR [EVAL_DIR ...] [--epochs 2] [--lr 1e-5] [--train-runs RUN ...]

EVAL_DIRs: evaluations of a text game judged by the RM (`rlanything eval RUN@N --set eval.rm=true`:
judgments.parquet with each judged step's exact prompt, step_labels.parquet with the game's
label of each step). Pooled: the labelled steps before an episode's last whose rule is a progress
step (`closer`) or a setback (`farther`, `invalid`, `lost`), one row per distinct prompt (greedy
evaluations of one game repeat episodes), the no-ops (`unchanged`) left out as in the headline
process AUROC. The games are split in two halves with `--seed`; a step is in the half of its game,
so no game's text is seen in both. The verdict is read as the constrained judge draws it: the
prompt, then "\\n\\\\boxed{", then the log-odds of the option "1" against "-1"
(`models.judge.verdict_choice`); the RM's weights in fp32 under bf16 autocast.

- `probe`: one forward pass over every step. Printed: the untrained RM's progress AUROC on the test
  half (its verdict's log-odds), and that of a logistic regression (scikit-learn, class-balanced,
  its C chosen by 5-fold cross-validation grouped by game) fitted on the train half's hidden states
  at the verdict position (3 layers apart, and together): is what the labels ask already in what the
  frozen judge computes? Then the last layer's probe from 16, 32, 82 and 164 train steps (5 draws
  each, its C as chosen): how many labelled steps the readout needs. The states go to `--out`
  (.npz); `--states` reads them back instead of running the passes again.
- `finetune`: the whole RM trained on the train half's labels for `--epochs`: the class-balanced
  cross-entropy of the two options (what the loop's reward asks of a verdict, given directly,
  without sampling), AdamW at `--lr` (the shipped `rm.optim.lr`), 8 prompts an optimizer step, the
  gradient clipped at 1. After each epoch, the test half's progress AUROC and the train half's
  (the fit). One row per test step and epoch goes to `--out` (.csv). With `--train-runs RUN ...`
  it trains instead on what those runs' loops trained their judges on: the distinct steps their
  sibling progress target valued, with its signs as labels (`sibling_steps`); the test is the same.
  `--train-labels game` keeps those prompts and gives them the game's labels instead (no-ops out).
  `--loss reward` trains with the loop's own objective in expectation instead, the expected
  reward of a verdict drawn at the judge's temperature (`verdict_loss`): no sampling and no
  clip, only the objective's shape (it saturates where the log-loss does not).
  `--train-top-layers N` trains only the last N decoder layers and the final norm
  (`optim.train_top_layers`): does the readout the probe found learn with the rest frozen, and
  how much cheaper is a step?

What the two answer: a judge that cannot rank the held-out games' steps after this, with the true
labels, many updates and no noise, cannot learn it in the loop either: the fix is another judge
(a larger model, or a prompt that shows what it needs), not more or better RM updates. One that
can, is starved in the loop: its targets (the sibling progress signs, the outcomes) or its few
updates are the limit. Figures: docs/judge.md.
"""

from __future__ import annotations

import argparse
import random
import time
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from benchmarks.common import cpu_line, header
from rlanything.algo.advantages import class_balanced
from rlanything.algo.rm_accuracy import PROGRESS_RULES, SETBACK_RULES, auroc, auroc_interval
from rlanything.config import RewardModelConfig
from rlanything.models.judge import verdict_choice
from rlanything.models.loading import load_model, load_tokenizer, resolve_model_path
from rlanything.models.training.lora import train_top_layers

GAME = ["split", "problem_idx"]
PER_STEP = 8  # prompts an optimizer step (micro-batches of one, the gradient accumulated)


def labelled_steps(eval_dirs: list[Path]) -> pd.DataFrame:
    """The evaluations' judged steps before an episode's last with a ranked rule, one per distinct
    prompt -> prompt, rule, good (closer), split, problem_idx, src (the evaluation folder)."""
    parts = []
    for folder in eval_dirs:
        judged = pd.read_parquet(folder / "judgments.parquet").drop_duplicates([*GAME, "step_idx"])
        labels = pd.read_parquet(folder / "step_labels.parquet")
        steps = judged[[*GAME, "step_idx", "prompt"]].merge(labels[~labels["last"]], on=[*GAME, "step_idx"])
        parts.append(steps.assign(src=str(folder)))
    steps = pd.concat(parts, ignore_index=True)
    steps = steps[steps.rule.isin(PROGRESS_RULES + SETBACK_RULES)].drop_duplicates("prompt")
    return steps.assign(good=steps.rule.isin(PROGRESS_RULES)).reset_index(drop=True)


def sibling_steps(run_dirs: list[Path]) -> pd.DataFrame:
    """The training runs' steps the sibling progress target valued (`algo.rm_target: progress`,
    `progress_source: siblings`: a nonzero progress), one per distinct prompt -> prompt, good
    (progress > 0), rule (the game's label, for the count; "?" where none), src: what the loop
    trained its judge on, with the loop's targets instead of the game's labels."""
    parts = []
    for run in run_dirs:
        for folder in sorted(run.glob("iter_*")):
            if not (folder / "progress.parquet").exists():
                continue
            valued = pd.read_parquet(folder / "progress.parquet").query("progress != 0 and progress == progress")
            judged = pd.read_parquet(folder / "judgments.parquet", columns=["traj_id", "step_idx", "prompt"])
            labels = pd.read_parquet(folder / "step_labels.parquet", columns=["traj_id", "step_idx", "rule"])
            steps = valued.merge(judged.drop_duplicates(["traj_id", "step_idx"]), on=["traj_id", "step_idx"])
            parts.append(steps.merge(labels, on=["traj_id", "step_idx"], how="left").assign(src=str(folder)))
    steps = pd.concat(parts, ignore_index=True).drop_duplicates("prompt")
    return steps.assign(good=steps.progress > 0, rule=steps.rule.fillna("?")).reset_index(drop=True)


def in_train_half(steps: pd.DataFrame, seed: int) -> np.ndarray:
    """(N,) bools: the step's game is in the train half (half of the games, drawn with `seed`)."""
    games = sorted(set(zip(steps.split, steps.problem_idx)))
    random.Random(seed).shuffle(games)
    train = set(games[: len(games) // 2])
    return np.array([g in train for g in zip(steps.split, steps.problem_idx)])


class Verdict:
    """The RM's constrained verdict on a step: log-odds of "1" against "-1" after prompt + opener."""

    def __init__(self, model_dir: Path):
        self.tokenizer = load_tokenizer(model_dir)
        self.model = load_model(model_dir, "float32")
        choice = verdict_choice(self.tokenizer)
        self.opener, self.plus, self.minus = choice.opener, choice.options[1][0], choice.options[-1][0]
        layers = self.model.config.num_hidden_layers
        self.picks = (layers // 3, 2 * layers // 3, layers)  # hidden_states[0] is the embedding

    def ids(self, prompt: str) -> torch.Tensor:
        return torch.tensor([self.tokenizer.encode(prompt, add_special_tokens=False) + self.opener])

    def __call__(self, prompt: str, states: bool = False):
        """-> log-odds (a 0-d tensor, with grad when enabled), and with `states` the hidden states
        at the verdict position of layers L/3, 2L/3 and L ((3, hidden) numpy)."""
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = self.model(self.ids(prompt), output_hidden_states=states)
        logits = out.logits[0, -1].float()
        odds = logits[self.plus] - logits[self.minus]
        if not states:
            return odds
        return odds, np.stack([out.hidden_states[k][0, -1].float().numpy() for k in self.picks])


def ranked(scores: np.ndarray, steps: pd.DataFrame) -> str:
    """The progress AUROC of `scores` on `steps` with its 95% interval, and per setback rule."""
    good = steps.good.to_numpy()
    low, high = auroc_interval(scores, good)
    parts = [f"AUROC {auroc(scores, good):.3f} [{low:.3f}, {high:.3f}] ({good.sum()} + / {(~good).sum()} -)"]
    for rule in SETBACK_RULES:
        pick = good | (steps.rule == rule).to_numpy()
        if (~good[pick]).sum():
            parts.append(f"vs {rule} {auroc(scores[pick], good[pick]):.3f}")
    return ", ".join(parts)


def scored(verdict: Verdict, steps: pd.DataFrame, states: bool = False):
    """Every step's verdict log-odds (N,), and with `states` the (N, 3, hidden) states."""
    odds, kept = [], []
    with torch.no_grad():
        for prompt in steps.prompt:
            out = verdict(prompt, states)
            odds.append(float(out[0] if states else out))
            if states:
                kept.append(out[1])
    return (np.array(odds), np.stack(kept)) if states else np.array(odds)


def probe(verdict: Verdict, steps: pd.DataFrame, train: np.ndarray, out: Path, states_file: Path | None) -> None:
    from sklearn.model_selection import GroupKFold

    if states_file:  # an earlier probe's passes over the same steps (the same EVAL_DIRs and seed)
        saved = np.load(states_file)
        odds, states = saved["odds"], saved["states"]
        if len(odds) != len(steps) or (saved["train"] != train).any():
            raise SystemExit(f"{states_file} holds other steps or halves than these EVAL_DIRs and --seed")
    else:
        start = time.perf_counter()
        odds, states = scored(verdict, steps, states=True)
        np.savez(out, odds=odds, states=states, good=steps.good.to_numpy(), train=train)
        print(f"   forward passes: {len(steps)} steps in {time.perf_counter() - start:.0f} s")
    test, good = steps[~train], steps.good.to_numpy()
    print(f"untrained RM, test half: {ranked(odds[~train], test)}; mean P(+1) {_p_plus(odds[~train]):.3f}")
    folds = list(GroupKFold(5).split(states[train], groups=steps.problem_idx.to_numpy()[train]))
    fits = {}
    for name, cols in [(f"layer {k}", [i]) for i, k in enumerate(verdict.picks)] + [("3 layers", [0, 1, 2])]:
        x = states[:, cols].reshape(len(steps), -1)
        fits[name] = _logistic(x[train], good[train], folds)
        score = fits[name].decision_function(x)
        fitted = auroc(score[train], good[train])
        print(f"probe on {name}: test half {ranked(score[~train], test)}; train half {fitted:.3f}")
    c = float(fits[f"layer {verdict.picks[2]}"][-1].C_[0])  # the last layer's, the one the verdict reads
    # how many labelled steps the last layer's readout needs: 5 draws of n train steps each, C as chosen above
    draws = np.flatnonzero(train)
    for n in (16, 32, 82, 164):
        found = []
        for seed in range(5):
            pick = np.random.default_rng(seed).choice(draws, size=min(n, len(draws)), replace=False)
            if good[pick].all() or not good[pick].any():
                continue
            fit = _logistic(states[pick, 2], good[pick], None, c)
            found.append(auroc(fit.decision_function(states[~train, 2]), good[~train]))
        shown = ", ".join(f"{a:.3f}" for a in found)
        print(f"probe on layer {verdict.picks[2]} from {n} train steps (C {c:.3g}): test half AUROC {shown}")


def _logistic(x: np.ndarray, y: np.ndarray, folds: list | None, c: float | None = None):
    """Standardised, class-balanced logistic regression: C by `folds` (AUROC), or `c` as given."""
    from sklearn.linear_model import LogisticRegression, LogisticRegressionCV
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    with warnings.catch_warnings():  # scikit-learn 1.9's notices of 1.10's new defaults
        warnings.simplefilter("ignore", FutureWarning)
        if c is None:
            head = LogisticRegressionCV(Cs=8, cv=folds, class_weight="balanced", max_iter=3000, scoring="roc_auc")
        else:
            head = LogisticRegression(C=c, class_weight="balanced", max_iter=3000)
        return make_pipeline(StandardScaler(), head).fit(x, y)


def _p_plus(odds: np.ndarray) -> float:
    return float(np.mean(1.0 / (1.0 + np.exp(-odds))))


def finetune(verdict: Verdict, fit: pd.DataFrame, test: pd.DataFrame, args: argparse.Namespace) -> None:
    model, fit = verdict.model, fit.reset_index(drop=True)
    good = fit.good.to_numpy()
    weight = class_balanced(np.ones(len(fit)), np.where(good, 1, -1), np.ones(len(fit), bool))  # classes n/2 each
    if args.train_top_layers:  # the loop's optim.train_top_layers: the rest frozen, its backward skipped
        train_top_layers(model, args.train_top_layers)
    params = [p for p in model.parameters() if p.requires_grad]
    optim = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.0)
    rows, order = [], list(range(len(fit)))
    for epoch in range(1, args.epochs + 1):
        random.Random(args.seed + epoch).shuffle(order)
        model.train()
        start, losses = time.perf_counter(), []
        for n, i in enumerate(order, 1):
            sign = 1.0 if good[i] else -1.0
            loss = weight[i] * verdict_loss(verdict(fit.prompt[i]), sign, args.loss) / PER_STEP
            loss.backward()
            losses.append(float(loss.detach()) * PER_STEP)
            if n % PER_STEP == 0 or n == len(order):
                torch.nn.utils.clip_grad_norm_(params, 1.0)
                optim.step()
                optim.zero_grad()
        model.eval()
        trained = time.perf_counter() - start
        if args.eval_epochs and epoch not in args.eval_epochs:
            print(f"epoch {epoch} ({trained:.0f} s, mean loss {np.mean(losses):.3f}): not tested")
            continue
        test_odds, train_odds = scored(verdict, test), scored(verdict, fit)
        print(
            f"epoch {epoch} ({trained:.0f} s, mean loss {np.mean(losses):.3f}): test half "
            f"{ranked(test_odds, test)}; mean P(+1) {_p_plus(test_odds):.3f}; train half {auroc(train_odds, good):.3f}"
        )
        rows.append(test[[*GAME, "step_idx", "rule", "good"]].assign(epoch=epoch, log_odds=test_odds))
        pd.concat(rows).to_csv(args.out, index=False)  # after each tested epoch: a stopped run keeps its rows


RM_TEMPERATURE = RewardModelConfig.model_fields["temperature"].default  # the loop's verdict draws


def verdict_loss(odds: torch.Tensor, sign: float, loss: str) -> torch.Tensor:
    """A verdict's loss against the label `sign` (±1), from its log-odds. `cross_entropy`: the
    log-loss of the two options, softplus(−sign · odds). `reward`: the loop's own objective taken
    in expectation instead of sampled, −E[sign · S] = −sign · (2p − 1) with p = P(S = +1) at the
    judge's sampling temperature T (the shipped `rm.temperature`). Its gradient in the odds,
    −2·sign·p(1 − p)/T, vanishes as p nears 0 or 1; the log-loss's, −sign·(1 − p) for a
    positive label, does not. Worked example: odds 4 (p 0.993 at T 0.8), sign −1: log-loss 4.02
    with gradient 0.98 in the odds; reward loss 0.987 with gradient 0.017."""
    if loss == "cross_entropy":
        return torch.nn.functional.softplus(-sign * odds)
    p = torch.sigmoid(odds / RM_TEMPERATURE)
    return -sign * (2 * p - 1)


def training_steps(steps: pd.DataFrame, train: np.ndarray, args: argparse.Namespace) -> pd.DataFrame:
    """What finetune trains on: the train half (a sample of `--train-limit` of it: as many as a
    loop's targets gave, quantity apart from noise), or the steps the `--train-runs`' sibling
    target valued, with its signs or (`--train-labels game`) the game's labels, no-ops left out."""
    fit = steps[train]
    if args.train_runs:
        fit = sibling_steps(args.train_runs)
        if args.train_labels == "game":  # the same prompts: the targets' noise apart from their situations
            fit = fit[fit.rule.isin(PROGRESS_RULES + SETBACK_RULES)]
            fit = fit.assign(good=fit.rule.isin(PROGRESS_RULES))
    elif args.train_limit:
        fit = fit.sample(n=min(args.train_limit, len(fit)), random_state=args.seed)
    source = f"the runs' valued steps, {args.train_labels} labels" if args.train_runs else "the train half"
    table = fit.groupby("good").rule.value_counts().unstack(fill_value=0).to_string().replace("\n", "\n   ")
    print(f"   trained on {len(fit)} distinct steps of {source}, by label (True: good):\n   {table}")
    return fit


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mode", choices=["probe", "finetune"])
    ap.add_argument("eval_dirs", type=Path, nargs="+")
    ap.add_argument("--rm", default="builtin:smollm2-135m-instruct")
    ap.add_argument("--seed", type=int, default=0, help="the draw of the games' halves and the update's order")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--lr", type=float, default=1e-5)
    ap.add_argument("--train-runs", type=Path, nargs="*", default=[], help="finetune on these runs' sibling targets")
    ap.add_argument("--train-labels", choices=["sibling", "game"], default="sibling", help="--train-runs' labels")
    ap.add_argument("--train-limit", type=int, default=0, help="finetune on a sample of this many train-half steps")
    ap.add_argument("--loss", choices=["cross_entropy", "reward"], default="cross_entropy", help="see verdict_loss")
    ap.add_argument("--train-top-layers", type=int, help="finetune only the last N decoder layers (the loop's option)")
    ap.add_argument("--eval-epochs", type=int, nargs="*", help="the epochs after which to test (default: each)")
    ap.add_argument("--states", type=Path, help="probe: the .npz an earlier probe of these steps wrote (no passes)")
    ap.add_argument("--limit", type=int, default=0, help="a sample of this many steps (a quick try); 0: all")
    ap.add_argument("--out", type=Path, required=True, help="probe: .npz of the states; finetune: .csv of scores")
    args = ap.parse_args()
    header(f"judge_capacity {args.mode}: the RM against the game's step labels, offline")
    print(f"   {cpu_line()}")
    steps = labelled_steps(args.eval_dirs)
    if args.limit:
        steps = steps.sample(n=min(args.limit, len(steps)), random_state=args.seed).reset_index(drop=True)
    train = in_train_half(steps, args.seed)
    counts = steps.groupby(train).rule.value_counts().unstack(fill_value=0)
    print(f"   {len(steps)} distinct steps of {steps.groupby(GAME).ngroups} games; by half (True: train):")
    print("   " + counts.to_string().replace("\n", "\n   "))
    verdict = Verdict(resolve_model_path(args.rm))
    if args.mode == "probe":
        probe(verdict, steps, train, args.out, args.states)
        return
    finetune(verdict, training_steps(steps, train, args), steps[~train], args)


if __name__ == "__main__":
    main()
