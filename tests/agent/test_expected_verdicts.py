"""algo.rm_verdicts expected: a judged step's two direct verdicts, trained with the judge's own
probabilities of them, give the exact gradient of the paid reward in expectation (a tiny random
judge, its real judgments and the trainer's own loss)."""

import math
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest
import torch

from rlanything.agent.update_data import expected_verdict_samples
from rlanything.models.engines.transformers_engine import TransformersEngine
from rlanything.models.judge import judge_steps, verdict_choice
from rlanything.models.loading import load_model
from rlanything.models.training.trainer import _micro_batch_loss, teacher_forced_logprobs

T = 0.8
STEPS = [
    {"traj_id": 0, "task_id": "a", "step_idx": 0, "task": "Go north.", "history": [], "response": "go north",
     "observation": "You are in the kitchen."},
    {"traj_id": 1, "task_id": "a", "step_idx": 2, "task": "Take the key.", "history": [("look", "A key.")],
     "response": "take key", "observation": "Taken."},
]  # fmt: skip
PAYOFF = {0: 1.5, 1: -1.0}  # a of each trajectory's step: its R (or progress sign) times a class weight


@pytest.fixture(scope="module")
def judged(tiny_model_path, tiny_tokenizer):
    """The tiny judge's direct verdicts of STEPS, m = 3, each kept with advantage a*S_j."""
    model = load_model(tiny_model_path)
    engine = TransformersEngine(model, tiny_tokenizer, batch_size=4)
    rows = judge_steps(
        engine, tiny_tokenizer, STEPS, judgments_per_step=3, verdict="constrained", max_new_tokens=0,
        temperature=T, top_p=1.0, seed=3,
    )  # fmt: skip
    frame = pd.DataFrame(rows)
    frame["advantage"] = frame.traj_id.map(PAYOFF) * frame.step_score
    return model, engine, frame


def plus_probability(engine, prompt, choice) -> float:
    """P(+1) renormalised over the two options' first tokens, from a teacher-forced pass."""
    first = [
        engine.score([prompt], [choice.opener + choice.options[v]], temperature=T)[0][len(choice.opener)]
        for v in (1, -1)
    ]
    return 1 / (1 + math.exp(first[1] - first[0]))


def test_a_judgment_records_the_unchosen_verdicts_log_probs(judged, tiny_tokenizer):
    _, engine, frame = judged
    choice = verdict_choice(tiny_tokenizer)
    for r in frame.itertuples():
        other = choice.opener + choice.options[-r.step_score] + choice.closer
        scored = engine.score([list(r.prompt_ids)], [other], temperature=T)[0]
        assert r.unchosen_logprobs == pytest.approx(scored, abs=1e-4)


def test_a_judgment_records_the_judges_p_plus_the_draws_probability(judged, tiny_tokenizer):
    """judgments.p_plus: P(+1) over the two options' first tokens, teacher-forced on its own; the
    m judgments of a step share it, and it equals the one read from their two recorded log-probs."""
    _, engine, frame = judged
    choice = verdict_choice(tiny_tokenizer)
    first = len(choice.opener)
    for _, rows in frame.groupby("traj_id"):
        assert rows.p_plus.nunique() == 1
        r = rows.iloc[0]
        assert r.p_plus == pytest.approx(plus_probability(engine, list(r.prompt_ids), choice), abs=1e-4)
        own, other = r.logprobs[first], r.unchosen_logprobs[first]
        logit = own - other if r.step_score == 1 else other - own
        assert r.p_plus == pytest.approx(1 / (1 + math.exp(-logit)), abs=1e-6)


