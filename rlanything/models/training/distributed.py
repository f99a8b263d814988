"""One policy or RM update, in this process or under `accelerate launch` (DDP, DeepSpeed ZeRO).

The update step (tasks/update.py) describes an update as an `UpdateJob`: the checkpoint it
starts from, the one it writes, the optimizer and PPO settings, and the samples. `run_update`
executes it with the same loss code (`trainer.ppo_update` → `algo.losses.ppo_clip_loss`) on
either backend:

* `torch` — plain autograd in the calling process (one CPU or GPU; the default);
* `accelerate` — an `accelerate.Accelerator` wraps model and optimizer. In-process it is a
  single process (useful on one GPU for mixed precision, and as the CPU test of this path).
  With `train.launch` set, the step writes the job to `<job>.json` + `<job>.samples.parquet`
  and runs `<launch...> -m rlanything.models.training.distributed <job>.json`, e.g.

      accelerate launch --config_file configs/accelerate/deepspeed_zero2.yaml \\
          -m rlanything.models.training.distributed runs/NAME/iter_0003/.jobs/policy_update.json

  Every process reads the job, trains on its share of each mini-batch, and process 0 writes
  the checkpoint and `<job>.history.json`. A job file holds absolute paths only, so on a
  multi-node cluster (shared filesystem) the same command runs on each node with the
  launcher's node flags (`--num_machines`, `--machine_rank`, `--main_process_ip`).

DeepSpeed notes: rlanything sets the ZeRO `gradient_clipping` from `optim.grad_clip`
(ACCELERATE_GRADIENT_CLIPPING), keeps its own AdamW (the DeepSpeed config has no optimizer
section), and stores the ZeRO optimizer state in the checkpoint's `deepspeed_state/` (loaded
by the next update when it runs with the same number of processes; otherwise AdamW restarts).
That state is written into the checkpoint folder after the folder itself appears (a collective
of all processes); the update step's Parquet, written last, is what marks the step done.
LoRA works with ZeRO 0–2; ZeRO-3 partitions the frozen base too, and merging a partitioned
model is not supported here: use ZeRO-2 with LoRA.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from rlanything import memory, procs
from rlanything.algo.schedule import learning_rate
from rlanything.models.loading import ADAPTER_DIR, load_model, resolve_device
from rlanything.models.precision import ACCELERATE_PRECISION, dither_to_bf16_
from rlanything.models.training.lora import load_for_training, train_top_layers
from rlanything.models.training.saving import OPTIMIZER_STATE, save_checkpoint
from rlanything.models.training.trainer import (
    Sample,
    TorchBackend,
    autocast_for,
    checkpoint_layers,
    make_optimizer,
    ppo_update,
    with_anchor_logprobs,
)

log = logging.getLogger(__name__)

DEEPSPEED_STATE = "deepspeed_state"


@dataclass
class UpdateJob:
    start: str  # checkpoint folder the update starts from (weights, optimizer.pt, adapter/)
    out: str  # checkpoint folder to write
    precision: str  # fp32 | bf16 (autocast over fp32 weights), resolved (models/precision.py)
    lora: dict  # rlanything.config.LoraConfig as a dict
    lr: float
    weight_decay: float
    grad_clip: float
    updates: int
    micro_batch_size: int
    temperature: float
    clip_eps: float
    kl_beta: float
    seed: int
    epochs: int = 1  # passes over the samples
    # lr schedule (algo/schedule.py): the update's k-th optimizer step is the run's step first_step + k
    first_step: int = 0
    warmup_steps: int = 0
    schedule: str = "constant"
    total_steps: int = 0
    min_lr_ratio: float = 0.0
    device: str = "auto"  # backend torch: where the model trains (config `device`)
    recompute_old: bool = False  # the trainer's own pre-update log-probs (algo.old_logprobs)
    tis_cap: float | None = None  # truncated importance sampling against the sampler (algo.tis_cap)
    anchor: str | None = None  # the run's starting weights, for the anchor KL (optim.anchor_beta)
    anchor_beta: float = 0.0
    gradient_checkpointing: bool = False  # optim.gradient_checkpointing
    train_top_layers: int | None = None  # optim.train_top_layers: only the last N decoder layers train
    memory_gb: float | None = None  # run.memory_gb: the budget of each process of a launched update
    # "bf16": a bf16 sampler ran the start weights; place them within its values first, so that
    # it sees each step in proportion (precision.dither_to_bf16_)
    dither_start_to: str | None = None
    extra: dict = field(default_factory=dict)  # free-form notes (kind, iteration) for logs


class AccelerateBackend:
    """The `TrainBackend` of an `accelerate.Accelerator` (one or many processes, DDP or DeepSpeed)."""

    def __init__(self, accelerator):
        self.accelerator = accelerator
        self.rank, self.world_size = _rank_world()

    @contextlib.contextmanager
    def accumulate(self, model, sync: bool):
        # DeepSpeed steps inside backward() at the boundary; DDP skips the all-reduce before it.
        self.accelerator.sync_gradients = sync
        with contextlib.nullcontext() if sync else self.accelerator.no_sync(model):
            yield

    def backward(self, loss: torch.Tensor) -> None:
        self.accelerator.backward(loss)

    def clip_and_step(self, model, optimizer, max_norm: float) -> float:
        params = [p for p in model.parameters() if p.requires_grad]
        grad_norm = self.accelerator.clip_grad_norm_(params, max_norm)  # DeepSpeed: its own norm
        optimizer.step()  # a no-op under DeepSpeed (the engine stepped at the boundary)
        return float(grad_norm) if grad_norm is not None else float("nan")

    def reduce_sum(self, values: list[float]) -> list[float]:
        tensor = torch.tensor(values, dtype=torch.float64, device=self.accelerator.device)
        if self.world_size > 1:
            torch.distributed.all_reduce(tensor)
        return tensor.tolist()


def _rank_world() -> tuple[int, int]:
    """From torch.distributed itself: under DeepSpeed on CPU, accelerate's own state reports a
    single process although DeepSpeed runs (and all-reduces over) all of them."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


