r"""The reward model on held-out episodes: does the RM of a checkpoint predict the outcomes of
greedy episodes it never trained on? (`rlanything eval`, `eval.rm`)

In training, the RM's outcome accuracy (rm/outcome_accuracy, logged by the advantages step) is
measured on the iteration's own rollouts: the samples it is then trained on. Here the RM of the
evaluated checkpoint (checkpoints/rm/iter_NNNN; for `@base` and a bare model the config's rm
model) judges every step of every valid held-out episode m = rm.judgments_per_step times, exactly
as the rm_score step does: `agent.judging.steps_to_judge` gives each step its context (the task,
the earlier steps), `models.judge.judge_steps` prompts, samples (rm.verdict, rm.temperature,
rm.top_p) and parses, and the seed derives from (run.seed, iteration, "eval_rm", split) as
rm_score's does from (run.seed, iteration, "rm_score"), so an evaluation repeats exactly.
`outcome_prediction` then scores the judgments against the episodes' outcomes, per split, and
where the environment labels steps (TextWorld: closer / unchanged / farther / lost / invalid;
`held_out_labels`), `process_accuracy` and `process_auroc` score them against the labels. Those
count the steps *before* an episode's last one: a won game's last step shows the game's win
message, which a judge reads off without judging the step, so the last steps are reported apart
(rm_last_*). `verdict_shares` says what the RM answers per outcome and per label.

An invalid episode (its environment or verifier failed) has no outcome and is not judged, as in
training. An RM that writes unit tests (rm.role unit_tests) judges no step: nothing is measured.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path

import pandas as pd

from rlanything.agent.advantage_rows import p_plus_mean, p_plus_scores
from rlanything.agent.judging import judge_as_configured, steps_to_judge
from rlanything.algo.rm_accuracy import (
    outcome_prediction,
    process_accuracy,
    process_auroc,
    progress_auroc,
    verdict_shares,
)
from rlanything.envs.verification import label_episode
from rlanything.models.engines.make import make_engine
from rlanything.progress import progress
from rlanything.seeding import derive_seed
from rlanything.storage.parquet import write_table
from rlanything.storage.schemas import EVAL_JUDGMENTS, EVAL_STEP_LABELS


def judge_seed(run_seed: int, iteration: int | None, split: str) -> int:
    """The RM's sampling seed for one split of one evaluation (a bare model: as the base, -1)."""
    return derive_seed(run_seed, -1 if iteration is None else iteration, "eval_rm", split)


def judge_split(
    config, weights: Path, label: str, contexts: list[dict], split: str, iteration, out: Path, precision: str
) -> Path:
    """The RM in `weights` (named `label`) judges `contexts` (`agent.judging.steps_to_judge` rows
    of one split's valid episodes, traj_id = problem_idx) m times each, with the settings of
    `config.rm`, in `precision` -> `out` (EVAL_JUDGMENTS)."""
    m = config.rm.judgments_per_step
    judged = []
    if contexts:  # no valid episode: no RM to load
        with progress(f"eval {split}: RM judgments", len(contexts) * m) as advance:
            engine, tokenizer = make_engine(config.rm, "rm", weights, precision, advance)
            judged = judge_as_configured(
                engine, tokenizer, contexts, config, judge_seed(config.run.seed, iteration, split)
            )
    return write_table(judgment_rows(judged, split, iteration, label), EVAL_JUDGMENTS, out)


def judgment_rows(judged: list[dict], split: str, iteration: int | None, weights: str) -> list[dict]:
    """`judge_steps` rows -> EVAL_JUDGMENTS rows."""
    return [
        {
            "split": split,
            "problem_idx": row["traj_id"],
            "step_idx": row["step_idx"],
            "judge_idx": row["judge_idx"],
            "verdict_mode": row["verdict_mode"],
            "prompt": row["prompt"],
            "reasoning": row["reasoning"],
            "raw_box": row["raw_box"],
            "step_score": row["step_score"],
            "parsed": row["parsed"],
            "prompt_tokens": len(row["prompt_ids"]),
            "response_tokens": len(row["response_ids"]),
            "p_plus": row["p_plus"],
            "weights": weights,
            "iteration": iteration,
        }
        for row in judged
    ]


def held_out_labels(env_config, episodes: pd.DataFrame, split: str, out: Path) -> Path | None:
    """The environment's label of every step of `split`'s valid `episodes` (EVAL_EPISODES rows:
    spec, actions) -> `out` (EVAL_STEP_LABELS); None, and nothing written, where the environment
    labels no step. An episode whose replay fails has no labels (logged), as in training."""
    rows = []
    for ep in episodes.itertuples(index=False):
        outcome = {"valid": ep.valid, "pending": False, "traj_id": ep.problem_idx, "task_id": split}
        try:
            labelled = label_episode(env_config, outcome, ep.spec, list(ep.actions))
        except Exception as err:  # labels only measure the RM: a failure costs this episode's labels
            logging.getLogger(__name__).warning("step labels of %s episode %d: %r", split, ep.problem_idx, err)
            continue
        if labelled is None:
            return None
        last = ep.num_steps - 1
        rows += [
            {
                "split": split,
                "problem_idx": r["traj_id"],
                "step_idx": r["step_idx"],
                "label": r["label"],
                "rule": r["rule"],
                "last": r["step_idx"] == last,
            }
            for r in labelled
        ]
    return write_table(rows, EVAL_STEP_LABELS, out)


