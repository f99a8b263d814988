"""What an update trains: LoRA (peft) adapters over a frozen base, or only the top decoder layers
(`train_top_layers`); otherwise every weight.

Why: the update step then holds AdamW moments for ~1% of the weights, and a 7B policy trains
on one GPU. How it fits the loop:

* A checkpoint folder (`saving.save_checkpoint` writes it) always carries the adapter in
  `adapter/` (peft format; its `adapter_config.json` names the *original* base folder in
  `base_model_name_or_path`) and the AdamW moments of the adapter weights in `optimizer.pt`. The next update loads base + adapter
  and continues training the same adapter, so the moments stay meaningful across iterations.
* `save: merged` (default) also writes base + adapter merged into full HF weights at the top of
  the folder: the rollout, the RM and vLLM load a plain folder and never see peft.
* `save: adapter` writes only the adapter (plus config.json and the tokenizer): a few MB per
  checkpoint instead of the whole model; `loading.load_model` recognises such a folder and
  merges in memory. vLLM cannot serve it (config validation says so).

Departures: merged weights are rounded to the model dtype once, so in bfloat16 the rollout's
log-probs (merged) and the trainer's (base + adapter) differ by rounding, not only by the
update; in float32 they agree to ~1e-6. Dropout defaults to 0 for the same reason (a dropout
>0 makes the trainer's log-probs stochastic and PPO's first ratio ≠ 1).
"""

from __future__ import annotations

from pathlib import Path

from rlanything.models.loading import ADAPTER_DIR, adapter_base, load_model, load_tokenizer


def add_adapters(model, lora, seed: int = 0):
    """Wrap `model` with fresh LoRA adapters (`lora`: rlanything.config.LoraConfig).

    B starts at zero, so the wrapped model computes exactly what `model` did; A's random init
    is drawn from `seed` (the caller's RNG is left untouched), so a rerun is identical.
    """
    import peft
    import torch

    targets = "all-linear" if lora.target_modules == ["all-linear"] else list(lora.target_modules)
    config = peft.LoraConfig(
        r=lora.r,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=targets,
        bias="none",
        task_type="CAUSAL_LM",
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return peft.get_peft_model(model, config)


def load_for_training(start: Path, dtype: str, lora, seed: int = 0):
    """Model to update from checkpoint folder `start` -> (model, tokenizer).

    LoRA off: the full model, all weights trainable. LoRA on: if `start` holds an adapter, its
    base + that adapter (trainable); otherwise `start` itself + fresh adapters (iteration 0, or
    a run that switches to LoRA).
    """
    start = Path(start)
    tokenizer = load_tokenizer(start)
    if not lora.enabled:
        return load_model(start, dtype), tokenizer
    if (start / ADAPTER_DIR / "adapter_config.json").is_file():
        import peft

        base = load_model(adapter_base(start), dtype)
        model = peft.PeftModel.from_pretrained(base, start / ADAPTER_DIR, is_trainable=True)
    else:
        model = add_adapters(load_model(start, dtype), lora, seed)
        # Record the absolute base folder: the adapter is meaningless without it.
        model.peft_config["default"].base_model_name_or_path = str(start.resolve())
    return model.eval(), tokenizer


def train_top_layers(model, n: int) -> None:
    """Leave trainable only the last `n` decoder layers, the final norm and an LM head not tied
    to the input embeddings (`optim.train_top_layers`); freeze the rest. The backward then stops
    at the first trainable layer, and AdamW keeps moments for the trained weights alone. The
    trained weights' gradients are the full model's: freezing drops the others, it changes none.

    Worked example: SmolLM2-135M has 30 layers; n = 4 trains layers 26-29 and the final norm
    (its LM head is the embedding matrix: frozen), 14.2M of its 134.5M weights."""
    decoder = model.get_decoder()
    layers = getattr(decoder, "layers", None)
    if layers is None or not 1 <= n <= len(layers):
        have = "no decoder layers" if layers is None else f"{len(layers)} decoder layers"
        raise ValueError(f"optim.train_top_layers {n}: the model has {have}")
    model.requires_grad_(False)
    for module in (*layers[-n:], getattr(decoder, "norm", None)):
        if module is not None:
            module.requires_grad_(True)
    head, embeddings = model.get_output_embeddings(), model.get_input_embeddings()
    if head is not None and head.weight is not embeddings.weight:
        head.requires_grad_(True)
