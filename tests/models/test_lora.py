"""LoRA on the tiny model: only adapters train, checkpoints load as plain models and resume."""

import json

import pytest
import torch
from safetensors.torch import load_file

from rlanything.config import ConfigError, LoraConfig, build_config
from rlanything.models.engines.transformers_engine import TransformersEngine, response_logprobs
from rlanything.models.loading import ADAPTER_DIR, is_adapter_only, load_model
from rlanything.models.prompts import policy_messages, render
from rlanything.models.training.distributed import UpdateJob, run_update
from rlanything.models.training.lora import add_adapters, load_for_training
from rlanything.models.training.trainer import Sample, make_optimizer, ppo_update

LORA = LoraConfig(enabled=True, r=4, alpha=8.0)


@pytest.fixture(scope="module")
def samples(tiny_model_path, tiny_tokenizer):
    model = load_model(tiny_model_path)
    prompts = [render(tiny_tokenizer, policy_messages("sys", [f"Calculate {i} + 2."], []))[1] for i in range(4)]
    gens = TransformersEngine(model, tiny_tokenizer).generate(
        prompts, max_new_tokens=8, temperature=1.0, top_p=1.0, seed=0
    )
    return [
        Sample(p + g.token_ids, len(g.token_ids), g.logprobs, a)
        for p, g, a in zip(prompts, gens, [1.0, -1.0, 1.0, -1.0])
    ]


def job(start, out, save="merged", **kw):
    lora = LORA.model_copy(update={"save": save}).model_dump()
    args = dict(
        start=str(start),
        out=str(out),
        precision="fp32",
        lora=lora,
        lr=1e-2,
        weight_decay=0.0,
        grad_clip=1.0,
        updates=2,
        micro_batch_size=2,
        temperature=1.0,
        clip_eps=0.2,
        kl_beta=0.01,
        seed=0,
    )
    return UpdateJob(**{**args, **kw})


def logits(model, ids):
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids])).logits


def test_only_adapter_weights_train(tiny_model_path, tiny_tokenizer, samples):
    model = add_adapters(load_model(tiny_model_path), LORA)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    optimizer = make_optimizer(model, lr=1e-2, weight_decay=0.0)
    assert sum(p.numel() for g in optimizer.param_groups for p in g["params"]) == sum(
        p.numel() for n, p in model.named_parameters() if n in trainable
    )
    history = ppo_update(
        model,
        optimizer,
        samples,
        pad_id=tiny_tokenizer.pad_token_id,
        temperature=1.0,
        clip_eps=0.2,
        kl_beta=0.01,
        grad_clip=1.0,
        updates=2,
        micro_batch_size=2,
        seed=0,
    )
    assert history[0]["kl"] == pytest.approx(0.0, abs=1e-6)  # B = 0 at start: the base model's log-probs
    for name, param in model.named_parameters():
        changed = not torch.equal(param, before[name])
        if name in trainable and "lora_B" in name:
            assert changed, name
        elif name not in trainable:
            assert not changed, name


def test_merged_checkpoint_is_a_plain_model_that_differs_from_base(tiny_model_path, tiny_tokenizer, samples, tmp_path):
    history = run_update(job(tiny_model_path, tmp_path / "ck"), samples)
    assert len(history) == 2 and all(h["grad_norm"] > 0 for h in history)
    folder = tmp_path / "ck"
    assert (folder / "model.safetensors").is_file() and (folder / "adapter" / "adapter_config.json").is_file()
    assert json.loads((folder / "adapter" / "adapter_config.json").read_text())["base_model_name_or_path"] == str(
        tiny_model_path.resolve()
    )
    merged, base = load_model(folder), load_model(tiny_model_path)
    assert type(merged).__name__ == "LlamaForCausalLM"  # no peft wrapper: vLLM and the rollout read it as is
    ids = samples[0].input_ids
    assert not torch.allclose(logits(merged, ids), logits(base, ids))
    # The merged weights compute what base + adapter computes (the trainer's view).
    trained, _ = load_for_training(folder, "float32", LORA)
    assert torch.allclose(logits(merged, ids), logits(trained, ids), atol=1e-5)
    with torch.no_grad():  # and so the rollout's log-probs equal the trainer's (PPO ratio 1)
        a, mask = response_logprobs(merged, [s.input_ids for s in samples], [s.response_len for s in samples], 0, 1.0)
        b, _ = response_logprobs(trained, [s.input_ids for s in samples], [s.response_len for s in samples], 0, 1.0)
    assert torch.allclose(a[mask], b[mask], atol=1e-5)


def test_adapter_checkpoint_resumes_adapter_and_moments(tiny_model_path, samples, tmp_path):
    run_update(job(tiny_model_path, tmp_path / "a1", save="adapter"), samples)
    folder = tmp_path / "a1"
    assert is_adapter_only(folder) and not list(folder.glob("*.safetensors"))
    assert (folder / "config.json").is_file() and (folder / "optimizer.pt").is_file()
    # load_model merges in memory: the same model as a merged checkpoint of the same update.
    run_update(job(tiny_model_path, tmp_path / "m1", save="merged"), samples)
    ids = samples[1].input_ids
    assert torch.allclose(logits(load_model(folder), ids), logits(load_model(tmp_path / "m1"), ids), atol=1e-6)
    # The next update continues the same adapter (base stays the original) with AdamW's moments.
    model, _ = load_for_training(folder, "float32", LORA)
    optimizer = make_optimizer(model, 1e-2, 0.0, folder / "optimizer.pt")
    assert int(next(iter(optimizer.state.values()))["step"]) == 2
    history = run_update(job(folder, tmp_path / "a2", save="adapter"), samples)
    assert len(history) == 2
    config = json.loads((tmp_path / "a2" / "adapter" / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == str(tiny_model_path.resolve())


def test_lora_config_keys_and_vllm_needs_merged():
    config = build_config({"policy": {"lora": {"enabled": True, "r": 8, "target_modules": ["all-linear"]}}})
    assert config.policy.lora.r == 8 and config.rm.lora.enabled is False
    with pytest.raises(ConfigError, match="lora"):
        build_config({"rm": {"lora": {"rank": 8}}})
    with pytest.raises(ConfigError, match="save: merged"):
        build_config({"policy": {"engine": "vllm", "lora": {"enabled": True, "save": "adapter"}}})


def test_a_bf16_lora_update_keeps_its_adapters_fp32_over_a_bf16_base(tiny_model_path, samples, tmp_path):
    """A bf16 update with LoRA loads the frozen base in bf16 (no fp32 copy of weights that never
    train) while peft keeps the trained adapters in fp32; the adapters move and the merged
    checkpoint is a bf16 model."""
    history = run_update(job(tiny_model_path, tmp_path / "out", save="adapter", precision="bf16"), samples)
    assert len(history) == 2 and all(h["grad_norm"] > 0 for h in history)
    adapter = load_file(tmp_path / "out" / ADAPTER_DIR / "adapter_model.safetensors")
    assert adapter and {t.dtype for t in adapter.values()} == {torch.float32}
    assert any(float(t.abs().sum()) > 0 for name, t in adapter.items() if "lora_B" in name)  # B starts at 0
