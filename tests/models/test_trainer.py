"""The PPO update on a tiny model: it moves log-probs the way the advantages say."""

import math

import pytest
import torch

from rlanything.algo.losses import ppo_clip_loss
from rlanything.models.engines.transformers_engine import TransformersEngine, response_logprobs
from rlanything.models.loading import load_model
from rlanything.models.prompts import policy_messages, render
from rlanything.models.training.lora import train_top_layers
from rlanything.models.training.saving import OPTIMIZER_STATE, save_checkpoint
from rlanything.models.training.trainer import (
    Sample,
    _forward_need,
    autocast_for,
    checkpoint_layers,
    layers_checkpointed,
    make_optimizer,
    ppo_update,
)


def batch(model_path, tokenizer):
    model = load_model(model_path)
    prompts = [render(tokenizer, policy_messages("sys", [f"Calculate {i} + 1."], []))[1] for i in range(4)]
    gens = TransformersEngine(model, tokenizer).generate(prompts, max_new_tokens=8, temperature=1.0, top_p=1.0, seed=0)
    advantages = [1.0, -1.0, 1.0, -1.0]
    samples = [Sample(p + g.token_ids, len(g.token_ids), g.logprobs, a) for p, g, a in zip(prompts, gens, advantages)]
    return model, samples


def seq_logprob(model, samples, pad_id):
    with torch.no_grad():
        lp, mask = response_logprobs(
            model, [s.input_ids for s in samples], [s.response_len for s in samples], pad_id, 1.0
        )
    return (lp * mask).sum(-1)


def batch_loss(model, samples, pad_id):
    with torch.no_grad():
        lp, mask = response_logprobs(
            model, [s.input_ids for s in samples], [s.response_len for s in samples], pad_id, 1.0
        )
        old = torch.zeros_like(lp)
        for row, s in enumerate(samples):
            old[row, old.shape[1] - s.response_len :] = torch.tensor(s.old_logprobs)
        adv = torch.tensor([s.advantage for s in samples])
        return ppo_clip_loss(lp, old, adv, mask, clip_eps=0.2, kl_beta=0.01, anchor_beta=0.0)[0].item()


def test_update_raises_positive_and_lowers_negative_advantage_responses(tiny_model_path, tiny_tokenizer):
    model, samples = batch(tiny_model_path, tiny_tokenizer)
    pad = tiny_tokenizer.pad_token_id
    before = seq_logprob(model, samples, pad)
    loss_before = batch_loss(model, samples, pad)
    optimizer = make_optimizer(model, lr=1e-3, weight_decay=0.0)
    history = ppo_update(
        model,
        optimizer,
        samples,
        pad_id=pad,
        temperature=1.0,
        clip_eps=0.2,
        kl_beta=0.01,
        grad_clip=1.0,
        updates=2,
        micro_batch_size=1,
        seed=0,
    )
    after = seq_logprob(model, samples, pad)
    assert [h["num_samples"] for h in history] == [2, 2]
    assert history[0]["kl"] == pytest.approx(0.0, abs=1e-6)  # first step: the generating model itself
    assert all(h["grad_norm"] > 0 and h["num_tokens"] > 0 for h in history)
    assert batch_loss(model, samples, pad) < loss_before
    delta = (after - before).tolist()
    assert delta[0] > 0 and delta[2] > 0 and delta[1] < 0 and delta[3] < 0, delta


def one_step_gradient(model, samples, pad_id: int, micro: int, precision: str = "fp32") -> tuple[torch.Tensor, dict]:
    """The gradient of one optimizer step over all `samples` (weights kept) and its stats."""
    history = ppo_update(
        model,
        torch.optim.SGD(model.parameters(), lr=0.0),  # keep weights, read the grads
        samples,
        pad_id=pad_id,
        temperature=1.0,
        clip_eps=0.2,
        kl_beta=0.01,
        grad_clip=1e9,
        updates=1,
        micro_batch_size=micro,
        seed=0,
        precision=precision,
    )
    return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]), history[0]


