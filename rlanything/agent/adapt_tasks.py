"""Step 7 (adapt_tasks), its decisions: which tasks are rewritten and which rewrites are kept.

First the pending rewrites rolled out this iteration are accepted or rejected by the
acceptance rule (`algo.curriculum.judge_rewrite`). Then every regular task whose accuracy left
(α_low, α_high) and whose slot has no pending rewrite gets a critic summary and up to
`adapt.attempts` rewrites from the environment model; the first that the environment parses
and validates becomes the slot's pending version for the next iteration. Every decision,
including invalid attempts and their reasons, is one adaptation row. The critic summaries and
rewrites themselves are written by models/rewriters.py.

Library code: the adapt_tasks task reads the iteration's Parquet files, calls `adapt`, and
writes adaptation.parquet and the next task-buffer snapshot. Here, not in models/, because it
joins the config, the environment model's engine (`make_engine`) and the environment class
(`env_cls`, passed in by the task).
"""

from __future__ import annotations

import json

import pandas as pd

from rlanything.algo.curriculum import adaptation_direction, judge_rewrite, task_accuracy
from rlanything.models.engines.make import make_engine
from rlanything.models.loading import resolve_model_path
from rlanything.models.rewriters import ModelRewriter, RuleFailure, RuleRewriter, extractive_summary, failed_steps
from rlanything.seeding import derive_seed
from rlanything.storage.buffer import add_pending, settle_pending


def first_valid(env_cls, env_config, spec: dict, answers: list[str]) -> tuple[dict | None, str, list[str]]:
    """-> (new spec or None, the answer it came from (or the last), the errors of the rest)."""
    errors = []
    for text in answers:
        if isinstance(text, RuleFailure):  # the rule's own reason, not "no \\boxed" about its text
            errors.append(text.reason[:300])
            continue
        try:
            new = env_cls.parse_rewrite(spec, text)
            env_cls.validate_spec(env_config, new)
            if new == spec:
                raise ValueError("the rewrite changes nothing")
            return new, text, errors
        except ValueError as err:
            errors.append(str(err)[:300])
    return None, answers[-1] if answers else "", errors


def judge_pending(
    buffer: pd.DataFrame, accuracy: dict[str, float], iteration: int, low: float, high: float
) -> tuple[pd.DataFrame, list[dict]]:
    """Accept or reject every pending version by the acceptance rule.

    -> (new buffer, one dict per judged version: task_id, accuracy, parent_accuracy, decision,
    reason). Accepted: the version becomes its slot's active one and the parent is retired."""
    judged = []
    for row in buffer[buffer.status == "pending"].itertuples(index=False):
        acc = accuracy.get(row.task_id)  # None: every rollout of it failed in the environment
        ok, reason = judge_rewrite(row.direction, float(row.parent_accuracy), acc, low=low, high=high)
        buffer = settle_pending(buffer, row.task_id, ok, reason, acc, iteration)
        judged.append(
            {
                "task_id": row.task_id,
                "accuracy": acc,
                "parent_accuracy": float(row.parent_accuracy),
                "decision": "accepted" if ok else "rejected",
                "reason": reason,
            }
        )
    return buffer.copy(), judged


