"""Chat prompts of the policy and of the generative reward model.

The policy sees the environment's instructions, then alternating observations and its own
earlier responses: a multi-turn chat whose rendered tokens are exactly the context of a step.
The RM sees the task, the history up to the step, the step's response and the next
observation, and must end with \\boxed{1} or \\boxed{-1} (docs/method.md). The policy's prompt
carries a worked example only where the environment gives one (`example`: reasoning-gym's
`worked_example`, one solved problem; a text game's, one won episode of another game, turn by
turn): an example of the same kind of problem, whose answer differs, so copying it fails.
"""

from __future__ import annotations

from collections.abc import Sequence

JUDGE_SYSTEM = (
    "You are a careful reward model. You judge ONE step of an agent solving a task. "
    "Think briefly about whether this step is correct and helps solve the task. "
    "Then end your reply with \\boxed{1} if the step is good, or \\boxed{-1} if it is bad."
)


UNIT_TEST_SYSTEM = (
    "You are a careful reward model for programming problems. You write unit tests that a correct "
    "solution passes and a wrong one fails."
)


def policy_messages(
    system_prompt: str,
    observations: list[str],
    responses: list[str],
    example: Sequence[tuple[str, str]] | None = None,
) -> list[dict]:
    """observations[k] precedes responses[k]; len(observations) == len(responses) + 1;
    `example`, the (observation, answer) turns of a solved problem, comes first as alternating
    user and assistant turns."""
    assert len(observations) == len(responses) + 1
    messages = [{"role": "system", "content": system_prompt}]
    for shown, answer in example or ():
        messages += [{"role": "user", "content": shown}, {"role": "assistant", "content": answer}]
    for k, obs in enumerate(observations):
        messages.append({"role": "user", "content": obs})
        if k < len(responses):
            messages.append({"role": "assistant", "content": responses[k]})
    return messages


def judge_messages(
    task: str, history: list[tuple[str, str]], response: str, observation: str, hint: str = "", shown_from: int = 0
) -> list[dict]:
    """history: (response, observation) pairs of the steps before the judged one, the first of
    them the episode's step `shown_from` (0-based; the earlier ones are not shown:
    `rm.history_steps`); `hint` is the environment's word on what a good step looks like."""
    parts = [f"## Task\n{task}"]
    if shown_from:
        parts.append(f"## Steps 1-{shown_from}\n(not shown)")
    for k, (resp, obs) in enumerate(history, start=shown_from):
        parts.append(f"## Step {k + 1}\nAgent: {resp}\nEnvironment: {obs or '(nothing)'}")
    parts.append(f"## Step to judge (step {shown_from + len(history) + 1})\nAgent: {response}")
    parts.append(f"## What happened next\n{observation or '(the episode ended)'}")
    parts.append("Is this step good? Think, then answer \\boxed{1} or \\boxed{-1}.")
    system = f"{JUDGE_SYSTEM} {hint}".strip()
    return [{"role": "system", "content": system}, {"role": "user", "content": "\n\n".join(parts)}]


def unit_test_messages(request: str, example: tuple[str, str] | None = None) -> list[dict]:
    """The RM asked for one unit test (rm.role unit_tests); `request` from
    `envs.unit_tests.unit_test_request` (the problem and the test's form), `example` a solved
    (request, reply) pair shown first as a user and an assistant turn."""
    messages = [{"role": "system", "content": UNIT_TEST_SYSTEM}]
    if example is not None:
        messages += [{"role": "user", "content": example[0]}, {"role": "assistant", "content": example[1]}]
    return messages + [{"role": "user", "content": request}]


def render(tokenizer, messages: list[dict]) -> tuple[str, list[int]]:
    """The prompt text with the generation header, and its token ids (no extra BOS)."""
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return text, tokenizer.encode(text, add_special_tokens=False)