def test_micro_batching_does_not_change_the_gradient(tiny_model_path, tiny_tokenizer):
    grads = []
    for micro in (1, 4):
        model, samples = batch(tiny_model_path, tiny_tokenizer)
        grads.append(one_step_gradient(model, samples, tiny_tokenizer.pad_token_id, micro)[0])
    assert torch.allclose(grads[0], grads[1], atol=1e-6, rtol=1e-4)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_checkpointed_layers_give_the_same_gradient_and_the_planner_counts_less(
    tiny_model_path, tiny_tokenizer, precision
):
    """`optim.gradient_checkpointing`: each layer recomputed in the backward, the same gradient
    and loss (to float rounding); the micro-batch planner counts no more activations (fewer on
    a deep model: tests/models/test_memory_budget.py measures them)."""
    runs = []
    for checkpointed in (False, True):
        model, samples = batch(tiny_model_path, tiny_tokenizer)
        if checkpointed:
            checkpoint_layers(model)
        assert layers_checkpointed(model) == checkpointed
        with autocast_for(model, precision):
            need = _forward_need(model, samples, training=True)([0, 1, 2, 3])
        grad, stats = one_step_gradient(model, samples, tiny_tokenizer.pad_token_id, 4, precision)
        runs.append((grad, stats["loss"], need))
    (plain, plain_loss, plain_need), (ckpt, ckpt_loss, ckpt_need) = runs
    assert plain.abs().sum() > 0 and torch.allclose(plain, ckpt, atol=1e-6, rtol=1e-4)
    assert plain_loss == pytest.approx(ckpt_loss, rel=1e-5)
    assert ckpt_need <= plain_need  # equal here: 2 layers hold no more than they keep


def test_a_sample_trains_only_its_chosen_tokens(tiny_model_path, tiny_tokenizer):
    """A response whose only chosen token is its third trains like the sample cut after that
    token (a causal model's third log-prob ignores what follows): the same gradient and one
    token a sample; training every token gives another gradient."""
    _, samples = batch(tiny_model_path, tiny_tokenizer)
    masked = [
        Sample(
            s.input_ids,
            s.response_len,
            s.old_logprobs,
            s.advantage,
            trained=[False] * 2 + [True] + [False] * (s.response_len - 3),
        )
        for s in samples
    ]
    cut = [
        Sample(s.input_ids[: len(s.input_ids) - s.response_len + 3], 1, s.old_logprobs[2:3], s.advantage)
        for s in samples
    ]
    grads, tokens = [], []
    for batch_ in (masked, cut, samples):
        grad, stats = one_step_gradient(load_model(tiny_model_path), batch_, tiny_tokenizer.pad_token_id, micro=2)
        grads.append(grad)
        tokens.append(stats["num_tokens"])
    assert all(s.response_len == 8 for s in samples)  # the tiny model used its whole budget
    assert tokens == [4, 4, 32]
    assert torch.allclose(grads[0], grads[1], atol=1e-6, rtol=1e-4)
    assert not torch.allclose(grads[0], grads[2], atol=1e-4, rtol=1e-2)
    with pytest.raises(ValueError, match="trained marks the 8 response tokens"):
        Sample(samples[0].input_ids, 8, samples[0].old_logprobs, 1.0, trained=[True] * 7)


def test_no_samples_no_step(tiny_model_path, tiny_tokenizer):
    model = load_model(tiny_model_path)
    optimizer = make_optimizer(model, lr=1e-3, weight_decay=0.0)
    assert (
        ppo_update(
            model,
            optimizer,
            [],
            pad_id=0,
            temperature=1.0,
            clip_eps=0.2,
            kl_beta=0.01,
            grad_clip=1.0,
            updates=2,
            micro_batch_size=2,
            seed=0,
        )
        == []
    )


def test_checkpoint_round_trips_weights_and_optimizer(tiny_model_path, tiny_tokenizer, tmp_path):
    model, samples = batch(tiny_model_path, tiny_tokenizer)
    optimizer = make_optimizer(model, lr=1e-3, weight_decay=0.0)
    ppo_update(
        model,
        optimizer,
        samples,
        pad_id=tiny_tokenizer.pad_token_id,
        temperature=1.0,
        clip_eps=0.2,
        kl_beta=0.0,
        grad_clip=1.0,
        updates=1,
        micro_batch_size=4,
        seed=0,
    )
    save_checkpoint(model, tiny_tokenizer, optimizer, tmp_path / "ckpt")  # what the update step writes
    again = load_model(tmp_path / "ckpt")
    for (name, a), b in zip(model.state_dict().items(), again.state_dict().values()):
        assert torch.equal(a, b), name
    resumed = make_optimizer(again, lr=1e-3, weight_decay=0.0, state_path=tmp_path / "ckpt" / OPTIMIZER_STATE)
    state = next(iter(resumed.state.values()))
    assert int(state["step"]) == 1 and state["exp_avg"].abs().sum() > 0


