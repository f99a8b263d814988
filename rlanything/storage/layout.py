"""Where every file of a run lives (design.md §2)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

STEPS = ("rollout", "verify", "rm_score", "advantages", "policy_update", "rm_update", "adapt_tasks")


@dataclass(frozen=True)
class RunLayout:
    run_dir: Path

    @property
    def config(self) -> Path:
        return self.run_dir / "config.yaml"

    @property
    def prefect_results(self) -> Path:
        return self.run_dir / ".prefect" / "results"

    @property
    def locks(self) -> Path:
        return self.run_dir / ".prefect" / "locks"

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

    def step_outputs(self, iteration: int, step: str) -> list[Path]:
        """The files whose existence means `step` of `iteration` finished."""
        art = lambda name: self.artifact(iteration, name)  # noqa: E731
        return {
            "rollout": [art("rollouts"), art("episodes")],
            "verify": [art("outcomes")],
            "rm_score": [art("judgments")],
            "advantages": [art("advantages")],
            "policy_update": [art("policy_update"), self.checkpoint("policy", iteration) / "config.json"],
            "rm_update": [art("rm_update"), self.checkpoint("rm", iteration) / "config.json"],
            "adapt_tasks": [art("adaptation"), self.tasks_snapshot(iteration + 1)],
        }[step]