def adapt(
    config,
    env_cls,
    iteration: int,
    before: pd.DataFrame,
    outcomes: pd.DataFrame,
    judgments: pd.DataFrame,
    steps: pd.DataFrame,
    episodes: pd.DataFrame,
    env_precision: str,
) -> tuple[list[dict], pd.DataFrame]:
    """One iteration's task adaptation from the buffer it started with (`before`) and its
    outcomes, judgments, rollouts and episodes, the environment model generating in `env_precision`
    (the run's resolved one) -> (adaptation rows, the next buffer)."""
    valid = outcomes[outcomes.valid]
    accuracy = task_accuracy(valid.outcome.to_numpy(), valid.task_id.to_numpy())
    counts = outcomes.groupby("task_id").size()
    low, high = config.algo.band
    buffer, judged = judge_pending(before, accuracy, iteration, low, high)
    rows = [
        {
            **_ids(before, j["task_id"]),
            "role": "pending",
            "num_rollouts": int(counts.get(j["task_id"], 0)),
            "attempts": 0,
            "direction": before.set_index("task_id").direction[j["task_id"]],
            **j,
        }
        for j in judged
    ]
    measured = buffer.task_id.map(accuracy)
    buffer["accuracy"] = measured.where(measured.notna(), buffer.accuracy)  # latest measurement

    regular = before[before.task_id.isin(set(outcomes[~outcomes.pending].task_id))]
    requests = []
    for task in regular.itertuples(index=False):
        acc = accuracy.get(task.task_id)
        direction = adaptation_direction(acc, low=low, high=high) if acc is not None else None
        row = {
            **_ids(before, task.task_id),
            "role": "regular",
            "accuracy": acc,
            "num_rollouts": int(counts[task.task_id]),
            "direction": direction,
            "attempts": 0,
        }
        slot_busy = ((buffer.slot == task.slot) & (buffer.status == "pending")).any()
        retired = buffer.loc[buffer.task_id == task.task_id, "status"].iloc[0] != "active"  # just replaced
        if direction is None:
            row["decision"] = "in_band"
        elif not config.adapt.enabled:
            row["decision"] = "disabled"
        elif slot_busy or retired:
            row["decision"] = "slot_busy"
        else:
            requests.append(row)
        rows.append(row)
    if requests:
        buffer = rewrite(
            config, env_cls, iteration, buffer, requests, outcomes, judgments, steps, episodes, env_precision
        )
    return rows, buffer


def _ids(buffer: pd.DataFrame, task_id: str) -> dict:
    row = buffer[buffer.task_id == task_id].iloc[0]
    return {"task_id": task_id, "slot": int(row.slot), "version": int(row.version)}


def environment_model(config, precision: str) -> ModelRewriter:
    """The environment model that writes critic summaries and rewrites: section `env_model` (its
    own engine, device, batch size; not the policy's) in `precision` (the run's resolved one),
    built by `make_engine` like the policy's and the RM's."""
    section = config.env_model
    engine, tokenizer = make_engine(section, "env", resolve_model_path(section.model), precision)
    return ModelRewriter(engine, tokenizer, section.max_new_tokens, section.temperature, section.top_p)


def rewrite(
    config, env_cls, iteration, buffer, requests, outcomes, judgments, steps, episodes, env_precision: str
) -> pd.DataFrame:
    """Critic summaries and rewrites for `requests` (adaptation rows, filled in place); each
    valid rewrite is added to the buffer as its slot's pending version -> the new buffer."""
    model_rewriter = None
    if config.adapt.critic == "model" or config.adapt.rewriter == "model":
        model_rewriter = environment_model(config, env_precision)
    for r in requests:
        of = lambda frame, task_id=r["task_id"]: frame[frame.task_id == task_id]  # noqa: E731
        r["spec"] = json.loads(buffer[buffer.task_id == r["task_id"]].spec.iloc[0])
        r["task"] = of(episodes).first_observation.iloc[0]
        r["items"] = failed_steps(of(outcomes), of(judgments), of(steps), config.adapt.critic_steps)
        r["instructions"] = env_cls.rewrite_instructions(r["spec"], r["direction"])
    if config.adapt.critic == "model":
        seed = derive_seed(config.run.seed, iteration, "critic")
        summaries = model_rewriter.summarise([r["task"] for r in requests], [r["items"] for r in requests], seed)
    else:
        summaries = [extractive_summary(r["items"]) for r in requests]
    for r, summary in zip(requests, summaries):
        r["critic_summary"] = summary
    rewriter = model_rewriter if config.adapt.rewriter == "model" else RuleRewriter(env_cls)
    answers = rewriter.propose(requests, config.adapt.attempts, derive_seed(config.run.seed, iteration, "rewrite"))
    for r, texts in zip(requests, answers):
        new, text, errors = first_valid(env_cls, config.env, r["spec"], texts)
        r.update(rewrite=text, attempts=len(errors) + (new is not None), reason="; ".join(errors) or None)
        if new is None:
            r["decision"] = "no_valid_rewrite"
            continue
        buffer, r["candidate_id"] = add_pending(
            buffer, r["task_id"], new, r["direction"], r["critic_summary"], r["accuracy"], iteration
        )
        r["candidate_spec"], r["decision"] = json.dumps(new, sort_keys=True), "proposed"
    for r in requests:
        for key in ("spec", "task", "items", "instructions"):
            r.pop(key)
    return buffer
