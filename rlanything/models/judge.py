"""The generative reward model judges every step m times (docs/method.md, "Step judgments").

Two verdict modes:
- `free` (the paper's): the RM writes its reasoning and its own \\boxed{±1}; the last box is
  parsed, anything else is unparseable (score 0, RM reward −2).
- `constrained` (for small models; our departure, as measured with SmolLM2-135M): the RM writes its
  reasoning, then we append `\\boxed{` and sample the verdict from the model's own
  probabilities of the token sequences "1" and "-1" (renormalised over the two), then `}`.
  The appended tokens are part of the response with the model's log-probs, so the RM update
  trains them like any other token; parse failures cannot happen. With no reasoning budget
  (rm.max_new_tokens 0) the verdict follows the prompt directly. Engines with `decodes_choices`
  (the transformers engine) append the verdict in the generation pass itself (a `Choice`: an EOS
  gives way to "\\boxed{", the option's uniform drawn from the row's own noise stream); engines
  that cannot (vLLM) score both options after the reasoning instead (`_constrained_verdicts`,
  uniforms from `random.Random(seed)`). Both draw the verdict with the one rule, `Choice.pick`.
  A direct verdict (no reasoning) is scored once per step, whatever the engine, and its m
  judgments drawn from that one scoring (`_direct_verdicts`).
"""

from __future__ import annotations

import random
from typing import Any

import torch

from rlanything.algo.parsing import extract_last_boxed, parse_step_score
from rlanything.models.engines.generation import Choice, Generation, GenerationEngine, PrefixCache
from rlanything.models.prompts import judge_messages, render, unit_test_messages


def _judge_prompt(tokenizer, step: dict[str, Any], hint: str) -> tuple[str, list[int]]:
    """A step's judge prompt (text, token ids), from its `judge_steps` dict."""
    parts = (step["task"], step["history"], step["response"], step["observation"], hint, step.get("shown_from", 0))
    return render(tokenizer, judge_messages(*parts))


def judge_steps(
    engine: GenerationEngine,
    tokenizer,
    steps: list[dict[str, Any]],
    *,
    judgments_per_step: int,
    verdict: str,
    max_new_tokens: int,
    temperature: float,
    top_p: float,
    seed: int,
    hint: str = "",
    prefix_cache: PrefixCache | None = None,
) -> list[dict]:
    """steps: dicts with traj_id, task_id, step_idx, task, history [(response, observation)],
    response, observation and optionally shown_from (the first shown step's index, when
    `rm.history_steps` left earlier ones out). -> one row per (step, judge_idx) for judgments.parquet.
    `prefix_cache`: a fresh one when None (given, its token counts can be read afterwards)."""
    if verdict not in ("free", "constrained"):
        raise ValueError(f"unknown verdict mode {verdict!r}")
    prompts = [_judge_prompt(tokenizer, s, hint) for s in steps]
    # later steps' prompts repeat earlier steps' history: the engine reuses their KV (PrefixCache)
    cache = prefix_cache if prefix_cache is not None else PrefixCache()
    sampling = dict(max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, seed=seed)
    judged = _judgments(engine, tokenizer, [ids for _, ids in prompts], judgments_per_step, verdict, sampling, cache)
    rows = []
    for n, (reasoning, response_ids, logprobs, score, raw_box, unchosen, p_plus) in enumerate(judged):
        k, j = divmod(n, judgments_per_step)
        step = steps[k]
        rows.append(
            {
                "traj_id": step["traj_id"],
                "task_id": step["task_id"],
                "step_idx": step["step_idx"],
                "judge_idx": j,
                "verdict_mode": verdict,
                "prompt": prompts[k][0],
                "reasoning": reasoning,
                "raw_box": raw_box,
                "step_score": score or 0,
                "parsed": score is not None,
                "prompt_ids": prompts[k][1],
                "response_ids": response_ids,
                "logprobs": logprobs,
                "unchosen_logprobs": unchosen,
                "p_plus": p_plus,
            }
        )
    return rows


