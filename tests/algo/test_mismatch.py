"""The sampler–trainer mismatch: TIS weights, their effect on the PPO loss, and the measures."""

import math

import pytest
import torch

from rlanything.algo.losses import ppo_clip_loss
from rlanything.algo.mismatch import mismatch_measures, tis_weights


def test_tis_weights_are_the_capped_ratio_on_response_tokens_and_one_elsewhere():
    trainer = torch.tensor([[math.log(0.6), math.log(0.2), math.log(0.9), -50.0]])
    sampler = torch.tensor([[math.log(0.3), math.log(0.4), math.log(0.1), 0.0]])
    mask = torch.tensor([[1, 1, 1, 0]])
    # ratios 0.6/0.3 = 2, 0.2/0.4 = 0.5, 0.9/0.1 = 9 -> capped at 3; padding: 1 (not e^-50)
    weights = tis_weights(trainer, sampler, mask, cap=3.0)
    torch.testing.assert_close(weights, torch.tensor([[2.0, 0.5, 3.0, 1.0]]))
    assert not weights.requires_grad


def test_tis_weights_do_not_carry_gradient_to_the_trainer_logprobs():
    trainer = torch.tensor([[-0.5, -1.0]], requires_grad=True)
    weights = tis_weights(trainer, torch.tensor([[-1.0, -1.0]]), torch.ones(1, 2), cap=2.0)
    assert weights.grad_fn is None


def test_the_loss_weighs_each_tokens_clipped_term_and_leaves_the_kl_alone():
    # one sequence of 2 tokens, ratios 1.1 (inside the clip) and 1, advantage 2: pg_t = -2.2, -2
    old = torch.log(torch.tensor([[0.5, 0.25]]))
    lp = old + torch.log(torch.tensor([[1.1, 1.0]]))
    weights = torch.tensor([[0.5, 2.0]])
    loss, stats = ppo_clip_loss(
        lp, old, torch.tensor([2.0]), torch.ones(1, 2), kl_beta=0.01, is_weights=weights, clip_eps=0.2, anchor_beta=0.0
    )
    _, plain = ppo_clip_loss(
        lp, old, torch.tensor([2.0]), torch.ones(1, 2), kl_beta=0.01, clip_eps=0.2, anchor_beta=0.0
    )
    # pg = mean(-2.2 * 0.5, -2 * 2.0) = mean(-1.1, -4) = -2.55
    assert stats["pg_loss"] == pytest.approx(-2.55) and plain["pg_loss"] == pytest.approx(-2.1)
    # k3 of the first token: e^(-ln 1.1) + ln 1.1 - 1 = 0.004392, the second 0: the same weighted or not
    assert stats["kl"] == pytest.approx((1 / 1.1 + math.log(1.1) - 1) / 2) == plain["kl"]
    assert float(loss) == pytest.approx(-2.55 + 0.01 * stats["kl"])


def test_the_gradient_of_a_weighted_token_scales_with_its_weight():
    lp = torch.log(torch.tensor([[0.5, 0.5]])).requires_grad_()
    weights = torch.tensor([[1.0, 3.0]])
    loss, _ = ppo_clip_loss(
        lp,
        lp.detach(),
        torch.tensor([1.0]),
        torch.ones(1, 2),
        kl_beta=0.0,
        is_weights=weights,
        clip_eps=0.2,
        anchor_beta=0.0,
    )
    loss.backward()
    # d/d lp_t of -mean_t(w_t * exp(lp_t - old_t) * A) at ratio 1 = -w_t * A / 2
    torch.testing.assert_close(lp.grad, torch.tensor([[-0.5, -1.5]]))


def test_no_weights_and_unit_weights_give_the_same_loss():
    gen = torch.Generator().manual_seed(3)
    lp, old = torch.randn(3, 4, generator=gen) - 2, torch.randn(3, 4, generator=gen) - 2
    adv, mask = torch.tensor([1.0, -0.5, 2.0]), torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1], [0, 1, 1, 0]])
    plain, _ = ppo_clip_loss(lp, old, adv, mask, clip_eps=0.2, kl_beta=0.01, anchor_beta=0.0)
    ones, _ = ppo_clip_loss(
        lp, old, adv, mask, is_weights=torch.ones(3, 4), clip_eps=0.2, kl_beta=0.01, anchor_beta=0.0
    )
    torch.testing.assert_close(plain, ones)


def test_mismatch_measures_by_hand():
    # gaps: 0.1, -0.3, 0.8, 0.0; |gap| > ln 2 = 0.693 only for 0.8
    m = mismatch_measures([-1.0, -2.3, -0.2, -4.0], [-1.1, -2.0, -1.0, -4.0], cap=2.0)
    assert m["abs_mean"] == pytest.approx((0.1 + 0.3 + 0.8 + 0.0) / 4)
    assert m["abs_max"] == pytest.approx(0.8)
    assert m["outside_cap"] == pytest.approx(0.25) and m["tokens"] == 4
    # a looser cap (e = 2.718...: ln = 1) leaves every token inside
    assert mismatch_measures([-1.0, -2.3, -0.2, -4.0], [-1.1, -2.0, -1.0, -4.0], cap=math.e)["outside_cap"] == 0.0


def test_mismatch_measures_of_nothing_and_of_unequal_sizes():
    assert mismatch_measures([], []) == {"abs_mean": 0.0, "abs_max": 0.0, "outside_cap": 0.0, "tokens": 0}
    with pytest.raises(ValueError, match="differ in size"):
        mismatch_measures([0.0, 1.0], [0.0])
