"""LoRA (peft) for the policy and the RM: train small adapters, keep the base frozen.

Why: the update step then holds AdamW moments for ~1% of the weights, and a 7B policy trains
on one GPU. How it fits the loop:

* A checkpoint folder always carries the adapter in `adapter/` (peft format; its
  `adapter_config.json` names the *original* base folder in `base_model_name_or_path`) and the
  AdamW moments of the adapter weights in `optimizer.pt`. The next update loads base + adapter
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

import json
from pathlib import Path

ADAPTER_DIR = "adapter"


def is_adapter_only(path: Path) -> bool:
    """A checkpoint saved with `save: adapter`: an adapter and no full weights."""
    path = Path(path)
    has_weights = any(path.glob("*.safetensors")) or any(path.glob("*.bin"))
    return (path / ADAPTER_DIR / "adapter_config.json").is_file() and not has_weights


def adapter_base(path: Path) -> Path:
    """The base folder an adapter checkpoint was trained on (from its adapter_config.json)."""
    config = json.loads((Path(path) / ADAPTER_DIR / "adapter_config.json").read_text())
    return Path(config["base_model_name_or_path"])


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
    from rlanything.models.loading import load_model, load_tokenizer

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


def load_merged(path: Path, dtype: str):
    """An adapter-only checkpoint as a plain model: base + adapter, merged in memory."""
    import peft

    from rlanything.models.loading import load_model

    base = load_model(adapter_base(path), dtype)
    return peft.PeftModel.from_pretrained(base, Path(path) / ADAPTER_DIR).merge_and_unload().eval()


def save_lora_checkpoint(model, tokenizer, out_dir: Path, save: str) -> None:
    """Write a LoRA model's checkpoint folder (see the module docstring); `out_dir` is replaced,
    whole or not at all (`storage.checkpoints.write_folder`).

    Consumes `model`: with `save: merged` the adapters are merged into the base weights in
    place (peft's merge_and_unload), so call this last.
    """
    from rlanything.storage.checkpoints import write_folder

    needed = lora_bytes(model, save)
    write_folder(Path(out_dir), lambda folder: write_lora_files(model, tokenizer, folder, save), needed)


def lora_bytes(model, save: str) -> int:
    """About what `write_lora_files` writes: the adapter, plus the merged weights if `merged`."""
    from rlanything.models.loading import tensor_bytes

    adapter = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    base = tensor_bytes(model.get_base_model().state_dict()) if save == "merged" else 0
    return adapter + base


def write_lora_files(model, tokenizer, folder: Path, save: str) -> None:
    """The adapter in `folder/adapter/`, and merged weights or (`save: adapter`) only config.json
    and the tokenizer at the top of `folder` (an existing, empty folder). Consumes `model`."""
    from rlanything.models.loading import write_model_files

    if save not in ("merged", "adapter"):
        raise ValueError(f"lora.save must be merged or adapter, got {save!r}")
    folder = Path(folder)
    model.save_pretrained(folder / ADAPTER_DIR)  # adapter_config.json + adapter_model.safetensors
    if save == "merged":
        write_model_files(model.merge_and_unload(), tokenizer, folder)
    else:
        base = model.get_base_model()
        base.config.save_pretrained(folder)
        base.generation_config.save_pretrained(folder)
        tokenizer.save_pretrained(folder)