def _judgments(engine, tokenizer, prompts, m: int, verdict: str, sampling: dict, cache: PrefixCache) -> list[tuple]:
    """The m judgments of each prompt, prompt-major: (reasoning, response ids, log-probs, score or
    None, raw box, the unchosen verdict's log-probs or None, P(+1) or None) each. `sampling`:
    max_new_tokens, temperature, top_p and seed."""
    temperature, seed = sampling["temperature"], sampling["seed"]
    choice = verdict_choice(tokenizer) if verdict == "constrained" else None
    if choice is not None and sampling["max_new_tokens"] == 0:  # a direct verdict: nothing to decode
        # the m judgments of a step share everything but the verdict: one scoring a step
        return _direct_verdicts(engine, choice, prompts, m, temperature, seed, cache)
    in_pass = choice is not None and engine.decodes_choices
    jobs = [prompt for prompt in prompts for _ in range(m)]
    gens = engine.generate(jobs, **sampling, prefix_cache=cache, choice=choice if in_pass else None)
    if in_pass:
        return [_decoded_verdict(tokenizer, gen, choice) for gen in gens]
    if choice is not None:  # engines without `decodes_choices`: the options scored afterwards
        return _constrained_verdicts(engine, tokenizer, choice, jobs, gens, temperature, seed, cache)
    return [
        (gen.text, gen.token_ids, gen.logprobs, parse_step_score(gen.text), extract_last_boxed(gen.text), None, None)
        for gen in gens
    ]


def write_unit_tests(
    engine: GenerationEngine,
    tokenizer,
    requests: list[tuple[str, str, tuple[str, str] | None]],
    *,
    tests_per_task: int,
    max_new_tokens: int,
    temperature: float,
    top_p: float,
    seed: int,
    prefix_cache: PrefixCache | None = None,
) -> list[dict]:
    """rm.role unit_tests: K = `tests_per_task` sampled replies for each (task_id, request,
    example: a solved (request, reply) pair or None) -> one row per (task, test_idx) with task_id, test_idx, prompt, response, prompt_ids,
    response_ids, logprobs (parsing and running them is the environment's: envs.unit_tests)."""
    prompts = [render(tokenizer, unit_test_messages(request, example)) for _, request, example in requests]
    jobs = [(k, j) for k in range(len(requests)) for j in range(tests_per_task)]
    gens = engine.generate(
        [prompts[k][1] for k, _ in jobs],
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        top_p=top_p,
        seed=seed,
        prefix_cache=prefix_cache if prefix_cache is not None else PrefixCache(),
    )
    return [
        {
            "task_id": requests[k][0],
            "test_idx": j,
            "prompt": prompts[k][0],
            "response": gen.text,
            "prompt_ids": prompts[k][1],
            "response_ids": gen.token_ids,
            "logprobs": gen.logprobs,
        }
        for (k, j), gen in zip(jobs, gens)
    ]


def verdict_choice(tokenizer) -> Choice:
    """The constrained verdict as a `Choice`: "\\n\\\\boxed{", then "1" or "-1", then "}"."""
    encode = lambda text: tokenizer.encode(text, add_special_tokens=False)  # noqa: E731
    options = {1: encode("1"), -1: encode("-1")}
    if options[1][0] == options[-1][0]:
        raise ValueError("constrained verdicts need '1' and '-1' to start with different tokens")
    return Choice(encode("\n\\boxed{"), options, encode("}"))


def chosen_tokens(response_ids: list[int], score: int, choice: Choice) -> list[bool]:
    """Which tokens of a constrained judgment's response the RM chose (`rm.train_forced_tokens`
    false trains only these): its reasoning and the option's first token; the opener, the rest
    of the option and the closer were appended, whatever the model's probabilities.

    response_ids: reasoning + opener + options[score] + closer -> (len(response_ids),) bools.
    With SmolLM2's tokens, no reasoning and the verdict -1: opener "\\n", "\\", "box", "ed",
    "{" (5), then "-", "1", then "}" -> [F, F, F, F, F, T, F, F]. Raises ValueError if the
    response does not end with that verdict (not a constrained judgment)."""
    option = choice.options[score]
    tail = choice.opener + option + choice.closer
    if len(response_ids) < len(tail) or list(response_ids[len(response_ids) - len(tail) :]) != tail:
        raise ValueError(f"the response does not end with the constrained verdict {score}: not a constrained judgment")
    reasoning = len(response_ids) - len(tail)
    return [True] * reasoning + [False] * len(choice.opener) + [True] + [False] * (len(option) - 1 + len(choice.closer))


def _decoded_verdict(tokenizer, gen: Generation, choice: Choice) -> tuple:
    """A verdict the engine decoded in the generation pass -> `_verdict`'s tuple (no unchosen
    log-probs, no P(+1): only the drawn option was scored). gen.token_ids: the reasoning (its EOS
    given way to the opener), then opener, option and closer."""
    tail = len(choice.opener) + len(choice.options[gen.choice]) + len(choice.closer)
    reasoning = tokenizer.decode(gen.token_ids[: len(gen.token_ids) - tail], skip_special_tokens=True)
    return _verdict(reasoning, gen.token_ids, gen.logprobs, gen.choice)


