"""Checkpoint folders: atomic writes, a clear error on a really full filesystem (a small tmpfs, and
RLIMIT_FSIZE for EFBIG), and retention after a finished iteration."""

from __future__ import annotations

import errno
import json
import os
import resource
import subprocess
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

from rlanything.models.loading import load_model, load_tokenizer
from rlanything.models.training.saving import save_checkpoint, tensor_bytes
from rlanything.models.training.trainer import make_optimizer
from rlanything.storage.checkpoints import CheckpointWriteError, folder_bytes, prune, write_folder
from rlanything.storage.layout import RunLayout

MiB = 2**20


@contextmanager
def tmpfs(path: Path, size: int):
    """A real tmpfs of `size` bytes mounted at `path` (we run as root), unmounted afterwards."""
    path.mkdir(parents=True)
    mount = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True)
    if mount.returncode != 0:  # not root: no tmpfs; the RLIMIT_FSIZE test below still runs
        pytest.skip(f"cannot mount a tmpfs here: {mount.stderr.decode().strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=True)


def entries(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def test_write_folder_replaces_whole_or_not_at_all(tmp_path):
    target = tmp_path / "iter_0001"
    write_folder(target, lambda f: (f / "a.txt").write_text("one"))
    write_folder(target, lambda f: (f / "b.txt").write_text("two"))
    assert entries(target) == ["b.txt"] and entries(tmp_path) == ["iter_0001"]  # replaced, no temporaries

    def broken(folder: Path) -> None:
        (folder / "c.txt").write_text("half")
        raise ValueError("writer broke")

    with pytest.raises(ValueError, match="writer broke"):  # not a full disk: the error passes unchanged
        write_folder(target, broken)
    assert entries(target) == ["b.txt"] and entries(tmp_path) == ["iter_0001"]


def test_a_checkpoint_larger_than_the_free_space_is_refused_before_writing(tiny_model_path, tiny_tokenizer, tmp_path):
    """2 MiB tmpfs, a 12 MiB model + its AdamW state: refused up front with the bytes needed."""
    model = load_model(tiny_model_path)
    optimizer = make_optimizer(model, lr=1e-3, weight_decay=0.0)
    with tmpfs(tmp_path / "disk", 2 * MiB) as disk:
        target = disk / "checkpoints" / "policy" / "iter_0000"
        with pytest.raises(CheckpointWriteError) as err:
            save_checkpoint(model, tiny_tokenizer, optimizer, target)
        needed = tensor_bytes(model.state_dict())  # a fresh AdamW holds no moments yet
        message = str(err.value)
        assert err.value.errno == errno.ENOSPC and str(target) in message
        assert f"needs about {needed / MiB:.1f} MiB" in message and "2.0 MiB are free" in message, message
        assert entries(disk / "checkpoints" / "policy") == []


def test_a_disk_that_fills_during_the_write_leaves_nothing_half_written(tiny_model_path, tmp_path):
    """The free space passes the estimate (weights), then the tokenizer no longer fits: the real
    failure comes from inside the write, the partial folder goes, the previous version stays."""
    model, tokenizer = load_model(tiny_model_path), load_tokenizer(tiny_model_path)
    weights = tensor_bytes(model.state_dict())
    with tmpfs(tmp_path / "disk", weights + MiB // 2) as disk:
        target = disk / "iter_0003"
        write_folder(target, lambda f: (f / "config.json").write_text("{}"))  # an earlier version
        with pytest.raises(CheckpointWriteError, match=rf"cannot write checkpoint {target}: it needs about") as err:
            save_checkpoint(model, tokenizer, None, target)
        assert "were written before it failed and have been removed" in str(err.value)
        assert entries(disk) == ["iter_0003"] and entries(target) == ["config.json"]
        assert folder_bytes(disk) == 2


def test_torch_save_into_a_full_tmpfs_is_recognised(tmp_path):
    """torch.save says "unexpected pos ..." on a full disk, not ENOSPC; the size unknown."""
    with tmpfs(tmp_path / "disk", 2 * MiB) as disk:
        with pytest.raises(CheckpointWriteError, match="needs more space than is left") as err:
            write_folder(disk / "iter_0000", lambda f: torch.save(torch.zeros(MiB), f / "optimizer.pt"))
        assert isinstance(err.value.__cause__, RuntimeError)  # torch's own error, kept as the cause
        assert entries(disk) == []


def test_a_file_size_limit_efbig_is_a_clear_error(tmp_path):
    """RLIMIT_FSIZE (Python ignores SIGXFSZ, so the write fails with EFBIG), any filesystem."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (MiB, hard))
    try:
        with pytest.raises(CheckpointWriteError, match="cannot write checkpoint"):
            write_folder(tmp_path / "iter_0000", lambda f: (f / "big.bin").write_bytes(bytes(2 * MiB)))
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    assert entries(tmp_path) == []


# ---------------------------------------------------------------- retention


def fake_checkpoint(folder: Path, weights: int, optim: int, deepspeed: bool = False) -> None:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")  # 2 bytes
    (folder / "model.safetensors").write_bytes(bytes(weights))
    (folder / "optimizer.pt").write_bytes(bytes(optim))
    if deepspeed:
        (folder / "deepspeed_state").mkdir()
        (folder / "deepspeed_state" / "shard.pt").write_bytes(bytes(optim))


def test_prune_keeps_the_newest_weights_and_only_the_newest_optimizer_state(tmp_path):
    layout = RunLayout(tmp_path / "run")
    for kind in ("policy", "rm"):
        for i in range(5):  # iteration 4 is in progress: a later folder is never touched
            fake_checkpoint(layout.checkpoint(kind, i), weights=100, optim=200, deepspeed=kind == "rm")
    (layout.run_dir / "checkpoints" / "policy" / ".iter_0003.tmp-x1").mkdir()  # a killed write's leftover
    (layout.run_dir / "checkpoints" / "policy" / ".iter_0003.tmp-x1" / "part").write_bytes(bytes(7))

    assert prune(layout, None, 3).removed == []  # None keeps everything
    pruned = prune(layout, 2, 3)
    for kind in ("policy", "rm"):
        names = entries(layout.run_dir / "checkpoints" / kind)
        assert names == ["iter_0002", "iter_0003", "iter_0004"]
        assert entries(layout.checkpoint(kind, 2)) == ["config.json", "model.safetensors"]  # weights only
        assert all("optimizer.pt" in entries(layout.checkpoint(kind, i)) for i in (3, 4))
    assert (layout.checkpoint("rm", 3) / "deepspeed_state").is_dir()
    # policy: 2 whole folders (302 each) + iteration 2's optimizer (200) + the leftover (7);
    # rm: 2 whole folders (502 each) + iteration 2's optimizer and ZeRO state (400)
    assert pruned.bytes_removed == 2 * 302 + 200 + 7 + 2 * 502 + 400
    assert pruned.bytes_on_disk == folder_bytes(layout.run_dir / "checkpoints")
    log = [json.loads(line) for line in (layout.run_dir / "checkpoints" / "pruned.jsonl").read_text().splitlines()]
    assert {r["removed"] for r in log} == {
        "checkpoints/policy/iter_0000",
        "checkpoints/policy/iter_0001",
        "checkpoints/policy/iter_0002/optimizer.pt",
        "checkpoints/policy/.iter_0003.tmp-x1",
        "checkpoints/rm/iter_0000",
        "checkpoints/rm/iter_0001",
        "checkpoints/rm/iter_0002/optimizer.pt",
        "checkpoints/rm/iter_0002/deepspeed_state",
    }
    assert all(r["after_iteration"] == 3 and r["keep"] == 2 for r in log)
    assert prune(layout, 2, 3).removed == []  # idempotent
    with pytest.raises(ValueError, match="at least 1"):
        prune(layout, 0, 3)


def test_prune_never_removes_the_base_of_a_kept_lora_adapter(tmp_path):
    layout = RunLayout(tmp_path / "run")
    fake_checkpoint(layout.checkpoint("policy", 0), weights=10, optim=10)  # the adapter's base
    fake_checkpoint(layout.checkpoint("policy", 1), weights=10, optim=10)
    adapter = layout.checkpoint("policy", 1) / "adapter"
    adapter.mkdir()
    base = {"base_model_name_or_path": str(layout.checkpoint("policy", 0))}
    (adapter / "adapter_config.json").write_text(json.dumps(base))
    pruned = prune(layout, 1, 1)
    assert layout.checkpoint("policy", 0).is_dir() and not (layout.checkpoint("policy", 0) / "optimizer.pt").exists()
    assert [p.name for p in pruned.removed] == ["optimizer.pt"]


def test_optimizer_state_is_saved_once_and_resumes(tiny_model_path, tiny_tokenizer, tmp_path):
    """save_checkpoint writes weights + optimizer.pt in one folder; make_optimizer reads it back."""
    model = load_model(tiny_model_path)
    optimizer = make_optimizer(model, lr=1e-3, weight_decay=0.0)
    model(torch.tensor([[1, 2, 3]])).logits.sum().backward()
    optimizer.step()
    save_checkpoint(model, tiny_tokenizer, optimizer, tmp_path / "iter_0000")
    assert entries(tmp_path) == ["iter_0000"] and (tmp_path / "iter_0000" / "optimizer.pt").is_file()
    resumed = make_optimizer(load_model(tmp_path / "iter_0000"), 1e-3, 0.0, tmp_path / "iter_0000" / "optimizer.pt")
    assert int(next(iter(resumed.state.values()))["step"]) == 1
    assert os.stat(tmp_path / "iter_0000").st_mode & 0o777 == 0o755
