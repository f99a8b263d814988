"""A scripted *policy* for environment tests: a GenerationEngine whose replies come from a plan.

It drives `rlanything.agent.play.play` exactly like a model would (prompts in, texts with
token ids out), so the environment is exercised through the rollout task's own code path; the
environment itself is always the real one.
"""

from __future__ import annotations

from collections.abc import Callable

from rlanything.agent.play import play
from rlanything.envs import make_env
from rlanything.envs.verification import replay_outcome
from rlanything.models.engines.generation import Generation


def user_messages(prompt_text: str) -> list[str]:
    """The user turns (observations) of a rendered chat prompt, in order."""
    return [part.split("<|im_end|>")[0] for part in prompt_text.split("<|im_start|>user\n")[1:]]


def listed_commands(observation: str) -> list[str]:
    """The numbered commands of a text-game observation ("1. look" ...)."""
    lines = observation.split("Valid commands:\n", 1)[-1].splitlines()
    out = []
    for line in lines:
        head, _, command = line.partition(". ")
        if not head.isdigit():
            break
        out.append(command)
    return out


class ScriptedPolicy:
    """`reply(observations) -> response text`, called with the observations of one episode so far."""

    def __init__(self, tokenizer, reply: Callable[[list[str]], str]):
        self.tokenizer, self.reply = tokenizer, reply
        self.calls = 0

    def generate(self, prompts, *, max_new_tokens, temperature, top_p, seed, prefix_cache=None):
        out = []
        for ids in prompts:
            text = self.reply(user_messages(self.tokenizer.decode(ids)))
            tokens = self.tokenizer.encode(text, add_special_tokens=False)
            out.append(Generation(token_ids=tokens, logprobs=[0.0] * len(tokens), text=text, finish_reason="stop"))
        self.calls += 1
        return out

    def score(self, prompts, continuations, *, temperature):
        return [[0.0] * len(c) for c in continuations]


def plan_policy(tokenizer, plans: dict[str, list[str]]) -> ScriptedPolicy:
    """Reply `plans[first observation][turn]` (already formatted responses); "" past the plan's end."""

    def reply(observations: list[str]) -> str:
        plan = plans[observations[0]]
        turn = len(observations) - 1
        return plan[turn] if turn < len(plan) else "I do not know."

    return ScriptedPolicy(tokenizer, reply)


def tasks_of(specs: list[dict]) -> list[dict]:
    """Buffer-like task dicts for `play` (ids as the rollout task gives them)."""
    return [
        {"task_id": f"s{k:03d}v00", "slot": k, "version": 0, "spec": spec, "pending": False}
        for k, spec in enumerate(specs)
    ]


def play_and_verify(
    config, tokenizer, specs: list[dict], plans: dict[str, list[str]], max_steps: int, max_new_tokens: int = 32
) -> tuple[list[dict], list[dict], list[int]]:
    """`play` one rollout per spec with `plan_policy(plans)`, then the verify path's replay of
    every trajectory's actions in a fresh environment. -> (step rows, episodes, outcomes)."""
    rows, episodes = play(
        plan_policy(tokenizer, plans),
        tokenizer,
        lambda: make_env(config),
        tasks_of(specs),
        group_size=1,
        max_steps=max_steps,
        max_new_tokens=max_new_tokens,
        temperature=1.0,
        top_p=1.0,
        seed=0,
    )
    outcomes = []
    for ep in episodes:
        actions = [r["action"] for r in sorted(rows, key=lambda r: r["step_idx"]) if r["traj_id"] == ep["traj_id"]]
        outcomes.append(replay_outcome(config, specs[ep["traj_id"]], actions))
    return rows, episodes, outcomes