def _barrier() -> None:
    if _rank_world()[1] > 1:
        torch.distributed.barrier()


def _anchored(job: UpdateJob, model, samples: list[Sample], pad_id: int, device: str) -> list[Sample]:
    """`samples` with the anchor's log-probs where the job has an anchor KL, else as they are;
    computed before the training model is placed or wrapped (accelerate, DeepSpeed), on `device`.

    With LoRA the anchor is `model` with its adapter off: exactly the adapter's base (the run's
    start, unless the run switched to LoRA later), in the base's own dtype, nothing loaded. Else
    the anchor's full weights are loaded in fp32 for this and dropped, run under the update's
    autocast as the trainer runs; under DeepSpeed bf16, whose weights are bf16 themselves, the
    two differ by bf16 rounding."""
    if not job.anchor_beta or not samples:
        return samples
    lora = _lora(job).enabled
    anchor = model.to(device) if lora else load_model(Path(job.anchor), "float32", device)
    with model.disable_adapter() if lora else contextlib.nullcontext():
        autocast = autocast_for(anchor, job.precision)
        return with_anchor_logprobs(anchor, samples, pad_id, job.temperature, job.micro_batch_size, autocast)


def _process_device() -> str:
    """Where this process of `accelerate launch` computes before accelerate places it: its GPU
    (LOCAL_RANK), or the CPU."""
    if torch.cuda.is_available():
        return f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}"
    return "cpu"


def _lora(job: UpdateJob):
    from rlanything.config import LoraConfig

    return LoraConfig(**job.lora)


def _optimizer_state(job: UpdateJob) -> Path | None:
    """optimizer.pt of `start` if it matches what we train (adapter moments vs all weights)."""
    start = Path(job.start)
    has_adapter = (start / ADAPTER_DIR / "adapter_config.json").is_file()
    return start / OPTIMIZER_STATE if has_adapter == _lora(job).enabled else None


def _save(model, tokenizer, optimizer, job: UpdateJob, state_dict=None) -> None:
    lora = _lora(job)
    save_checkpoint(model, tokenizer, optimizer, Path(job.out), lora.save if lora.enabled else None, state_dict)


