"""What every step task shares: opening a run, picking model weights, caching, logging, and
the fault-injection hook the resume tests use."""

from __future__ import annotations

import functools
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from prefect import task
from prefect.cache_policies import CacheKeyFnPolicy

from rlanything import stopping
from rlanything.config import Config, load_config
from rlanything.metric_names import step_time
from rlanything.models.engines.make import make_engine
from rlanything.models.engines.ray_engine import kill_a_worker_next, make_ray_engine
from rlanything.models.engines.shards import ShardedEngine
from rlanything.models.loading import resolve_model_path
from rlanything.storage import tracking
from rlanything.storage.layout import STEPS, RunLayout
from rlanything.tasks import cancellation

CACHE_VERSION = "1"
FAULT_ENV = "RLANYTHING_FAULT"


def open_run(run_dir: str) -> tuple[Config, RunLayout]:
    layout = RunLayout(Path(run_dir))
    return load_config(layout.config), layout


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


# ---------------------------------------------------------------- fault injection (testing hook)


class InjectedFault(RuntimeError):
    """Raised by `RLANYTHING_FAULT=raise:<step>`."""


FAULT_ACTIONS = ("sigkill", "raise", "sigint", "sigterm", "hold", "sigkill-worker")
HOLD_LIMIT_S = 600  # "hold" gives up after this long and lets the step run
FAULT_POINTS = (*STEPS, "eval")  # the steps, and the held-out evaluation of a checkpoint


def parse_fault(spec: str) -> tuple[str, str, int | None, str]:
    """ "ACTION:STEP[@ITERATION][:PHASE]" -> (action, step, iteration or None, phase).

    >>> parse_fault("sigkill:rm_score@1:end")
    ('sigkill', 'rm_score', 1, 'end')
    """
    parts = spec.split(":")
    if len(parts) not in (2, 3):
        raise ValueError(f"{FAULT_ENV}={spec!r}: expected ACTION:STEP[@ITERATION][:PHASE]")
    action, target, phase = parts[0], parts[1], parts[2] if len(parts) == 3 else "start"
    step, _, at = target.partition("@")
    if action not in FAULT_ACTIONS or step not in FAULT_POINTS or phase not in ("start", "end"):
        raise ValueError(
            f"{FAULT_ENV}={spec!r}: ACTION is {'|'.join(FAULT_ACTIONS)}, STEP one of {', '.join(FAULT_POINTS)}, "
            "PHASE start|end"
        )
    return action, step, int(at) if at else None, phase


def inject_fault(step: str, iteration: int, phase: str) -> None:
    """Testing hook, a no-op unless `RLANYTHING_FAULT` is set: "sigkill:rollout" kills this
    process with SIGKILL at the start of the rollout step (like `kill -9`), "raise:verify@1:end"
    raises `InjectedFault` in iteration 1's verify step after it wrote its files, before the step
    logs them and Prefect records its result. "sigint:rm_score@1" sends SIGINT to this process's
    group as a terminal's Ctrl-C does ("sigterm": SIGTERM, as a process manager does) and lets the
    step run on into its work, where the stop check ends it; only for a process in a group of its
    own (`setsid`, `start_new_session`). "hold:rollout@0" keeps the step in progress until a stop
    request ends it (checked every 0.1 s, at most HOLD_LIMIT_S): a step surely running when a
    test cancels the run from outside. PHASE is `start` (default) or `end`; STEP may also be
    `eval`, the held-out evaluation of ITERATION's checkpoint. "sigkill-worker:rollout@1" (with
    `run.executor: ray`) has the step's first sharded generation call kill its first Ray worker
    with SIGKILL in the middle of its shard (`models.engines.ray_engine.kill_a_worker_next`)."""
    spec = os.environ.get(FAULT_ENV)
    if not spec:
        return
    action, at_step, at_iteration, at_phase = parse_fault(spec)
    if (at_step, at_phase) != (step, phase) or at_iteration not in (None, iteration):
        return
    if action == "sigkill-worker":
        kill_a_worker_next()
        return
    if action == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    if action in ("sigint", "sigterm"):
        print(f"injected fault {spec!r}: {action.upper()} to the process group", flush=True)
        os.killpg(os.getpgrp(), signal.SIGINT if action == "sigint" else signal.SIGTERM)
        return
    if action == "hold":
        print(f"injected fault {spec!r}: holding the step until a stop", flush=True)
        deadline = time.monotonic() + HOLD_LIMIT_S
        while time.monotonic() < deadline:
            stopping.check()
            time.sleep(0.1)
        return
    raise InjectedFault(f"injected fault {spec!r} in step {step} of iteration {iteration}")


# ---------------------------------------------------------------- steps as Prefect tasks


def step_key(run_dir: str, iteration: int, step: str) -> str:
    """(cache version, run, config, iteration, step): a new flow run of the same iteration
    finds the finished steps (Prefect's default key includes the flow-run id, which would not).
    The step's result record is the file `<run>/.prefect/results/<key>`."""
    config, _ = open_run(run_dir)
    return f"{CACHE_VERSION}-{Path(run_dir).name}-{config.digest()}-{iteration:04d}-{step}"


def step_cache_key(context, parameters: dict[str, Any]) -> str:
    return step_key(parameters["run_dir"], parameters["iteration"], context.task.name)


def step_task(name: str) -> Callable:
    """Decorate a step `fn(run_dir, iteration) -> (paths, metrics)` as a Prefect task that
    logs its files to MLflow under iter_NNNN/ and reports its wall time."""

    def wrap(fn: Callable[[str, int], tuple[list[Path], dict[str, float]]]):
        @functools.wraps(fn)
        @noting_stops
        def run(run_dir: str, iteration: int) -> dict[str, Any]:
            stopping.check()  # a stop that came between two steps starts none
            start = time.perf_counter()
            inject_fault(name, iteration, "start")
            paths, metrics = fn(run_dir, iteration)
            inject_fault(name, iteration, "end")
            config, layout = open_run(run_dir)
            tracking.log_artifacts(config.mlflow_uri, layout.mlflow_run_id(), paths, f"iter_{iteration:04d}")
            metrics[step_time(name)] = time.perf_counter() - start
            return {"paths": [str(p) for p in paths], "metrics": metrics}

        return task(name=name, persist_result=True, cache_policy=CacheKeyFnPolicy(cache_key_fn=step_cache_key))(run)

    return wrap


def noting_stops(fn: Callable) -> Callable:
    """Decorate a task's function: a stop leaving it notes the task run, which the flow around
    it then marks Cancelled (`cancellation`)."""

    @functools.wraps(fn)
    def run(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except BaseException as exc:
            if cancellation.is_stop(exc):
                cancellation.note_task_run()
            raise

    return run


def step_options(layout: RunLayout, refresh: bool) -> dict[str, Any]:
    """`with_options` of a step inside a run: its result record (cache key -> the returned
    paths and metrics) is one file under `<run>/.prefect/results/`, so a run carries its own
    resume state whatever PREFECT_HOME the resuming process has. A record cut short by a kill
    does not parse and counts as absent. `refresh` recomputes even when a record exists."""
    return {
        "cache_policy": CacheKeyFnPolicy(cache_key_fn=step_cache_key),
        "result_storage": layout.prefect_results.resolve(),  # a Path: Prefect stores there as a LocalFileSystem
        "refresh_cache": refresh,
    }
