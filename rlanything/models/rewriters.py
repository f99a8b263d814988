"""What step 7's rewriters write: the critic summary of a task's failures, and the task's rewrite.
Which tasks are rewritten and which rewrites are kept is decided in agent/adapt_tasks.py.

Critic summary (docs/method.md): for each failed trajectory, the steps that all m judgments
scored −1, with the RM's reasoning there. `extractive_summary` lists them verbatim (short);
the environment model can instead summarise them in a few sentences.

Rewriting: the environment model gets the task as the policy saw it, the environment's own
rewrite instructions (what may change, the answer format), the direction and the critic
summary, and answers; the environment parses and validates the answer (`parse_rewrite`,
`validate_spec`). `ModelRewriter` is the environment model doing both jobs; `RuleRewriter`
writes the environment's deterministic rewrite in the same format, for runs whose model cannot
yet follow the format (our addition, `adapt.rewriter: rule`).
"""

from __future__ import annotations

import pandas as pd

from rlanything.models.engines.generation import GenerationEngine
from rlanything.models.prompts import render

SNIPPET = 240  # characters of one RM reasoning kept in an extractive summary


def failed_steps(outcomes: pd.DataFrame, judgments: pd.DataFrame, steps: pd.DataFrame, limit: int) -> list[dict]:
    """Steps of failed trajectories that every judgment scored −1, with the RM's reasoning.

    outcomes/judgments/steps: one task's rows of outcomes.parquet, judgments.parquet and
    rollouts.parquet -> up to `limit` dicts {traj_id, step_idx, response, reasons}."""
    failed = set(outcomes[(outcomes.outcome == -1) & outcomes.valid].traj_id)
    judged = judgments[judgments.traj_id.isin(failed)]
    out = []
    for (traj_id, step_idx), group in judged.groupby(["traj_id", "step_idx"], sort=True):
        if (group.step_score == -1).all():
            row = steps[(steps.traj_id == traj_id) & (steps.step_idx == step_idx)].iloc[0]
            out.append(
                {
                    "traj_id": int(traj_id),
                    "step_idx": int(step_idx),
                    "response": row.response,
                    "reasons": list(group.sort_values("judge_idx").reasoning),
                }
            )
        if len(out) == limit:
            break
    return out


def extractive_summary(items: list[dict]) -> str:
    """The failed steps and the RM's first reason for each, verbatim and clipped."""
    if not items:
        return "No step of a failed attempt was judged wrong by every judgment."
    lines = []
    for item in items:
        reason = " ".join(item["reasons"][0].split())[:SNIPPET]
        answer = " ".join(item["response"].split())[:SNIPPET]
        lines.append(f"- step {item['step_idx'] + 1}: the agent wrote «{answer}»; the judge said: {reason}")
    return "\n".join(lines)


def critic_messages(task: str, items: list[dict]) -> list[dict]:
    prompt = (
        f"An agent attempted this task and failed:\n{task}\n\nSteps a judge found wrong, with the judge's "
        f"reasoning:\n{extractive_summary(items)}\n\nSummarise in at most three sentences what the agent "
        "gets wrong on this task."
    )
    return [{"role": "user", "content": prompt}]


def rewrite_messages(task: str, instructions: str, direction: str, critic_summary: str) -> list[dict]:
    why = "The agent solves it too often." if direction == "harder" else "The agent almost never solves it."
    prompt = (
        f"You design training tasks for an agent. Current task, as the agent sees it:\n{task}\n\n"
        f"{why} What a critic saw in the agent's attempts:\n{critic_summary}\n\n"
        f"Rewrite the task to make it {direction}, keeping it solvable and checkable.\n{instructions}"
    )
    return [{"role": "user", "content": prompt}]


class ModelRewriter:
    def __init__(
        self, engine: GenerationEngine, tokenizer, max_new_tokens: int, temperature: float, top_p: float = 1.0
    ):
        self.engine, self.tokenizer = engine, tokenizer
        self.kw = {"max_new_tokens": max_new_tokens, "temperature": temperature, "top_p": top_p}

    def summarise(self, tasks: list[str], items: list[list[dict]], seed: int) -> list[str]:
        prompts = [render(self.tokenizer, critic_messages(t, i))[1] for t, i in zip(tasks, items)]
        return [g.text.strip() for g in self.engine.generate(prompts, seed=seed, **self.kw)] if prompts else []

    def propose(self, requests, attempts, seed):
        prompts = [
            render(self.tokenizer, rewrite_messages(r["task"], r["instructions"], r["direction"], r["critic_summary"]))[
                1
            ]
            for r in requests
            for _ in range(attempts)
        ]
        texts = [g.text for g in self.engine.generate(prompts, seed=seed, **self.kw)] if prompts else []
        return [texts[k * attempts : (k + 1) * attempts] for k in range(len(requests))]


class RuleFailure(str):
    """The text of a rule rewrite that could not be made ("(no rule rewrite: <why>)"); its
    `reason` is recorded as the attempt's error, not the parse error its text would give."""

    def __new__(cls, reason: str):
        text = super().__new__(cls, f"(no rule rewrite: {reason})")
        text.reason = reason
        return text


class RuleRewriter:
    """The environment's deterministic rewrite; an error becomes the attempt's text, a
    `RuleFailure` (and so a recorded, rejected candidate whose reason is the rule's)."""

    def __init__(self, env_cls):
        self.env_cls = env_cls

    def propose(self, requests, attempts, seed):
        out = []
        for r in requests:
            try:
                out.append([self.env_cls.rule_rewrite(r["spec"], r["direction"])])
            except ValueError as err:
                out.append([RuleFailure(str(err))])
        return out