def _verdict(
    reasoning: str, response_ids: list[int], logprobs: list[float], score: int, unchosen=None, p_plus=None
) -> tuple:
    """-> (reasoning text ending in its verdict box, response ids, log-probs, score, raw box,
    `unchosen`: the other option's verdict log-probs where both were scored, else None, and
    `p_plus`: then P(+1) of the drawn options, else None)."""
    box = str(score)
    return reasoning + "\n\\boxed{" + box + "}", response_ids, logprobs, score, box, unchosen, p_plus


def _direct_verdicts(
    engine, choice: Choice, prompts: list[list[int]], m: int, temperature: float, seed: int, cache: PrefixCache
) -> list[tuple]:
    """A direct verdict (no reasoning) for each of the m judgments of each prompt, in `judge_steps`'
    job order (prompt-major). The m judgments of a prompt differ only in the drawn option, so
    each prompt is scored once with each option appended, and its m verdicts are m draws
    (`Choice.pick`, uniforms from `random.Random(seed)`) from those options' first-token
    probabilities; a judgment's log-probs are its option's scored ones. The same distribution
    and log-probs as m generations that decode the choice (up to float rounding), at the cost
    of one prompt instead of m (docs/judge.md, "Direct verdicts").
    Example (m 3, SmolLM2): prompts [P] -> scored P + "\\n\\boxed{1}" and P + "\\n\\boxed{-1}";
    first-token probabilities renormalised [0.25, 0.75]; uniforms 0.6, 0.1, 0.9 -> -1, 1, -1."""
    rng = random.Random(seed)
    out = []
    for rows, firsts in _scored_options(engine, choice, prompts, temperature, cache):
        p_plus = _p_plus(choice, firsts)
        for _ in range(m):
            score = choice.pick(firsts, rng.random())
            tail = choice.opener + choice.options[score] + choice.closer
            out.append(_verdict("", tail, rows[score], score, rows[-score], p_plus))
    return out


def _constrained_verdicts(
    engine, tokenizer, choice: Choice, prompts, gens, temperature: float, seed: int, cache: PrefixCache
) -> list[tuple]:
    """For each reasoning, draw the verdict from the options' first-token probabilities after an
    appended "\\boxed{" (`Choice.pick`, its uniforms from `random.Random(seed)`), for engines
    that cannot decode a `Choice` in the generation pass (vLLM): every option scored afterwards."""
    reasoning_ids = [[t for t in g.token_ids if t not in engine.eos_ids] for g in gens]
    contexts = [prompt + ids for prompt, ids in zip(prompts, reasoning_ids)]
    rng = random.Random(seed)
    out = []
    for gen, ids, (rows, firsts) in zip(
        gens, reasoning_ids, _scored_options(engine, choice, contexts, temperature, cache)
    ):
        score = choice.pick(firsts, rng.random())
        reasoning = tokenizer.decode(ids, skip_special_tokens=True)
        logprobs = gen.logprobs[: len(ids)] + rows[score]
        response = ids + choice.opener + choice.options[score] + choice.closer
        out.append(_verdict(reasoning, response, logprobs, score, rows[-score], _p_plus(choice, firsts)))
    return out


def _p_plus(choice: Choice, firsts: torch.Tensor) -> float:
    """P(+1) of the verdict `Choice.pick` draws from `firsts` (the options' first-token log-probs,
    `Choice.probabilities`). Example: log [0.2, 0.6] for {1, -1} -> 0.25."""
    return float(choice.probabilities(firsts)[list(choice.options).index(1)])


def _scored_options(engine, choice: Choice, contexts, temperature: float, cache: PrefixCache) -> list[tuple]:
    """Each context scored with each option's verdict appended (opener, option, closer) ->
    per context ({option value: the verdict's log-probs}, the options' first-token log-probs
    (K,) in `options`' order, float64, for `Choice.pick`). The first tokens are read right after
    "\\boxed{" ("1" vs "-" with SmolLM2's tokenizer); the rest of the verdict is forced.
    Comparing whole-sequence probabilities instead would favour the shorter spelling."""
    tails = [choice.opener + tokens + choice.closer for tokens in choice.options.values()]
    scored = engine.score(
        [context for context in contexts for _ in tails],
        [tail for _ in contexts for tail in tails],
        temperature=temperature,
        prefix_cache=cache,
    )
    k, out = len(tails), []
    for n in range(len(contexts)):
        rows = dict(zip(choice.options, scored[k * n : k * (n + 1)]))
        firsts = torch.tensor([logprobs[len(choice.opener)] for logprobs in rows.values()], dtype=torch.float64)
        out.append((rows, firsts))
    return out