def test_adamw_is_fused_and_a_resumed_state_takes_the_same_step(tiny_model_path, tiny_tokenizer, tmp_path):
    """The fused kernel (one pass per tensor) is used on CPU, also after loading a state saved by
    the multi-tensor optimizer, and steps exactly like torch's reference AdamW up to rounding."""
    model, samples = batch(tiny_model_path, tiny_tokenizer)
    reference = load_model(tiny_model_path)
    fused = make_optimizer(model, lr=1e-3, weight_decay=0.1)
    plain = torch.optim.AdamW(reference.parameters(), lr=1e-3, weight_decay=0.1, foreach=False)
    assert fused.param_groups[0]["fused"] is True
    for m, opt in ((model, fused), (reference, plain)):
        ppo_update(
            m,
            opt,
            samples,
            pad_id=tiny_tokenizer.pad_token_id,
            temperature=1.0,
            clip_eps=0.2,
            kl_beta=0.0,
            grad_clip=1.0,
            updates=2,
            micro_batch_size=4,
            seed=0,
        )
    for (name, a), b in zip(model.named_parameters(), reference.parameters()):
        assert torch.allclose(a, b, atol=1e-6), name
    torch.save(plain.state_dict(), tmp_path / "optimizer.pt")  # saved with foreach=False, fused=None
    resumed = make_optimizer(reference, lr=2e-3, weight_decay=0.0, state_path=tmp_path / "optimizer.pt")
    group = resumed.param_groups[0]
    assert (group["fused"], group["foreach"], group["lr"], group["weight_decay"]) == (True, None, 2e-3, 0.0)
    assert int(next(iter(resumed.state.values()))["step"]) == 2


def _update(model, samples, pad, **kw):
    args = dict(
        pad_id=pad, temperature=1.0, clip_eps=0.2, kl_beta=0.01, grad_clip=1.0, updates=1, micro_batch_size=4, seed=0
    )
    return ppo_update(model, make_optimizer(model, lr=kw.pop("lr", 1e-3), weight_decay=0.0), samples, **(args | kw))


def test_epochs_repeat_the_passes_each_with_every_sample(tiny_model_path, tiny_tokenizer):
    model, samples = batch(tiny_model_path, tiny_tokenizer)
    history = _update(model, samples, tiny_tokenizer.pad_token_id, updates=2, epochs=3)
    # 4 samples, 2 mini-batches a pass, 3 passes: 6 optimizer steps of 2 samples
    assert [h["update_idx"] for h in history] == [0, 1, 2, 3, 4, 5]
    assert [h["epoch"] for h in history] == [0, 0, 1, 1, 2, 2]
    assert [h["num_samples"] for h in history] == [2] * 6
    # every pass covers all response tokens once
    tokens = sum(s.response_len for s in samples)
    assert [history[2 * e]["num_tokens"] + history[2 * e + 1]["num_tokens"] for e in range(3)] == [tokens] * 3
    # more mini-batches asked for than samples: one sample each
    assert len(_update(model, samples, tiny_tokenizer.pad_token_id, updates=9, epochs=2)) == 8


def test_a_units_samples_share_every_mini_batch():
    """Sample.unit: a judged step's two expected verdicts stay in one mini-batch; the units are
    shuffled and dealt like samples, a sample without a unit is one alone; without units the
    draws are unchanged."""
    import random

    from rlanything.models.training.trainer import epoch_mini_batches

    # without units, as every earlier version drew them (random.Random(0) shuffles 5 to [3, 4, 0, 1, 2])
    assert epoch_mini_batches(random.Random(0), 5, 2) == [[3, 0, 2], [4, 1]]
    assert epoch_mini_batches(random.Random(0), 5, 2, [None] * 5) == [[3, 0, 2], [4, 1]]
    # one mini-batch has nothing to keep apart: the same draw (6 shuffled to [3, 5, 0, 1, 2, 4])
    assert epoch_mini_batches(random.Random(0), 6, 1, [0, 0, 1, 1, 2, 2]) == [[3, 5, 0, 1, 2, 4]]
    units = [0, 0, None, 1, 1, 2, 2, None]
    for seed in range(20):
        for updates in (1, 2, 3, 9):
            minis = epoch_mini_batches(random.Random(seed), len(units), updates, units)
            assert sorted(i for mini in minis for i in mini) == list(range(8))  # each sample once
            assert len(minis) == min(updates, 5)  # 3 pairs and 2 singles: 5 units
            for mini in minis:
                for i in mini:
                    if units[i] is not None:  # its partner is in the same mini-batch
                        assert {j for j in range(8) if units[j] == units[i]} <= set(mini)
    dealt = {tuple(map(tuple, epoch_mini_batches(random.Random(s), 8, 3, units))) for s in range(20)}
    assert len(dealt) > 5  # shuffled, not a fixed deal


