"""What every step needs of its run, Prefect-free: the run's config and layout (`open_run`), which
models it checkpoints (`saved_models`), which weights a step starts from (`model_path`), the engine
a sampling step generates with (`step_engine`) and how samples name their weights
(`weights_label`). The step tasks (tasks/), the evaluation and the benchmarks share them."""

from __future__ import annotations

from pathlib import Path

from rlanything import memory
from rlanything.config import Config, load_config
from rlanything.models.engines.make import make_engine
from rlanything.models.engines.ray_engine import make_ray_engine
from rlanything.models.engines.shards import ShardedEngine
from rlanything.models.loading import resolve_model_path
from rlanything.storage.layout import RunLayout


def open_run(run_dir: str) -> tuple[Config, RunLayout]:
    """The run's config and layout; the process takes the run's memory budget (`run.memory_gb`,
    `run.mmap_threshold_mb`)."""
    layout = RunLayout(Path(run_dir))
    config = load_config(layout.config)
    memory.set_budget(config.run.memory_gb)
    memory.map_large_blocks(config.run.mmap_threshold_mb)
    return config, layout


def saved_models(config: Config) -> tuple[str, ...]:
    """The models whose weights every iteration checkpoints: the policy, and the RM unless the run
    has none in its loop (rm.judgments_per_step 0, the policy-only arm: the config then has it
    frozen, and no step loads it). Its checkpoints would only copy its base weights (538 MB an
    iteration for SmolLM2-135M), so none is written and its weights are the base's (`model_path`)."""
    return ("policy", "rm") if config.rm.judgments_per_step else ("policy",)


def model_path(config: Config, layout: RunLayout, kind: str, iteration: int) -> Path:
    """Weights a step of `iteration` starts from: last iteration's checkpoint, or the base (in
    iteration 0, and always for a model the run does not checkpoint: `saved_models`)."""
    if iteration > 0 and kind in saved_models(config):
        return layout.checkpoint(kind, iteration - 1)
    return resolve_model_path(config.policy.model if kind == "policy" else config.rm_model)


def step_engine(config: Config, role: str, model_dir: Path, precision: str, on_batch, log_path: Path):
    """The engine a sampling step generates with (`models.engines.make.make_engine`), sharded
    over the Ray cluster's engine actors with `run.executor: ray` (`models.engines.ray_engine`), or cut
    into the same `run.shards` here (`models.engines.shards`)."""
    section = config.policy if role == "policy" else config.rm
    if config.run.executor == "ray":
        return make_ray_engine(config.run, section, role, model_dir, precision, on_batch)
    engine, tokenizer = make_engine(section, role, model_dir, precision, on_batch, log_path)
    if config.run.shard_count > 1:  # the slices a Ray run would play: its samples, bit for bit
        engine = ShardedEngine(engine, config.run.shard_count)
    return engine, tokenizer


def weights_label(layout: RunLayout, weights: str) -> str:
    """How samples name the weights that produced them: a checkpoint of this run relative to
    the run folder ("checkpoints/policy/iter_0000", so a moved or resumed run reads the same),
    anything else (the base model) as an absolute path."""
    path, run = Path(weights).resolve(), layout.run_dir.resolve()
    return path.relative_to(run).as_posix() if path.is_relative_to(run) else str(path)
