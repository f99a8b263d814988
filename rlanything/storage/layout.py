"""Where every file of a run lives: the run folder's iterations, artifacts, checkpoints, task
buffers and resume records. Which files each step writes is declared in rlanything/pipeline.py."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

from rlanything.pipeline import PIPELINE, STEPS

RUNS = Path("runs")  # where the command line looks a run name up (relative to the working folder)


def run_folder(run: str | Path, runs: Path = RUNS) -> Path:
    """A run as the command line names it -> its folder: `run` itself where that is a folder,
    else the run of that name under `runs` ("tiny" -> runs/tiny), not resolved. Whether a run is
    there is the caller's to check: each says what it expected to find."""
    return Path(run) if Path(run).is_dir() else Path(runs) / run


@dataclass(frozen=True)
class RunLayout:
    run_dir: Path

    @property
    def config(self) -> Path:
        return self.run_dir / "config.yaml"

    @property
    def prefect_results(self) -> Path:
        return self.run_dir / ".prefect" / "results"

    def iter_dir(self, iteration: int) -> Path:
        return self.run_dir / f"iter_{iteration:04d}"

    def artifact(self, iteration: int, name: str) -> Path:
        """`name` like "rollouts" -> iter_NNNN/rollouts.parquet."""
        return self.iter_dir(iteration) / f"{name}.parquet"

    def screenshot(self, iteration: int, traj_id: int, step_idx: int | None) -> Path:
        """iter_NNNN/screenshots/tTTTTT_sSS.png: the screen after step SS of trajectory TTTTT
        (`_start` for the screen the episode began with, step_idx None)."""
        name = f"t{traj_id:05d}_start.png" if step_idx is None else f"t{traj_id:05d}_s{step_idx:02d}.png"
        return self.screenshots_dir(iteration) / name

    def screenshots_dir(self, iteration: int) -> Path:
        return self.iter_dir(iteration) / "screenshots"

    def tasks_snapshot(self, version: int) -> Path:
        return self.run_dir / "tasks" / f"v{version:04d}.parquet"

    def checkpoint(self, kind: str, iteration: int) -> Path:
        """Weights after `iteration`'s update; kind is "policy" or "rm"."""
        return self.run_dir / "checkpoints" / kind / f"iter_{iteration:04d}"

    def iteration_done(self, iteration: int) -> Path:
        return self.iter_dir(iteration) / "DONE"

    @property
    def mlflow_run_id_file(self) -> Path:
        return self.run_dir / "mlflow_run_id"

    def mlflow_run_id(self) -> str:
        """The id of the MLflow run this run logs to (written when the run was prepared)."""
        return self.mlflow_run_id_file.read_text().strip()

    def step_outputs(self, iteration: int, step: str, saved: Collection[str] = ("policy", "rm")) -> list[Path]:
        """The files whose existence means `step` of `iteration` finished (from `PIPELINE`);
        `saved`: the models the run checkpoints (`agent.run_context.saved_models`: a policy-only
        run's rm_update writes no checkpoint)."""
        decl = next((s for s in PIPELINE if s.name == step), None)
        if decl is None:
            raise ValueError(f"unknown step {step!r}; steps are {', '.join(STEPS)}")
        paths = [self.artifact(iteration, name) for name in decl.artifacts]
        if decl.checkpoint in saved:
            paths.append(self.checkpoint(decl.checkpoint, iteration) / "config.json")
        if decl.next_tasks:
            paths.append(self.tasks_snapshot(iteration + 1))
        return paths