def test_strata_are_spread_evenly_over_the_mini_batches():
    """algo.rm_stratify: each stratum's units are shuffled apart and dealt on in turn, so every
    mini-batch holds each stratum's share to within one unit; a unit stays whole; a unit across two
    strata is refused. With 4 won steps among 20 and 4 mini-batches, each holds one won step, where
    a random deal leaves some without (the case it is for)."""
    import random

    from rlanything.models.training.trainer import epoch_mini_batches

    # hand-computed: random.Random(0) shuffles stratum -1 to [5, 3, 2, 4], stratum 1 to [1, 0], the two
    # mini-batches [[5, 2, 1], [3, 4, 0]] to [[3, 4, 0], [5, 2, 1]]
    assert epoch_mini_batches(random.Random(0), 6, 2, None, [1, 1, -1, -1, -1, -1]) == [[3, 4, 0], [5, 2, 1]]
    # the mini-batches holding the small stratum do not always come last (4 won, 137 lost, 10 mini-batches)
    strata = [1] * 4 + [-1] * 137
    last = {tuple(i < 4 for i in epoch_mini_batches(random.Random(s), 141, 10, None, strata)[-1]) for s in range(10)}
    assert len({any(won) for won in last}) == 2
    strata = [1, 1] + [-1] * 8 + [0] * 3  # 2 won, 8 lost, 3 paid nothing
    for seed in range(30):
        for updates in (2, 3, 5):
            minis = epoch_mini_batches(random.Random(seed), 13, updates, None, strata)
            assert sorted(i for mini in minis for i in mini) == list(range(13))
            for label, count in ((1, 2), (-1, 8), (0, 3)):
                shares = [sum(strata[i] == label for i in mini) for mini in minis]
                assert max(shares) - min(shares) <= 1 and sum(shares) == count, (seed, updates, label, shares)
    # 4 won among 20 in 4 mini-batches: by sign, every mini-batch holds one; a random deal often leaves one without
    won = [1] * 4 + [-1] * 16
    assert all(
        all(sum(i < 4 for i in mini) == 1 for mini in epoch_mini_batches(random.Random(s), 20, 4, None, won))
        for s in range(30)
    )
    assert any(
        any(not {0, 1, 2, 3} & set(mini) for mini in epoch_mini_batches(random.Random(s), 20, 4)) for s in range(30)
    )
    # units: a pair stays together; the pairs of each stratum are dealt evenly
    units, strata = [0, 0, 1, 1, 2, 2, 3, 3], [1, 1, -1, -1, -1, -1, 1, 1]
    for seed in range(20):
        minis = epoch_mini_batches(random.Random(seed), 8, 2, units, strata)
        assert sorted(i for mini in minis for i in mini) == list(range(8))
        for mini in minis:
            assert all({j for j in range(8) if units[j] == units[i]} <= set(mini) for i in mini)
            assert sorted(strata[i] for i in mini) == [-1, -1, 1, 1]
    with pytest.raises(ValueError, match="share a unit but not a stratum"):
        epoch_mini_batches(random.Random(0), 4, 2, [0, 0, 1, 1], [1, -1, 1, 1])
    # one mini-batch, or no strata: the draws of earlier versions
    assert epoch_mini_batches(random.Random(0), 5, 1, None, [1, -1, 1, -1, 1]) == epoch_mini_batches(
        random.Random(0), 5, 1
    )


def test_the_update_deals_by_the_samples_strata(tiny_model_path, tiny_tokenizer, monkeypatch):
    """ppo_update hands `Sample.stratum` to the deal where any sample has one, else None (the old draws)."""
    from dataclasses import replace

    from rlanything.models.training import trainer

    seen, deal = [], trainer.epoch_mini_batches
    monkeypatch.setattr(trainer, "epoch_mini_batches", lambda *a: seen.append(a[4]) or deal(*a))
    model, samples = batch(tiny_model_path, tiny_tokenizer)
    _update(model, samples, tiny_tokenizer.pad_token_id, updates=2)
    signed = [replace(s, stratum=1 if s.advantage > 0 else -1) for s in samples]
    history = _update(model, signed, tiny_tokenizer.pad_token_id, updates=2)
    assert seen == [None, [1, -1, 1, -1]]
    assert [h["num_samples"] for h in history] == [2, 2]


def test_the_first_epoch_is_the_one_pass_update(tiny_model_path, tiny_tokenizer):
    """Adding epochs does not change what the first pass does (same shuffle, same steps)."""
    runs = []
    for epochs in (1, 2):
        model, samples = batch(tiny_model_path, tiny_tokenizer)
        runs.append(_update(model, samples, tiny_tokenizer.pad_token_id, updates=2, epochs=epochs))
    assert runs[1][:2] == runs[0]