def run_update(
    job: UpdateJob,
    samples: list[Sample],
    backend: str = "torch",
    on_micro_batch: Callable[[int], None] = lambda n: None,
) -> list[dict]:
    """Load `job.start`, `job.epochs` PPO passes over `samples`, write `job.out` -> optimizer-step stats.

    backend "torch": plain loop; "accelerate": `Accelerator()` as configured by the
    environment (`accelerate launch` sets it; in a plain process: one process, CPU or GPU).
    """
    # fp32 master weights; with LoRA only the adapters train (peft keeps them fp32), so a frozen
    # base loads in the update's precision
    base = "bfloat16" if _lora(job).enabled and job.precision == "bf16" else "float32"
    model, tokenizer = load_for_training(Path(job.start), base, _lora(job), seed=job.seed)
    if job.dither_start_to == "bf16":
        dither_to_bf16_(model, job.seed)
    if job.train_top_layers:
        train_top_layers(model, job.train_top_layers)
    if job.gradient_checkpointing:
        checkpoint_layers(model)
    device = resolve_device(job.device) if backend == "torch" else _process_device()
    # before accelerate (a ZeRO-3 Accelerator would partition a model loaded after it)
    samples = _anchored(job, model, samples, tokenizer.pad_token_id, device)
    if backend == "torch":
        model.to(device)  # before the optimizer: its resumed moments land there too
    optimizer = make_optimizer(model, job.lr, job.weight_decay, _optimizer_state(job))
    kwargs = dict(
        pad_id=tokenizer.pad_token_id,
        temperature=job.temperature,
        clip_eps=job.clip_eps,
        kl_beta=job.kl_beta,
        grad_clip=job.grad_clip,
        updates=job.updates,
        micro_batch_size=job.micro_batch_size,
        seed=job.seed,
        epochs=job.epochs,
        lr_at=lambda k: learning_rate(
            job.first_step + k,
            job.lr,
            warmup_steps=job.warmup_steps,
            schedule=job.schedule,
            total_steps=job.total_steps,
            min_lr_ratio=job.min_lr_ratio,
        ),
        on_micro_batch=on_micro_batch,
        precision=job.precision,
        recompute_old=job.recompute_old,
        tis_cap=job.tis_cap,
        anchor_beta=job.anchor_beta,
    )
    if backend == "torch":
        history = ppo_update(model, optimizer, samples, backend=TorchBackend(), **kwargs)
        _save(model.cpu(), tokenizer, optimizer, job)
        return history
    if backend != "accelerate":
        raise ValueError(f"train backend must be torch or accelerate, got {backend!r}")
    return _accelerate_update(job, model, tokenizer, optimizer, samples, kwargs)


def _accelerate_update(job, model, tokenizer, optimizer, samples, kwargs) -> list[dict]:
    from accelerate import Accelerator
    from accelerate.utils import DistributedType

    os.environ["ACCELERATE_GRADIENT_CLIPPING"] = str(job.grad_clip)  # DeepSpeed clips in its step
    accelerator = Accelerator()  # configured by `accelerate launch` (env), else one process
    deepspeed = accelerator.distributed_type == DistributedType.DEEPSPEED
    # accelerate (and DeepSpeed) run the arithmetic its config names: it must be the one the run
    # resolved and recorded, or the run would log one precision and train in another
    mixed = ACCELERATE_PRECISION.get(str(accelerator.mixed_precision), str(accelerator.mixed_precision))
    if mixed != job.precision:
        raise ValueError(
            f"the update's precision is {job.precision} (optim.precision, precision.json) but the accelerate "
            f"config runs mixed_precision {accelerator.mixed_precision!r}: set optim.precision to match it, "
            "or mixed_precision in the accelerate config"
        )
    kwargs = {**kwargs, "precision": "fp32"}  # accelerate autocasts the prepared model itself
    rank, world = _rank_world()
    print(
        f"rlanything update {job.extra}: {accelerator.distributed_type} on {accelerator.device}, "
        f"process {rank}/{world}",
        flush=True,
    )
    lora = _lora(job).enabled
    if deepspeed:
        if accelerator.state.deepspeed_plugin.zero_stage == 3 and lora:
            raise ValueError("LoRA with DeepSpeed ZeRO-3 is not supported: use ZeRO-2 (configs/accelerate)")
        # DeepSpeed checks its batch bookkeeping against these; our loop accumulates itself.
        ds_config = accelerator.state.deepspeed_plugin.deepspeed_config
        ds_config["train_micro_batch_size_per_gpu"] = job.micro_batch_size
        ds_config["gradient_accumulation_steps"] = 1
        ds_config["train_batch_size"] = job.micro_batch_size * world
    model, optimizer = accelerator.prepare(model, optimizer)
    state = Path(job.start) / DEEPSPEED_STATE
    if deepspeed and (state / f"world_{world}").exists():  # ZeRO shards match only the same world
        model.load_checkpoint(str(state), tag="state", load_module_strict=False, load_lr_scheduler_states=False)
    history = ppo_update(model, optimizer, samples, backend=AccelerateBackend(accelerator), **kwargs)
    _barrier()
    state_dict = accelerator.get_state_dict(model) if deepspeed and not lora else None  # gathers ZeRO-3
    if rank == 0:
        _save(accelerator.unwrap_model(model), tokenizer, None if deepspeed else optimizer.optimizer, job, state_dict)
    _barrier()
    if deepspeed:  # the ZeRO-partitioned AdamW state, for the next update (collective)
        model.save_checkpoint(str(Path(job.out) / DEEPSPEED_STATE), tag="state", exclude_frozen_parameters=lora)
        if rank == 0:
            (Path(job.out) / DEEPSPEED_STATE / f"world_{world}").touch()
    _barrier()
    return history


# -- running a job in other processes ---------------------------------------------------------


