"""Checkpoint folders on disk: written whole or not at all, measured, and pruned to the newest K.

Writing (`write_folder`): the files go into a temporary folder beside the target, which is then
renamed into place, so a checkpoint folder that exists is complete; resume and the next
iteration never read a half-written one. When the disk (or a quota, or a file-size limit) runs
out, the partial temporary folder is removed and `CheckpointWriteError` names the target, the
bytes needed where the caller knows them, and the free space. The libraries that write weights
report a full disk in their own words (safetensors: "No space left on device (os error 28)";
torch.save: "unexpected pos 576 vs 534"), so a failure counts as a full disk when its errno or
message says so, or when less space is left than the write still needed.

Retention (`prune`): after iteration N is marked done, iteration N+1 starts from N's weights and
AdamW state, and a crash anywhere in N+1 resumes from them again; nothing older is read by the
loop. With `run.keep_checkpoints = K` the weights of iterations N-K+1..N stay, the optimizer
state only in N's folder, everything older goes. Each removal is appended to
`checkpoints/pruned.jsonl`.

Identity (`weights_digest`): a digest of what a folder holds for generation (weights, model and
generation config, tokenizer; not the optimizer state), by which a held-out evaluation knows the
policy it plays has not changed since an earlier one (agent/eval_parts.py).
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from rlanything.storage.layout import RunLayout

FULL_DISK_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
_FULL_DISK_TEXT = re.compile(r"no space left|disk quota exceeded|file too large|os error (28|122|27)\b", re.I)
OPTIMIZER_STATE = "optimizer.pt"  # AdamW's moments in a checkpoint folder (models.training.saving writes it)
OPTIMIZER_FILES = (OPTIMIZER_STATE, "deepspeed_state")  # AdamW moments: torch, DeepSpeed ZeRO
KINDS = ("policy", "rm")
_ITER = re.compile(r"iter_(\d+)$")


class CheckpointWriteError(OSError):
    """A checkpoint could not be written because the disk, a quota or a file-size limit is full."""


def free_bytes(path: Path) -> int:
    """Bytes an unprivileged writer may still use on the filesystem holding `path`."""
    path = Path(path)
    while not path.exists():
        path = path.parent
    stat = os.statvfs(path)
    return stat.f_bavail * stat.f_frsize


def folder_bytes(path: Path) -> int:
    """Total size of the regular files under `path` (0 if it does not exist)."""
    path = Path(path)
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def weights_digest(folder: Path) -> str | None:
    """sha256 (hex) of the files of a model folder that decide what it generates: every file but
    the optimizer state (`OPTIMIZER_FILES`), path, size and bytes, in path order (the tokenizer's
    padding side left out: `_tokenizer_config`); None where `folder` is no folder (nothing to
    compare it by). Two folders with the same digest generate alike; a frozen update
    (`optim.frozen`) writes the same files again, so its checkpoints share one. A LoRA `save:
    adapter` folder names its base by path (adapter_config.json): the base's files are not
    hashed. Reads every byte once (about a second per 500 MB)."""
    folder = Path(folder)
    if not folder.is_dir():
        return None
    digest = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        relative = path.relative_to(folder)
        if relative.parts[0] in OPTIMIZER_FILES or relative.name.startswith("."):
            continue
        if relative.as_posix() == "tokenizer_config.json":
            data = _tokenizer_config(path)
            digest.update(f"{relative.as_posix()}\0{len(data)}\0".encode() + data)
            continue
        digest.update(f"{relative.as_posix()}\0{path.stat().st_size}\0".encode())
        with open(path, "rb") as handle:
            while block := handle.read(1 << 22):
                digest.update(block)
    return digest.hexdigest()


def _tokenizer_config(path: Path) -> bytes:
    """tokenizer_config.json without `padding_side`: a checkpoint saves the tokenizer as
    `models.loading.load_tokenizer` left it (padding_side left), its base model folder may not
    name it, and every load sets it again: it decides nothing (a frozen policy's first checkpoint
    then shares its base model's digest)."""
    try:
        data = json.loads(path.read_text())
    except ValueError:
        return path.read_bytes()
    if isinstance(data, dict):
        data.pop("padding_side", None)
    return json.dumps(data, sort_keys=True).encode()


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


def _is_full_disk(exc: BaseException, free: int, still_needed: int | None) -> bool:
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:  # the exception and its causes
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno in FULL_DISK_ERRNOS:
            return True
        if _FULL_DISK_TEXT.search(str(exc)):
            return True
        exc = exc.__cause__ or exc.__context__
    return free < 2**20 or (still_needed is not None and free < still_needed)


def _full_disk_error(target: Path, needed: int | None, free: int, written: int | None = None) -> CheckpointWriteError:
    need = f"needs about {_mib(needed)}" if needed is not None else "needs more space than is left"
    done = f" ({_mib(written)} were written before it failed and have been removed)" if written else ""
    return CheckpointWriteError(
        errno.ENOSPC,
        f"cannot write checkpoint {target}: it {need}, and {_mib(free)} are free on its filesystem{done}. "
        "Free space there, or keep fewer checkpoints (run.keep_checkpoints), then resume the run",
        str(target),
    )


def write_folder(target: Path, write: Callable[[Path], None], needed_bytes: int | None = None) -> Path:
    """Run `write(tmp)` on an empty folder beside `target`, then rename it to `target`, replacing
    a previous `target` (moved aside first, put back if the rename fails, deleted after).

    Any failure removes the temporary folder and leaves `target` as it was. `needed_bytes` (an
    estimate, if known) is checked against the free space before anything is written. A full
    disk raises `CheckpointWriteError`; other errors propagate unchanged.
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    if needed_bytes is not None and (free := free_bytes(target.parent)) < needed_bytes:
        raise _full_disk_error(target, needed_bytes, free)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    old = tmp.with_name(tmp.name + "-old")
    try:
        write(tmp)
        tmp.chmod(0o755)  # mkdtemp makes it private
        if target.exists():
            os.replace(target, old)
        os.replace(tmp, target)
    except BaseException as exc:
        if old.exists() and not target.exists():
            os.replace(old, target)  # put the previous version back
        written = folder_bytes(tmp) if tmp.exists() else 0
        shutil.rmtree(tmp, ignore_errors=True)
        free = free_bytes(target.parent)
        still = None if needed_bytes is None else needed_bytes - written
        # At the failure the partial files still took `written` bytes of the free space.
        if isinstance(exc, Exception) and _is_full_disk(exc, free - written, still):
            raise _full_disk_error(target, needed_bytes, free, written) from exc
        raise
    finally:
        shutil.rmtree(old, ignore_errors=True)
    return target


# ---------------------------------------------------------------- retention


@dataclass
class Pruned:
    """What one `prune` removed, and what is left."""

    removed: list[Path] = field(default_factory=list)
    bytes_removed: int = 0
    bytes_on_disk: int = 0  # everything under checkpoints/ afterwards

    def metrics(self) -> dict[str, float]:
        return {"checkpoint/bytes_removed": self.bytes_removed, "checkpoint/bytes_on_disk": self.bytes_on_disk}


def _iterations(kind_dir: Path) -> dict[int, Path]:
    found = (_ITER.match(p.name) for p in kind_dir.iterdir()) if kind_dir.is_dir() else ()
    return {int(m.group(1)): kind_dir / m.group(0) for m in found if m}


def _adapter_bases(folders) -> set[Path]:
    """Base folders that kept LoRA checkpoints' adapters name: never removed."""
    bases = set()
    for folder in folders:
        config = folder / "adapter" / "adapter_config.json"
        if config.is_file():
            bases.add(Path(json.loads(config.read_text())["base_model_name_or_path"]).resolve())
    return bases


def prune(layout: RunLayout, keep: int | None, current: int) -> Pruned:
    """Remove what no later step can read once iteration `current` is done (module docstring).

    `keep` None keeps everything. Call it only after `current` is marked done, under the run's
    lock: leftover temporary folders of killed writes are removed too.
    """
    result = Pruned()
    root = layout.run_dir / "checkpoints"
    if keep is not None:
        if keep < 1:
            raise ValueError(f"keep must be at least 1 (the next iteration starts from the newest), got {keep}")
        doomed: list[Path] = []
        for kind in KINDS:
            kind_dir = root / kind
            folders = _iterations(kind_dir)
            kept = [p for i, p in folders.items() if current - keep < i <= current]
            protected = _adapter_bases(kept)
            for i, path in sorted(folders.items()):
                if i <= current - keep and path.resolve() not in protected:
                    doomed.append(path)
                elif i < current:  # a kept older iteration: weights only
                    doomed += [path / name for name in OPTIMIZER_FILES if (path / name).exists()]
            if kind_dir.is_dir():  # partial writes of killed processes (write_folder's temporaries)
                doomed += [p for p in kind_dir.iterdir() if p.name.startswith(".iter_")]
        for path in doomed:
            size = folder_bytes(path)
            shutil.rmtree(path) if path.is_dir() else path.unlink()
            result.removed.append(path)
            result.bytes_removed += size
        if doomed:
            root.mkdir(parents=True, exist_ok=True)
            with open(root / "pruned.jsonl", "a") as log:
                for path in doomed:
                    log.write(
                        json.dumps(
                            {
                                "after_iteration": current,
                                "keep": keep,
                                "time": time.time(),
                                "removed": path.relative_to(layout.run_dir).as_posix(),
                            }
                        )
                        + "\n"
                    )
    result.bytes_on_disk = folder_bytes(root)
    return result
