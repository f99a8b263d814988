"""Token log-probs, the masked sequence mean and PPO-clip + k3 KL: values and gradients."""

import math

import pytest
import torch

from rlanything.algo.losses import masked_sequence_mean, ppo_clip_loss, token_logprobs

# ---------------------------------------------------------------- token_logprobs


def test_token_logprobs_hand_example():
    # logits [0, ln 3] -> probs [1/4, 3/4]
    logits = torch.tensor([[[0.0, math.log(3.0)], [0.0, math.log(3.0)]]])  # (1, 2, 2)
    out = token_logprobs(logits, torch.tensor([[1, 0]]), temperature=1.0)
    torch.testing.assert_close(out, torch.tensor([[math.log(0.75), math.log(0.25)]]))


def test_token_logprobs_temperature():
    # logits / 2 = [0, ln 3 / 2] -> probs [1, sqrt 3] / (1 + sqrt 3)
    logits = torch.tensor([[[0.0, math.log(3.0)]]])
    out = token_logprobs(logits, torch.tensor([[1]]), temperature=2.0)
    torch.testing.assert_close(out, torch.tensor([[math.log(math.sqrt(3) / (1 + math.sqrt(3)))]]))


def test_token_logprobs_matches_log_softmax_gather():
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 5, 11, generator=gen) * 4
    labels = torch.randint(0, 11, (3, 5), generator=gen)
    expected = torch.log_softmax(logits / 0.7, dim=-1).gather(-1, labels[..., None]).squeeze(-1)
    torch.testing.assert_close(token_logprobs(logits, labels, temperature=0.7), expected)


def test_token_logprobs_bf16_computes_in_float32():
    logits = torch.randn(2, 3, 7).to(torch.bfloat16)
    out = token_logprobs(logits, torch.zeros(2, 3, dtype=torch.long), temperature=1.0)
    assert out.dtype == torch.float32 and out.shape == (2, 3)


# ---------------------------------------------------------------- masked_sequence_mean

VALUES = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
MASK = torch.tensor([[1, 1, 0], [1, 1, 1]])


def test_masked_sequence_mean_hand_example():
    # seq 1: (1 + 2) / 2 = 1.5; seq 2: (4 + 5 + 6) / 3 = 5; mean = 3.25
    assert masked_sequence_mean(VALUES, MASK).item() == 3.25


def test_masked_sequence_mean_gradient():
    values = VALUES.clone().requires_grad_()
    masked_sequence_mean(values, MASK).backward()
    # each sequence weighs 1/2, spread over its own tokens
    torch.testing.assert_close(values.grad, torch.tensor([[1 / 4, 1 / 4, 0.0], [1 / 6, 1 / 6, 1 / 6]]))


def test_masked_sequence_mean_ignores_empty_sequence():
    values = torch.cat([VALUES, torch.tensor([[100.0, 100.0, 100.0]])])
    mask = torch.cat([MASK, torch.zeros(1, 3, dtype=torch.long)])
    assert masked_sequence_mean(values, mask).item() == 3.25


def test_masked_sequence_mean_all_empty_is_zero_with_grad():
    values = VALUES.clone().requires_grad_()
    out = masked_sequence_mean(values, torch.zeros(2, 3, dtype=torch.bool))
    assert out.item() == 0.0
    out.backward()
    assert torch.equal(values.grad, torch.zeros(2, 3))


def test_masked_sequence_mean_ignores_nan_under_mask():
    values = torch.tensor([[1.0, float("nan")]])
    assert masked_sequence_mean(values, torch.tensor([[True, False]])).item() == 1.0


# ---------------------------------------------------------------- ppo_clip_loss: values
# Hand example, B = 2, T = 2, eps = 0.2, ref = old:
#   seq 0, A = +1, ratios [1.5, 0.5]: pg = -min(1.5, 1.2) = -1.2 (clipped), -min(0.5, 0.8) = -0.5
#   seq 1, A = -2, ratios [1.1, masked]: pg = -min(-2.2, -2.2) = 2.2
#   pg_loss = mean(-0.85, 2.2) = 0.675
#   k3 with ref = old: 1/r + ln r - 1 -> r=1.5: 0.0721318, r=0.5: 0.3068528, r=1.1: 0.0044012
#   kl = mean((0.0721318 + 0.3068528) / 2, 0.0044012) = 0.0969467
#   loss = 0.675 + 0.01 * 0.0969467 = 0.6759695; clip_frac = 1/3; ratio_mean = 3.1 / 3
RATIOS = torch.tensor([[1.5, 0.5], [1.1, 1.0]])
ADV = torch.tensor([1.0, -2.0])
PPO_MASK = torch.tensor([[1, 1], [1, 0]])


