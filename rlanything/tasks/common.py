"""What every step task shares: the `step_task` decorator (a Prefect task whose result record
lives in the run folder, keyed by run, config, iteration and step, so a resume finds the finished
steps), its MLflow logging and wall time, and noting a stop for the flow to mark Cancelled. The
library code a step calls is in agent/ (agent/run_context.py: the run's config, weights, engine);
the fault hook in debug_faults.py."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from prefect import task
from prefect.cache_policies import CacheKeyFnPolicy

from rlanything import memory, stopping
from rlanything.agent.run_context import open_run
from rlanything.debug_faults import inject_fault
from rlanything.metric_names import step_time
from rlanything.storage import tracking
from rlanything.storage.layout import RunLayout
from rlanything.tasks import cancellation

CACHE_VERSION = "1"


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
    logs its files to MLflow under iter_NNNN/ and reports its wall time, its peak resident
    memory (`memory.peak_gb`: the step's own, where Linux lets the counter be reset) and what
    the process held when it began (`memory/<step>_start_rss_gb`: the flow's own baseline)."""

    def wrap(fn: Callable[[str, int], tuple[list[Path], dict[str, float]]]):
        @functools.wraps(fn)
        @noting_stops
        def run(run_dir: str, iteration: int) -> dict[str, Any]:
            stopping.check()  # a stop that came between two steps starts none
            memory.release()  # what earlier steps freed: this step's peak starts from what is held
            held, start, own_peak = memory.rss_bytes(), time.perf_counter(), memory.reset_peak()
            inject_fault(name, iteration, "start")
            paths, metrics = fn(run_dir, iteration)
            inject_fault(name, iteration, "end")
            config, layout = open_run(run_dir)
            tracking.log_artifacts(config.mlflow_uri, layout.mlflow_run_id(), paths, f"iter_{iteration:04d}")
            metrics[step_time(name)] = time.perf_counter() - start
            # this step's peak RSS (the process's so far where the counter cannot be reset)
            metrics[f"memory/{name}_peak_rss_gb" if own_peak else f"memory/{name}_process_peak_rss_gb"] = (
                memory.peak_gb()
            )
            metrics[f"memory/{name}_start_rss_gb"] = held / 2**30  # what the process held before it
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