def process_measures(judged: pd.DataFrame, labels: pd.DataFrame) -> dict[str, float]:
    """The RM's process accuracy and AUROC of one split's `judged` steps (EVAL_JUDGMENTS rows)
    against `labels` (EVAL_STEP_LABELS rows), on the steps before each episode's last and, apart,
    on the last steps; and on the steps before the last, the progress AUROC (`progress_auroc`:
    progress steps against setbacks, no-ops apart) -> `PROCESS_MEASURES`; NaN where no judged
    step has a label."""
    out = {}
    columns = (judged.problem_idx.to_numpy(), judged.step_idx.to_numpy())
    scores = (judged.step_score.to_numpy(), judged.parsed.to_numpy())
    for prefix, part in (("rm_process", labels[~labels["last"]]), ("rm_last", labels[labels["last"]])):
        truth = dict(zip(zip(part.problem_idx.tolist(), part.step_idx.tolist()), part.label.tolist()))
        accuracy = process_accuracy(*columns, *scores, truth)
        ranking = process_auroc(*columns, *scores, truth)
        out |= {
            f"{prefix}_accuracy": accuracy["process_accuracy"],
            f"{prefix}_auroc": ranking["auroc"],
            f"{prefix}_auroc_low": ranking["auroc_low"],
            f"{prefix}_auroc_high": ranking["auroc_high"],
            f"{prefix}_good": ranking["good"],
            f"{prefix}_bad": ranking["bad"],
        }
    early = labels[~labels["last"]]
    rules = dict(zip(zip(early.problem_idx.tolist(), early.step_idx.tolist()), early.rule.tolist()))
    progress = progress_auroc(*columns, *scores, rules)
    out |= {f"rm_progress_{k}": progress[k] for k in ("auroc", "auroc_low", "auroc_high", "good", "bad")}
    known = p_plus_scores(judged)
    by_p = progress_auroc(*(known[c].to_numpy() for c in ("problem_idx", "step_idx", "step_score", "parsed")), rules)
    out |= {f"rm_progress_p_{k}": by_p[k] for k in ("auroc", "auroc_low", "auroc_high")}
    out |= {"rm_unchanged_steps": progress["neutral"], "rm_unchanged_mean": progress["neutral_mean"]}
    return out


PROCESS_MEASURES = (
    *(
        f"{prefix}_{m}"
        for prefix in ("rm_process", "rm_last")
        for m in ("accuracy", "auroc", "auroc_low", "auroc_high", "good", "bad")
    ),
    *(f"rm_progress_{m}" for m in ("auroc", "auroc_low", "auroc_high", "good", "bad")),
    *(f"rm_progress_p_{m}" for m in ("auroc", "auroc_low", "auroc_high")),
    "rm_unchanged_steps",
    "rm_unchanged_mean",
)
"""`process_measures`' keys: rm_process_* on the steps before an episode's last (labels ±1, an
admissible no-op counted good: the old figure), rm_last_* on the last steps; good / bad: how many
labelled judged steps had label +1 / −1. rm_progress_* on the steps before the last: progress
steps (good: `closer`) against setbacks (bad: `farther`, `invalid`, `lost`), the headline; the
no-ops (`unchanged`) apart: how many were judged and their mean verdict. rm_progress_p_*: the same
ranking of the judge's P(+1) where both verdicts were scored (judgments.p_plus; NaN without it)."""


def outcome_before_last(episodes: pd.DataFrame, judged: pd.DataFrame) -> dict[str, float]:
    """`outcome_prediction` of one split's episodes from the mean verdict over their steps before
    the last (the win message left out: a judge that only reads it scores 1/2 here) ->
    rm_outcome_before_last_auroc with its interval, and how many episodes had such a step."""
    last = dict(zip(episodes.problem_idx, episodes.num_steps - 1))
    early = judged[judged.step_idx.to_numpy() < judged.problem_idx.map(last).to_numpy()]
    prediction = outcome_prediction(
        early.problem_idx.to_numpy(),
        early.step_idx.to_numpy(),
        early.step_score.to_numpy(),
        early.parsed.to_numpy(),
        dict(zip(episodes.problem_idx, episodes.outcome)),
    )
    return {
        "rm_outcome_before_last_auroc": prediction["auroc"],
        "rm_outcome_before_last_auroc_low": prediction["auroc_low"],
        "rm_outcome_before_last_auroc_high": prediction["auroc_high"],
        "rm_judged_before_last": prediction["trajectories"],
    }