def test_each_step_trains_both_verdicts_decision_tokens_weighted_by_the_judges_probabilities(judged, tiny_tokenizer):
    """Two samples a step, +1 then -1: the step's prompt and each verdict's tokens with their
    scored log-probs, only the decision token trained, advantages +-4*a*p*(1-p)."""
    _, engine, frame = judged
    choice = verdict_choice(tiny_tokenizer)
    samples = expected_verdict_samples(frame, choice)
    assert len(samples) == 2 * len(STEPS)
    for k, step in enumerate(frame.groupby("traj_id")):
        (traj_id, rows), plus, minus = step, samples[2 * k], samples[2 * k + 1]
        prompt = list(rows.prompt_ids.iloc[0])
        p = plus_probability(engine, prompt, choice)
        c = 4 * PAYOFF[traj_id] * p * (1 - p)
        assert (plus.advantage, minus.advantage) == pytest.approx((c, -c), rel=1e-3)
        for sample, verdict in ((plus, 1), (minus, -1)):
            tail = choice.opener + choice.options[verdict] + choice.closer
            assert sample.input_ids == prompt + tail and sample.response_len == len(tail)
            assert sample.old_logprobs == pytest.approx(engine.score([prompt], [tail], temperature=T)[0], abs=1e-4)
            assert [i for i, t in enumerate(sample.trained) if t] == [len(choice.opener)]
    assert all(s.stratum is None for s in samples)
    # algo.rm_stratify: a step's two samples carry the sign of its payoff (1.5 and -1.0)
    stratified = expected_verdict_samples(frame, choice, stratified=True)
    assert [s.stratum for s in stratified] == [1, 1, -1, -1]
    assert [s.unit for s in stratified] == [0, 0, 1, 1]


def test_the_first_steps_gradient_is_exactly_minus_the_expected_payoffs(judged, tiny_tokenizer):
    """The trainer's loss on the two samples a step (old log-probs recomputed: ratio 1, the k3
    KL's gradient 0) has the gradient of -mean_k a_k*(2p_k - 1), p_k = P(+1) at T renormalised
    over the options, by autograd. Weighting each verdict by its probability instead, as the
    mean of m drawn judgments would in expectation, gives another gradient: the check can fail."""
    model, _, frame = judged
    model.eval()
    choice = verdict_choice(tiny_tokenizer)
    samples = expected_verdict_samples(frame, choice)
    params = [p for p in model.parameters() if p.requires_grad]

    def grads(loss):
        model.zero_grad()
        loss.backward()
        return torch.cat([p.grad.flatten() for p in params])

    def trainer_grads(samples):
        old = teacher_forced_logprobs(
            model, samples, tiny_tokenizer.pad_token_id, T, 8, torch.autocast("cpu", enabled=False)
        )
        samples = [replace(s, old_logprobs=lp) for s, lp in zip(samples, old)]
        loss, _ = _micro_batch_loss(
            model, samples, pad_id=tiny_tokenizer.pad_token_id, temperature=T, clip_eps=0.2, kl_beta=0.01
        )
        return grads(loss)

    payoffs, objective = [], []
    for traj_id, rows in frame.groupby("traj_id"):
        ids = torch.tensor([list(rows.prompt_ids.iloc[0]) + choice.opener])
        logits = model(ids).logits[0, -1] / T
        z = logits[[choice.options[1][0], choice.options[-1][0]]]
        p = torch.softmax(z, 0)[0]
        objective.append(PAYOFF[traj_id] * (2 * p - 1))
        payoffs.append((PAYOFF[traj_id], torch.log_softmax(logits, 0)[[choice.options[1][0], choice.options[-1][0]]]))
    expected = grads(-torch.stack(objective).mean())
    got = trainer_grads(samples)
    assert expected.abs().max() > 1e-3
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-6)

    # the drawn judgments' expectation: advantage 2*p(S)*a*S on each verdict
    drawn = []
    for (a, first), plus, minus in zip(payoffs, samples[::2], samples[1::2]):
        p = float(torch.softmax(first.detach(), 0)[0])
        drawn += [replace(plus, advantage=2 * p * a), replace(minus, advantage=-2 * (1 - p) * a)]
    assert not torch.allclose(trainer_grads(drawn), expected, rtol=1e-2, atol=1e-5)


def test_a_judgment_without_the_unchosen_log_probs_or_with_mixed_payoffs_is_refused(judged, tiny_tokenizer):
    _, _, frame = judged
    choice = verdict_choice(tiny_tokenizer)
    with pytest.raises(ValueError, match="lacks the unchosen verdict's log-probs"):
        expected_verdict_samples(frame.assign(unchosen_logprobs=None), choice)
    mixed = frame.assign(advantage=np.where(frame.judge_idx == 0, 2.0, 1.0) * frame.step_score)
    with pytest.raises(ValueError, match="payoffs differ"):
        expected_verdict_samples(mixed, choice)
    assert expected_verdict_samples(frame.iloc[:0], choice) == []