def write_job(job: UpdateJob, samples: list[Sample], path: Path) -> Path:
    """<path> (JSON) + <path>.samples.parquet; the worker reads both."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    table = pa.table(
        {
            "input_ids": pa.array([s.input_ids for s in samples], pa.list_(pa.int32())),
            "response_len": pa.array([s.response_len for s in samples], pa.int32()),
            "old_logprobs": pa.array([s.old_logprobs for s in samples], pa.list_(pa.float32())),
            "advantage": pa.array([s.advantage for s in samples], pa.float32()),
            "trained": pa.array([s.trained for s in samples], pa.list_(pa.bool_())),
            "replayed": pa.array([s.replayed for s in samples], pa.bool_()),
            "unit": pa.array([s.unit for s in samples], pa.int64()),
            "stratum": pa.array([s.stratum for s in samples], pa.int64()),
        }
    )
    pq.write_table(table, f"{path}.samples.parquet")
    path.write_text(json.dumps(asdict(job), indent=1))
    return path


def read_job(path: Path) -> tuple[UpdateJob, list[Sample]]:
    import pyarrow.parquet as pq

    job = UpdateJob(**json.loads(Path(path).read_text()))
    rows = pq.read_table(f"{path}.samples.parquet").to_pylist()
    samples = [
        Sample(
            r["input_ids"],
            r["response_len"],
            r["old_logprobs"],
            r["advantage"],
            trained=r["trained"],
            replayed=r["replayed"],
            unit=r["unit"],
            stratum=r["stratum"],
        )
        for r in rows
    ]
    return job, samples


# A torch extension (DeepSpeed JIT-builds its CPU shared-memory all-reduce op in every process)
# builds in ~40 s on 2 cores; a lock this old was left by a killed build, not held by a live one.
STALE_BUILD_LOCK_S = 1800.0


def clear_stale_build_locks(max_age_s: float = STALE_BUILD_LOCK_S) -> list[Path]:
    """Remove torch extension build locks older than max_age_s; -> the ones removed.

    torch.utils.cpp_extension builds an op under `<root>/<py_accel>/<name>/` while holding the
    file `lock` there, and every other process waits for that file to go. A build killed
    mid-way (Ctrl-C, a timeout) leaves it behind, and each later DeepSpeed launch then waits on
    it forever. Younger locks are kept (a build may be running) and logged.
    """
    from torch.utils.cpp_extension import get_default_build_root

    root = Path(os.environ.get("TORCH_EXTENSIONS_DIR") or get_default_build_root())
    removed = []
    for lock in [*root.glob("*/lock"), *root.glob("*/*/lock")]:
        age = time.time() - lock.stat().st_mtime
        if age > max_age_s:
            lock.unlink(missing_ok=True)
            removed.append(lock)
            log.warning("removed a stale torch extension build lock (%.0f s old): %s", age, lock)
        else:
            log.warning("a torch extension build lock exists (%.0f s old): %s; the launch waits for it", age, lock)
    return removed


def launch_update(
    job: UpdateJob, samples: list[Sample], launch: list[str], job_path: Path, timeout_s: float | None = None
) -> list[dict]:
    """Run the job as `<launch...> -m rlanything.models.training.distributed <job_path>`; -> its history.

    The launcher's output goes to <job_path>.log; a non-zero exit, or a launch still running
    after timeout_s, raises with its tail.
    """
    clear_stale_build_locks()
    write_job(job, samples, job_path)
    history_path = Path(f"{job_path}.history.json")
    history_path.unlink(missing_ok=True)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    log_path = Path(f"{job_path}.log")
    with open(log_path, "w") as out:
        # Its own process group (the launcher and its workers), killed with this process even on SIGKILL.
        proc = procs.spawn(
            [*launch, "-m", "rlanything.models.training.distributed", str(job_path)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
        )
        timed_out = False
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:
            procs.stop_popen(proc)  # interrupted, timed out, or workers left behind by the launcher
    if proc.returncode != 0 or not history_path.exists():
        tail = "".join(log_path.read_text().splitlines(keepends=True)[-40:])
        how = f"still running after {timeout_s:.0f} s, stopped" if timed_out else f"exit {proc.returncode}"
        raise RuntimeError(f"update launcher failed ({how}); see {log_path}:\n{tail}")
    return json.loads(history_path.read_text())


def main(argv: list[str] | None = None) -> None:
    """Worker entry point: `python -m rlanything.models.training.distributed JOB.json` (under a launcher)."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        raise SystemExit("usage: [accelerate launch ...] -m rlanything.models.training.distributed JOB.json")
    job, samples = read_job(Path(args[0]))
    memory.set_budget(job.memory_gb)  # each process of the launch holds the run's budget
    history = run_update(job, samples, backend="accelerate")
    if _rank_world()[0] == 0:
        Path(f"{args[0]}.history.json").write_text(json.dumps(history))


if __name__ == "__main__":
    main()