def shares_of(judged: pd.DataFrame, episodes: pd.DataFrame, labels: pd.DataFrame | None) -> dict[str, list]:
    """`verdict_shares` of one split's judgments grouped by their episode's outcome ("episode
    won", "episode lost") and by their step's label rule ("closer", ...; an episode's last step as
    "last step closer", ...) -> group -> [share of +1, parsed judgments]."""
    outcome = dict(zip(episodes.problem_idx, episodes.outcome))
    by_outcome = judged.problem_idx.map(lambda p: "episode won" if outcome.get(p) == 1 else "episode lost")
    shares = verdict_shares(judged.step_score.to_numpy(), judged.parsed.to_numpy(), by_outcome.to_numpy())
    if labels is not None and len(labels):
        rule = {(r.problem_idx, r.step_idx): ("last step " if r.last else "") + r.rule for r in labels.itertuples()}
        keys = [rule.get(k, "unlabelled") for k in zip(judged.problem_idx, judged.step_idx)]
        shares |= verdict_shares(judged.step_score.to_numpy(), judged.parsed.to_numpy(), pd.Series(keys).to_numpy())
    return {k: [share, n] for k, (share, n) in shares.items()}


def rm_measures(
    episodes: pd.DataFrame, judgments: pd.DataFrame, labels: pd.DataFrame | None = None
) -> dict[str, dict[str, float]]:
    """split -> `metric_names.RM_MEASURES`, from eval episodes (split, problem_idx, outcome, num_steps) and their judgments
    (EVAL_JUDGMENTS), and with the environment's step `labels` (EVAL_STEP_LABELS) also
    `PROCESS_MEASURES` and "rm_verdict_shares" (`shares_of`). Rates are NaN where nothing was judged, the AUROC also where a split's
    judged episodes share one outcome, its 95% interval (`algo.rm_accuracy.auroc_interval`) where
    fewer than 10 of them were solved or unsolved (rm_solved_judged, rm_unsolved_judged).

    >>> episodes = pd.DataFrame({"split": ["ood"] * 2, "problem_idx": [0, 1], "outcome": [1, -1], "num_steps": [1, 1]})
    >>> judgments = pd.DataFrame({"split": ["ood"] * 4, "problem_idx": [0, 0, 1, 1],
    ...     "step_idx": [0] * 4, "step_score": [1, 1, 0, -1], "parsed": [True, True, False, True]})
    >>> m = rm_measures(episodes, judgments)["ood"]
    >>> m["rm_outcome_accuracy"], m["rm_outcome_auroc"], m["rm_score_gap"], m["rm_judged"], m["rm_parse_rate"]
    (1.0, 1.0, 0.0, 2, 0.75)
    >>> m["rm_outcome_auroc_low"], m["rm_solved_judged"], m["rm_unsolved_judged"]  # 1 and 1: too few
    (nan, 1, 1)
    """
    out = {}
    for split, eps in episodes.groupby("split"):
        judged = judgments[judgments.split == split]
        prediction = outcome_prediction(
            judged.problem_idx.to_numpy(),
            judged.step_idx.to_numpy(),
            judged.step_score.to_numpy(),
            judged.parsed.to_numpy(),
            dict(zip(eps.problem_idx, eps.outcome)),
        )
        out[split] = {
            "rm_step_accuracy": prediction["step_accuracy"],
            "rm_outcome_accuracy": prediction["trajectory_accuracy"],
            "rm_outcome_auroc": prediction["auroc"],
            "rm_outcome_auroc_low": prediction["auroc_low"],
            "rm_outcome_auroc_high": prediction["auroc_high"],
            "rm_score_gap": prediction["score_gap"],
            "rm_judged": prediction["trajectories"],
            "rm_solved_judged": prediction["positives"],
            "rm_unsolved_judged": prediction["negatives"],
            "rm_parse_rate": float(judged.parsed.mean()) if len(judged) else math.nan,
        }
        out[split] |= outcome_before_last(eps, judged)
        out[split]["rm_p_plus_mean"] = p_plus_mean(judged)
        mine = None if labels is None else labels[labels.split == split]
        if mine is not None:
            out[split] |= process_measures(judged, mine)
        out[split]["rm_verdict_shares"] = shares_of(judged, eps, mine)
    return out


def eval_contexts(episodes: pd.DataFrame, steps: pd.DataFrame, history_steps: int | None) -> list[dict]:
    """What the RM judges in an evaluation: the rm_score step's contexts (`steps_to_judge`) of one
    split's valid `episodes` (EVAL_EPISODES) and their `steps` (EVAL_STEPS), traj_id = problem_idx."""
    frame = episodes.rename(columns={"problem_idx": "traj_id"}).assign(pending=False)
    return steps_to_judge(steps.rename(columns={"problem_idx": "traj_id"}), frame, frame, history_steps)