def _k3(r):
    return 1 / r + math.log(r) - 1


def _hand_inputs():
    old = torch.log(torch.tensor([[0.3, 0.4], [0.5, 0.6]]))
    logprobs = (old + torch.log(RATIOS)).requires_grad_()
    return logprobs, old


def test_ppo_hand_example_values():
    logprobs, old = _hand_inputs()
    loss, stats = ppo_clip_loss(logprobs, old, ADV, PPO_MASK, clip_eps=0.2, kl_beta=0.01, anchor_beta=0.0)
    kl = ((_k3(1.5) + _k3(0.5)) / 2 + _k3(1.1)) / 2
    assert stats["pg_loss"] == pytest.approx(0.675, abs=1e-6)
    assert stats["kl"] == pytest.approx(kl, abs=1e-6)
    assert kl == pytest.approx(0.0969467, abs=1e-7)
    assert loss.item() == pytest.approx(0.675 + 0.01 * kl, abs=1e-6)
    assert stats["loss"] == pytest.approx(stats["pg_loss"] + 0.01 * stats["kl"], abs=1e-7)
    assert stats["clip_frac"] == pytest.approx(1 / 3)
    assert stats["ratio_mean"] == pytest.approx(3.1 / 3, abs=1e-6)
    assert stats["anchor_kl"] is None  # no anchor given
    assert all(type(v) is float for k, v in stats.items() if k != "anchor_kl")


def test_anchor_kl_hand_example_adds_its_term_and_pulls_towards_the_anchor():
    # The anchor (the run's starting weights) sits where the pre-update model does, except token
    # (0, 0): there the policy has moved to ratio 1.5 of the old and 3.0 of the anchor (anchor
    # prob 0.15). k3 against the anchor per token: 1/3 + ln 3 - 1 = 0.43195, then k3(0.5) and
    # k3(1.1) as for the old model; the masked token reads nothing.
    logprobs, old = _hand_inputs()
    anchor = old.clone()
    anchor[0, 0] = math.log(0.15)
    loss, stats = ppo_clip_loss(
        logprobs, old, ADV, PPO_MASK, anchor_logprobs=anchor, anchor_beta=0.5, clip_eps=0.2, kl_beta=0.01
    )
    anchor_kl = ((_k3(3.0) + _k3(0.5)) / 2 + _k3(1.1)) / 2
    assert anchor_kl == pytest.approx((0.4319456 + 0.3068528) / 4 + 0.0044011 / 2, abs=1e-6)  # 0.1869002
    assert stats["anchor_kl"] == pytest.approx(anchor_kl, abs=1e-6)
    kl = ((_k3(1.5) + _k3(0.5)) / 2 + _k3(1.1)) / 2
    assert loss.item() == pytest.approx(0.675 + 0.01 * kl + 0.5 * anchor_kl, abs=1e-6)
    # the clipped token (0, 0) gets its gradient from the KL terms alone: d k3 / d logp = 1 - 1/r,
    # positive for r > 1, so descent lowers the log-prob back towards both references
    loss.backward()
    expected = (0.01 * (1 - 1 / 1.5) + 0.5 * (1 - 1 / 3.0)) / 2 / 2
    assert logprobs.grad[0, 0].item() == pytest.approx(expected, abs=1e-6)


def test_ppo_hand_example_gradients():
    logprobs, old = _hand_inputs()
    loss, _ = ppo_clip_loss(logprobs, old, ADV, PPO_MASK, kl_beta=0.0, clip_eps=0.2, anchor_beta=0.0)
    loss.backward()
    # d/dlogp of -r * A / (tokens in seq) / (sequences): clipped token -> 0, masked token -> 0
    expected = torch.tensor([[0.0, -0.5 * 1.0 / 2 / 2], [-1.1 * -2.0 / 1 / 2, 0.0]])
    torch.testing.assert_close(logprobs.grad, expected)


def test_ppo_extreme_log_ratio_gives_a_finite_loss_and_gradient():
    # log pi - log pi_old = +1000 and -1000: unclamped, exp would give inf (and inf * 0 = NaN grads)
    logprobs = torch.tensor([[-0.5, -1001.0]], requires_grad=True)
    old = torch.tensor([[-1000.5, -1.0]])
    loss, stats = ppo_clip_loss(
        logprobs, old, torch.tensor([-1.0]), torch.ones(1, 2), kl_beta=0.01, clip_eps=0.2, anchor_beta=0.0
    )
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(logprobs.grad).all()
    # token 1: ratio e^20 (clamped), A = -1 -> pg = max(e^20, 1.2) = e^20; token 2: ratio e^-20, pg = 0.8;
    # k3 with ref - logp = -20 then +20 (clamped): e^-20 + 19 and e^20 - 21
    pg = (math.exp(20) + 0.8) / 2
    kl = (math.exp(-20) + 19 + math.exp(20) - 21) / 2
    assert stats["pg_loss"] == pytest.approx(pg, rel=1e-5) and stats["kl"] == pytest.approx(kl, rel=1e-5)


