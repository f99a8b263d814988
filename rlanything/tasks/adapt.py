"""Step 7: forge the environment (design.md §1, "Task adaptation").

First the pending rewrites rolled out this iteration are accepted or rejected by the
acceptance rule. Then every regular task whose accuracy left (α_low, α_high) and whose slot
has no pending rewrite gets a critic summary and up to `adapt.attempts` rewrites from the
environment model; the first that the environment parses and validates becomes the slot's
pending version for the next iteration. Everything, including invalid attempts and their
reasons, goes to adaptation.parquet; the buffer with full lineage to tasks/v(N+1).parquet.
"""

from __future__ import annotations

import json
from collections import Counter

import pandas as pd

from rlanything.algo.curriculum import adaptation_direction, task_accuracy
from rlanything.envs import env_class
from rlanything.models.adaptation import ModelRewriter, RuleRewriter, extractive_summary, failed_steps
from rlanything.models.engine import make_engine
from rlanything.models.loading import resolve_model_path
from rlanything.seeding import derive_seed
from rlanything.storage.buffer import add_pending, judge_pending, read_buffer, write_buffer
from rlanything.storage.parquet import read_table, write_table
from rlanything.storage.schemas import ADAPTATION, EPISODES, JUDGMENTS, OUTCOMES, ROLLOUTS
from rlanything.tasks.common import open_run, step_task


def first_valid(env_cls, env_config, spec: dict, answers: list[str]) -> tuple[dict | None, str, list[str]]:
    """-> (new spec or None, the answer it came from (or the last), the errors of the rest)."""
    errors = []
    for text in answers:
        try:
            new = env_cls.parse_rewrite(spec, text)
            env_cls.validate_spec(env_config, new)
            if new == spec:
                raise ValueError("the rewrite changes nothing")
            return new, text, errors
        except ValueError as err:
            errors.append(str(err)[:300])
    return None, answers[-1] if answers else "", errors


@step_task("adapt_tasks")
def adapt_tasks(run_dir: str, iteration: int):
    config, layout = open_run(run_dir)
    art = lambda name, schema: read_table(layout.artifact(iteration, name), schema)  # noqa: E731
    outcomes, judgments, steps = art("outcomes", OUTCOMES), art("judgments", JUDGMENTS), art("rollouts", ROLLOUTS)
    episodes = art("episodes", EPISODES)
    valid = outcomes[outcomes.valid]
    accuracy = task_accuracy(valid.outcome.to_numpy(), valid.task_id.to_numpy())
    counts = outcomes.groupby("task_id").size()
    low, high = config.algo.band
    before = read_buffer(layout.tasks_snapshot(iteration))
    buffer, judged = judge_pending(before, accuracy, iteration, low, high)
    rows = [{**_ids(before, j["task_id"]), "role": "pending", "num_rollouts": int(counts.get(j["task_id"], 0)),
             "attempts": 0, "direction": before.set_index("task_id").direction[j["task_id"]], **j}
            for j in judged]  # fmt: skip
    measured = buffer.task_id.map(accuracy)
    buffer["accuracy"] = measured.where(measured.notna(), buffer.accuracy)  # latest measurement

    regular = before[before.task_id.isin(set(outcomes[~outcomes.pending].task_id))]
    requests = []
    for task in regular.itertuples(index=False):
        acc = accuracy.get(task.task_id)
        direction = adaptation_direction(acc, low, high) if acc is not None else None
        row = {**_ids(before, task.task_id), "role": "regular", "accuracy": acc,
               "num_rollouts": int(counts[task.task_id]), "direction": direction, "attempts": 0}  # fmt: skip
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
        buffer = _rewrite(config, iteration, buffer, requests, outcomes, judgments, steps, episodes)

    paths = [
        write_table(pd.DataFrame(rows, columns=ADAPTATION.names), ADAPTATION, layout.artifact(iteration, "adaptation")),
        write_buffer(buffer, layout.tasks_snapshot(iteration + 1)),
    ]
    decisions = Counter(r["decision"] for r in rows)
    metrics = {f"adapt/{k}": decisions.get(k, 0) for k in
               ("in_band", "proposed", "no_valid_rewrite", "slot_busy", "accepted", "rejected")}  # fmt: skip
    for r in rows:
        if r["decision"] == "rejected":
            metrics[f"adapt/rejected_{r['reason']}"] = metrics.get(f"adapt/rejected_{r['reason']}", 0) + 1
    metrics["adapt/accepted_total"] = int((buffer.decision == "accepted").sum())
    return paths, metrics


def _ids(buffer: pd.DataFrame, task_id: str) -> dict:
    row = buffer[buffer.task_id == task_id].iloc[0]
    return {"task_id": task_id, "slot": int(row.slot), "version": int(row.version)}


def env_model_rewriter(config) -> ModelRewriter:
    """The environment model (section `env_model`: its own engine, device, dtype, batch size;
    not the policy's) built by `make_engine` like the policy's and the RM's."""
    section = config.env_model
    engine, tokenizer = make_engine(section, "env", resolve_model_path(section.model))
    return ModelRewriter(engine, tokenizer, section.max_new_tokens, section.temperature, section.top_p)


def _rewrite(config, iteration, buffer, requests, outcomes, judgments, steps, episodes) -> pd.DataFrame:
    """Critic summaries and rewrites for `requests` (adaptation rows, filled in place)."""
    env_cls = env_class(config.env.kind)
    model_rewriter = None
    if config.adapt.critic == "model" or config.adapt.rewriter == "model":
        model_rewriter = env_model_rewriter(config)
    for r in requests:
        of = lambda frame: frame[frame.task_id == r["task_id"]]  # noqa: E731
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