def test_the_clip_acts_on_the_second_pass_and_not_on_the_first(tiny_model_path, tiny_tokenizer):
    model, samples = batch(tiny_model_path, tiny_tokenizer)
    first, second = _update(model, samples, tiny_tokenizer.pad_token_id, epochs=2, lr=3e-2)
    # pass 1 runs on the generating weights: every ratio is exactly 1, nothing to clip, k3 KL 0
    assert first["clip_frac"] == 0.0 and first["kl"] == pytest.approx(0.0, abs=1e-6)
    # pass 2 sees the weights the first step moved (a large lr): ratios leave [0.8, 1.2]
    assert second["clip_frac"] > 0.1 and second["kl"] > 1e-3


def test_lr_at_sets_each_steps_learning_rate(tiny_model_path, tiny_tokenizer):
    from rlanything.algo.schedule import learning_rate

    model, samples = batch(tiny_model_path, tiny_tokenizer)
    # the run's steps 2, 3, 4 of a warmup of 4 at lr 1e-3: 3/4, 4/4, 4/4 of it
    constant = dict(schedule="constant", total_steps=0, min_lr_ratio=0.0)
    lr_at = lambda k: learning_rate(2 + k, 1e-3, warmup_steps=4, **constant)  # noqa: E731
    history = _update(model, samples, tiny_tokenizer.pad_token_id, updates=3, lr_at=lr_at)
    assert [h["lr"] for h in history] == pytest.approx([7.5e-4, 1e-3, 1e-3])


def test_entropy_is_the_mean_next_token_entropy_of_the_responses(tiny_model_path, tiny_tokenizer):
    from rlanything.algo.losses import token_entropy

    model, samples = batch(tiny_model_path, tiny_tokenizer)
    expected = []
    with torch.no_grad():  # each sequence alone, unpacked: the entropy at each response position
        for s in samples:
            logits = model(input_ids=torch.tensor([s.input_ids])).logits[0]
            start = len(s.input_ids) - s.response_len
            expected.append(token_entropy(logits[start - 1 : -1], temperature=1.0).mean().item())
    (step,) = _update(model, samples, tiny_tokenizer.pad_token_id, lr=1e-12)
    assert step["entropy"] == pytest.approx(sum(expected) / len(expected), rel=1e-4)
    assert 0 < step["entropy"] <= math.log(model.config.vocab_size)


def test_training_the_top_layers_gives_their_full_model_gradient_and_nothing_below(tiny_model_path, tiny_tokenizer):
    """optim.train_top_layers 1 on the 2-layer tiny model: the last layer and the final norm
    train with the gradient the whole model's backward gives them; nothing else gets one."""
    _, samples = batch(tiny_model_path, tiny_tokenizer)
    full, top = load_model(tiny_model_path), load_model(tiny_model_path)
    train_top_layers(top, 1)
    trained = {name for name, p in top.named_parameters() if p.requires_grad}
    assert top.config.num_hidden_layers == 2 and top.config.tie_word_embeddings  # the head is the embeddings
    assert trained == {n for n, _ in top.named_parameters() if ".layers.1." in n or n == "model.norm.weight"}
    for model in (full, top):
        one_step_gradient(model, samples, tiny_tokenizer.pad_token_id, micro=2)
    reference = dict(full.named_parameters())
    for name, p in top.named_parameters():
        if name in trained:
            assert torch.allclose(p.grad, reference[name].grad, atol=1e-7, rtol=1e-5), name
        else:
            assert p.grad is None and reference[name].grad.abs().sum() > 0, name  # it had one to lose
    with pytest.raises(ValueError, match="train_top_layers 3: the model has 2 decoder layers"):
        train_top_layers(load_model(tiny_model_path), 3)


def test_an_update_of_the_top_layers_writes_the_lower_weights_unchanged(tiny_model_path, tiny_tokenizer, tmp_path):
    from test_distributed import job

    from rlanything.models.training.distributed import run_update

    _, samples = batch(tiny_model_path, tiny_tokenizer)
    run_update(job(tiny_model_path, tmp_path / "out", train_top_layers=1), samples)
    start, after = load_model(tiny_model_path).state_dict(), load_model(tmp_path / "out").state_dict()
    moved = {name for name in start if not torch.equal(start[name], after[name])}
    assert moved and all(".layers.1." in name or name == "model.norm.weight" for name in moved), moved
    assert any(".layers.1.mlp" in name for name in moved)