def test_ppo_kl_of_identical_logprobs_is_zero():
    lp = torch.log(torch.tensor([[0.2, 0.7, 0.1]]))
    _, stats = ppo_clip_loss(
        lp, lp.clone(), torch.tensor([1.0]), torch.ones(1, 3), clip_eps=0.2, kl_beta=0.01, anchor_beta=0.0
    )
    assert stats["kl"] == 0.0
    assert stats["clip_frac"] == 0.0 and stats["ratio_mean"] == 1.0


# ---------------------------------------------------------------- ppo_clip_loss: gradients


def _logits_and_logprobs(seed=0, b=3, t=4, v=6):
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(b, t, v, generator=gen).requires_grad_()
    labels = torch.randint(0, v, (b, t), generator=gen)
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1]])
    return logits, token_logprobs(logits, labels, temperature=1.0), mask


def test_zero_advantage_gives_zero_gradient_without_kl():
    logits, logprobs, mask = _logits_and_logprobs()
    old = logprobs.detach() - 0.05  # off-policy, ratio != 1
    loss, _ = ppo_clip_loss(logprobs, old, torch.zeros(3), mask, kl_beta=0.0, clip_eps=0.2, anchor_beta=0.0)
    loss.backward()
    assert torch.equal(logits.grad, torch.zeros_like(logits))


def test_zero_advantage_identical_models_gives_zero_gradient_with_kl():
    logits, logprobs, mask = _logits_and_logprobs()
    loss, stats = ppo_clip_loss(
        logprobs, logprobs.detach(), torch.zeros(3), mask, kl_beta=0.01, clip_eps=0.2, anchor_beta=0.0
    )
    loss.backward()
    assert stats["kl"] == 0.0
    assert torch.count_nonzero(logits.grad) == 0


def test_nonzero_advantage_gives_gradient():
    logits, logprobs, mask = _logits_and_logprobs()
    loss, _ = ppo_clip_loss(
        logprobs, logprobs.detach(), torch.tensor([1.0, -1.0, 0.5]), mask, clip_eps=0.2, kl_beta=0.01, anchor_beta=0.0
    )
    loss.backward()
    assert logits.grad.abs().sum() > 0


@pytest.mark.parametrize(
    "ratio, advantage, pg_grad_is_zero",
    [
        (1.5, 1.0, True),  # above 1 + eps, A > 0: clipped
        (0.5, -1.0, True),  # below 1 - eps, A < 0: clipped
        (0.5, 1.0, False),  # below 1 - eps, A > 0: pessimistic bound keeps the gradient
        (1.5, -1.0, False),  # above 1 + eps, A < 0: likewise
        (1.1, 1.0, False),  # inside the range
    ],
)
def test_clip_range_gradient(ratio, advantage, pg_grad_is_zero):
    old = torch.log(torch.tensor([[0.4]]))
    logprobs = (old + math.log(ratio)).requires_grad_()
    loss, stats = ppo_clip_loss(
        logprobs, old, torch.tensor([advantage]), torch.ones(1, 1), kl_beta=0.0, clip_eps=0.2, anchor_beta=0.0
    )
    loss.backward()
    assert (logprobs.grad.item() == 0.0) is pg_grad_is_zero
    assert stats["clip_frac"] == (1.0 if pg_grad_is_zero else 0.0)


def test_masked_tokens_get_zero_gradient():
    logits, logprobs, mask = _logits_and_logprobs()
    old = logprobs.detach().clone()
    old[mask == 0] = -1e4  # garbage at padding: exp(logp - old) would overflow if not masked
    loss, _ = ppo_clip_loss(
        logprobs, old, torch.tensor([1.0, -2.0, 0.5]), mask, kl_beta=0.1, clip_eps=0.2, anchor_beta=0.0
    )
    loss.backward()
    assert torch.isfinite(loss)
    assert torch.all(logits.grad[mask == 0] == 0)
    assert torch.all(logits.grad[mask == 1].abs().sum(-1) > 0)


def test_all_masked_batch_is_zero_loss_and_backward_works():
    logits, logprobs, _ = _logits_and_logprobs()
    loss, stats = ppo_clip_loss(
        logprobs, logprobs.detach(), torch.ones(3), torch.zeros(3, 4), clip_eps=0.2, kl_beta=0.01, anchor_beta=0.0
    )
    loss.backward()
    assert loss.item() == 0.0 and stats["clip_frac"] == 0.0
    assert torch.count_nonzero(logits.grad) == 0
