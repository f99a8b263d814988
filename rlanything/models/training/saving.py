"""Writing a checkpoint folder: `save_checkpoint`, the one writer of model weights.

A checkpoint folder holds the HF weights (safetensors, `config.json`, generation config) and
the tokenizer, or for a LoRA model the adapter in `adapter/` plus merged weights or, with
`lora.save: adapter`, only `config.json` and the tokenizer (models/training/lora.py says why); and, for
resuming AdamW's moments, `optimizer.pt`. `loading.load_model` reads every kind back.
The folder is replaced whole or not at all (`storage.checkpoints.write_folder`): it is complete
before it appears, and a full disk leaves nothing behind and raises `CheckpointWriteError`.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

from rlanything.models.loading import ADAPTER_DIR
from rlanything.patching import swapped
from rlanything.storage.checkpoints import OPTIMIZER_STATE, write_folder

LORA_SAVES = ("merged", "adapter")


def save_checkpoint(model, tokenizer, optimizer, out_dir: Path, lora_save: str | None = None, state_dict=None) -> None:
    """Write the checkpoint folder `out_dir`, replacing it whole or not at all (a full disk
    raises `storage.checkpoints.CheckpointWriteError` and leaves nothing behind): the HF weights
    and tokenizer (`state_dict` replaces the model's own, as DeepSpeed ZeRO-3 gathers them), or
    with `lora_save` ("merged" / "adapter") the LoRA folder of `models.training.lora`, plus `optimizer.pt`
    for resuming AdamW's moments (skipped when `optimizer` is None: a model folder alone, or
    DeepSpeed, which keeps its own).

    With `lora_save: merged` the adapters are merged into the base weights in place (peft's
    merge_and_unload): that consumes `model`, so save it last.
    """
    if lora_save is not None and lora_save not in LORA_SAVES:
        raise ValueError(f"lora.save must be merged or adapter, got {lora_save!r}")

    def write(folder: Path) -> None:
        if optimizer is not None:  # first: merging LoRA adapters changes the model in place
            torch.save(optimizer.state_dict(), folder / OPTIMIZER_STATE)
        if lora_save is not None:
            _write_lora_files(model, tokenizer, folder, lora_save)
        else:
            _write_model_files(model, tokenizer, folder, state_dict)

    if lora_save is not None:
        weights = _lora_bytes(model, lora_save)
    else:
        weights = tensor_bytes(state_dict if state_dict is not None else model.state_dict())
    write_folder(Path(out_dir), write, weights + (tensor_bytes(optimizer.state_dict()) if optimizer is not None else 0))


def tensor_bytes(state: dict) -> int:
    """Bytes of the distinct tensors in a (possibly nested) state dict: what saving it writes,
    give or take headers (tied weights are counted once)."""
    seen, total, stack = set(), 0, [state]
    while stack:
        item = stack.pop()
        if isinstance(item, torch.Tensor):
            key = (item.untyped_storage().data_ptr(), item.storage_offset(), item.numel()) if item.numel() else id(item)
            if key not in seen:
                seen.add(key)
                total += item.numel() * item.element_size()
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
    return total


def _lora_bytes(model, save: str) -> int:
    """About what `_write_lora_files` writes: the adapter, plus the merged weights if `merged`."""
    adapter = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    base = tensor_bytes(model.get_base_model().state_dict()) if save == "merged" else 0
    return adapter + base


def _write_model_files(model, tokenizer, folder: Path, state_dict=None) -> None:
    """Model (safetensors) + tokenizer into an existing folder. ``state_dict`` replaces the
    model's own weights (DeepSpeed ZeRO-3 gathers them into one)."""
    with _deepspeed_left_alone():
        model.save_pretrained(folder, safe_serialization=True, state_dict=state_dict)
    tokenizer.save_pretrained(folder)


def _write_lora_files(model, tokenizer, folder: Path, save: str) -> None:
    """The adapter in `folder/adapter/`, and merged weights or (`save: adapter`) only config.json
    and the tokenizer at the top of `folder` (an existing folder). Consumes `model`."""
    folder = Path(folder)
    model.save_pretrained(folder / ADAPTER_DIR)  # adapter_config.json + adapter_model.safetensors
    if save == "merged":
        _write_model_files(model.merge_and_unload(), tokenizer, folder)
    else:
        base = model.get_base_model()
        base.config.save_pretrained(folder)
        base.generation_config.save_pretrained(folder)
        tokenizer.save_pretrained(folder)


@contextmanager
def _deepspeed_left_alone() -> Iterator[None]:
    """``save_pretrained`` unwraps the model through accelerate, which imports DeepSpeed whenever
    it is installed only to test ``isinstance(model, DeepSpeedEngine)``: seconds of imports and
    DeepSpeed's "Setting accelerator to CPU" warning in every run of the torch backend. No model
    saved here is a DeepSpeedEngine (the ZeRO path unwraps it first), so while DeepSpeed is not
    imported yet, accelerate is told it is not there; once a ZeRO run imported it, nothing changes."""
    if "deepspeed" in sys.modules:
        yield
        return
    import accelerate.utils.other

    with swapped(accelerate.utils.other, "is_deepspeed_available", lambda: False):
        yield
