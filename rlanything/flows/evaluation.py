"""The evaluation flow: a policy's greedy success on held-out problems (`rlanything eval`).

What is evaluated (`target`):
  RUN[@ITERATION]   a run folder (or a run name under ./runs) and the policy checkpoint written
                    by that iteration (default: the newest one; `@base`: the model the run
                    started from, plotted as iteration -1 at wall time 0). Results go to
                    `<run>/eval/iter_NNNN/` and to the run's MLflow run (metrics
                    `eval/<split>/<measure>` at step = iteration, files under eval/iter_NNNN/), and
                    `<run>/eval_curves.png` is redrawn from every evaluation of the run so far.
  MODEL             a model folder or `builtin:...` (needs a config for the environment). Results
                    go to `<run.root>/eval/<model>/` and to an MLflow run of their own.
One Prefect task per split plays the problems, a last one writes episodes.parquet, steps.parquet,
summary.md and eval.png.

No evaluation is played twice: the flow hashes the policy's and the RM's folders once
(`storage.checkpoints.weights_digest`) and hands every task the run's evaluations so far
(`<run>/eval/*`, the bare models' `<run.root>/eval/*`). A split that one of them played with the
same weights, problems and settings (`agent.eval_play.play_key`: a frozen policy, the same
checkpoint again) copies its episodes instead of playing, and its judgments where the RM is
unchanged too (`rm_key`); a changed RM judges the copied episodes. summary.json's split rows keep
both keys and say where reused episodes and judgments come from (`episodes_from`,
`judgments_from`: "eval/iter_0000"), as do summary.md, the CLI table and the MLflow metrics
`eval/<split>/episodes_reused` and `judgments_reused`.

The reward model is evaluated beside the policy (`eval.rm`, on by default). The RM of the same
checkpoint (checkpoints/rm/iter_NNNN; for `@base`, a bare model, and a run with no RM in its loop,
which checkpoints none, the config's rm model: judging there takes `--set rm.judgments_per_step=N`) judges
every step of every valid held-out episode rm.judgments_per_step times, as the rm_score step does
in training (same context builder, prompt, verdict mode and sampling, a seed derived the same
way), into judgments.parquet beside episodes.parquet (agent/eval_judge.py). Per split,
summary.json, summary.md, the MLflow metrics `eval/<split>/rm_*` and the CLI table then report
how well the judgments predict the episodes' outcomes (`algo.rm_accuracy.outcome_prediction`):
rm_outcome_accuracy (the sign of an episode's mean step score against its outcome),
rm_outcome_auroc (that score ranking solved above unsolved episodes; NaN with one outcome only),
rm_step_accuracy (each step's majority verdict against its episode's outcome), rm_score_gap
(mean score − mean outcome; positive: the RM is more pleased than the verifier), rm_judged
(episodes judged) and rm_parse_rate (verdicts parsed). Unlike rm/outcome_accuracy in training,
these are measured on greedy episodes of problems the RM never trained on. With `eval.rm: false`,
or an RM that writes unit tests instead (rm.role unit_tests), nothing is judged and the measures
are absent, NaN in `reports.eval_report.eval_history` (as in evaluations written before they existed).
"""

from __future__ import annotations

import json
import math
import re
import time
from dataclasses import dataclass
from pathlib import Path

from prefect import flow

from rlanything.agent.rm_roles import RM_ROLES
from rlanything.agent.run_context import saved_models
from rlanything.config import Config, ConfigError, load_config
from rlanything.envs.heldout import SPLITS
from rlanything.reports.eval_report import eval_history, plot_eval_curves, training_wall_time
from rlanything.storage import tracking
from rlanything.storage.checkpoints import weights_digest
from rlanything.storage.layout import RUNS, RunLayout, run_folder
from rlanything.storage.parquet import write_text
from rlanything.tasks.cancellation import stoppable
from rlanything.tasks.evaluate import eval_report, evaluate_split

BASE = -1  # the "iteration" of a run's starting model (MLflow step -1, wall time 0)


class EvalTargetError(ValueError):
    """The run, iteration, checkpoint or model to evaluate does not exist."""


@dataclass(frozen=True)
class EvalTarget:
    config_path: Path  # the run's config.yaml, or the config given for a bare model
    weights: Path
    label: str  # how episodes name the weights: run-relative checkpoint, or the model spec
    run_dir: Path | None = None
    iteration: int | None = None


def checkpoint_iterations(run_dir: Path) -> list[int]:
    """Iterations whose policy checkpoint is complete (its config.json written), oldest first."""
    found = []
    for folder in (run_dir / "checkpoints" / "policy").glob("iter_*"):
        if re.fullmatch(r"iter_\d{4,}", folder.name) and (folder / "config.json").is_file():
            found.append(int(folder.name[5:]))
    return sorted(found)


def resolve_target(target: str, config_path: str | Path | None = None, runs: Path = RUNS) -> EvalTarget:
    """`RUN[@ITERATION]` or a model folder / `builtin:` name -> what to evaluate; EvalTargetError
    saying what is missing."""
    if target.startswith("builtin:") or (Path(target) / "config.json").is_file():
        from rlanything.models.loading import resolve_model_path

        if config_path is None:
            raise EvalTargetError(f"{target} is a model, not a run: give the environment with -c CONFIG")
        try:
            weights = resolve_model_path(target)
        except Exception as err:
            raise EvalTargetError(f"model {target!r}: {err}") from err
        return EvalTarget(Path(config_path), weights, target if target.startswith("builtin:") else str(weights))
    name, at, iteration = target.rpartition("@") if "@" in target else (target, "", "")
    run_dir = run_folder(name, runs).resolve()
    if not (run_dir / "config.yaml").is_file():
        raise EvalTargetError(
            f"no run at {run_dir} (expected {run_dir / 'config.yaml'}), and {target!r} is no model folder"
        )
    done = checkpoint_iterations(run_dir)
    layout = RunLayout(run_dir)
    if at and iteration == "base":  # the run's starting point: the first point of its curve
        from rlanything.models.loading import resolve_model_path

        model = load_config(layout.config).policy.model
        return EvalTarget(
            Path(config_path) if config_path else layout.config, resolve_model_path(model), model, run_dir, BASE
        )
    if at:
        if not iteration.isdigit():
            raise EvalTargetError(f"iteration {iteration!r} in {target!r} must be a number or base")
        if int(iteration) not in done:
            raise EvalTargetError(
                f"run {run_dir.name} has no policy checkpoint of iteration {int(iteration)} "
                f"(checkpoints: {done or 'none'})"
            )
        chosen = int(iteration)
    elif not done:
        raise EvalTargetError(f"run {run_dir.name} has no policy checkpoint yet (no iteration finished its update)")
    else:
        chosen = done[-1]
    weights = layout.checkpoint("policy", chosen)
    return EvalTarget(
        Path(config_path) if config_path else layout.config,
        weights,
        weights.relative_to(run_dir).as_posix(),
        run_dir,
        chosen,
    )


def eval_dir(run_dir: Path, iteration: int, wording: str | None = None) -> Path:
    """<run>/eval/iter_NNNN, or <run>/eval/base for the run's starting model; in another wording
    of a text game (`wording`), <run>/eval-<wording>/...: beside the run's own, never mixed with it
    (a later evaluation reuses episodes of its own folder's siblings only; the eval curves read eval/)."""
    folder = "eval" if wording is None else f"eval-{wording}"
    return Path(run_dir) / folder / ("base" if iteration == BASE else f"iter_{iteration:04d}")


def wording_overrides(wording: str | None) -> list[str]:
    """The config overrides of `rlanything eval --wording`: the text game's `env.options.wording`
    (an environment without the option refuses it with the config's one-line error)."""
    return [] if wording is None else [f"env.options.wording={wording}"]


def _model_run(config, target: EvalTarget) -> tuple[str, str]:
    """(MLflow run id, artifact folder) of a bare model's evaluation: a run of its own."""
    root = Path(config.run.root).resolve()
    key = f"eval:{target.label}:{config.digest()}"
    run_id = tracking.get_or_create_run(
        config.mlflow_uri, config.run.experiment, root / "mlartifacts", Path(key), f"eval {target.label}"
    )
    return run_id, "eval"


def rm_target(config: Config, resolved: EvalTarget) -> tuple[Path | None, str]:
    """The RM that judges the held-out episodes -> (weights, label), or (None, why none does)."""
    if not config.eval.rm:
        return None, "off (eval.rm: false)"
    if not config.rm.judgments_per_step:
        return None, "off (rm.judgments_per_step: 0, no RM in the loop)"
    if not RM_ROLES[config.rm.role].judges_steps:
        return None, f"none (rm.role {config.rm.role} judges no step)"
    if resolved.run_dir is None or resolved.iteration == BASE:
        from rlanything.models.loading import resolve_model_path

        return resolve_model_path(config.rm_model), config.rm_model
    layout = RunLayout(resolved.run_dir)
    run_config = load_config(layout.config)
    if "rm" not in saved_models(run_config):  # the run never loaded nor trained it: its base weights
        from rlanything.models.loading import resolve_model_path

        return resolve_model_path(run_config.rm_model), run_config.rm_model
    folder = layout.checkpoint("rm", resolved.iteration)
    label = folder.relative_to(resolved.run_dir).as_posix()
    if not (folder / "config.json").is_file():  # the iteration stopped between its two updates
        return None, f"none ({label} was not written)"
    return folder, label


@flow(name="rlanything-eval", flow_run_name="eval {target}")
@stoppable
def eval_flow(
    target: str,
    config_path: str | None = None,
    overrides: list[str] | None = None,
    split: str = "all",
    problems: int | None = None,
    wording: str | None = None,
) -> dict:
    """Evaluate `target` greedily on held-out problems of `split` (in_domain, ood, or all:
    the config's eval.splits) with `problems` per split (default eval.problems); `wording`: a
    text game's held-out (or other) wording, kept apart (`eval_dir`, metrics eval-<wording>/...)."""
    resolved = resolve_target(target, config_path)
    overrides = list(overrides or []) + ([f"eval.problems={problems}"] if problems else [])
    overrides += wording_overrides(wording)
    config = load_config(resolved.config_path, overrides)
    splits = list(config.eval.splits) if split == "all" else [split]
    if any(s not in SPLITS for s in splits):
        raise ConfigError(f"unknown split {split!r}; one of {', '.join(SPLITS)} or all")
    folder = "eval" if wording is None else f"eval-{wording}"
    if resolved.run_dir is not None:
        out = eval_dir(resolved.run_dir, resolved.iteration, wording)
        run_id = RunLayout(resolved.run_dir).mlflow_run_id()
        artifact_path, step = f"{folder}/{out.name}", resolved.iteration
    else:
        safe = re.sub(r"[^A-Za-z0-9._-]+", "_", resolved.label).strip("_")
        out = Path(config.run.root).resolve() / folder / safe
        (run_id, artifact_path), step = _model_run(config, resolved), 0
    rm_weights, rm_label = rm_target(config, resolved)
    start = time.perf_counter()
    digests = {"policy": weights_digest(resolved.weights), "rm": weights_digest(rm_weights) if rm_weights else None}
    earlier = sorted(str(p.parent) for p in out.parent.glob("*/summary.json"))  # the run's evaluations
    parts = [
        evaluate_split(
            str(resolved.config_path),
            overrides,
            str(resolved.weights),
            resolved.label,
            str(resolved.run_dir) if resolved.run_dir else None,
            resolved.iteration,
            s,
            str(out / f"{s}.parquet"),
            str(rm_weights) if rm_weights else None,
            rm_label,
            digests,
            earlier,
        )
        for s in splits
    ]
    title = f"held-out evaluation of {resolved.label}" + (f" (run {resolved.run_dir.name})" if resolved.run_dir else "")
    report = eval_report(parts, str(out), title, _details(config, resolved, digests, rm_weights, rm_label))
    metrics = {k: v for part in parts for k, v in part["metrics"].items()} | report["metrics"]
    metrics["eval/time_s"] = time.perf_counter() - start
    metrics = {k.replace("eval/", f"{folder}/", 1): v for k, v in metrics.items()}  # apart from eval/ in MLflow
    curves = _record(config.mlflow_uri, run_id, resolved, out, report, metrics, artifact_path, step)
    return {
        "out_dir": str(out),
        "summary": report["splits"],
        "metrics": metrics,
        "mlflow_run_id": run_id,
        "mlflow_uri": config.mlflow_uri,
        "curves": str(curves) if curves else None,
    }


def _details(config, resolved: EvalTarget, digests: dict, rm_weights, rm_label: str) -> dict[str, str]:
    """What summary.md says the evaluation ran with."""
    return {
        "weights": str(resolved.weights) + (f" (sha256 {digests['policy'][:12]})" if digests["policy"] else ""),
        "environment": config.env.kind,
        "decoding": "greedy (temperature 0)",
        "problems per split": str(config.eval.problems),
        "answer fallback": config.env.answer_fallback,
        "reward model": rm_label
        + (f" (m = {config.rm.judgments_per_step}, {config.rm.verdict} verdicts)" if rm_weights else ""),
    }


def _record(
    uri: str,
    run_id: str,
    resolved: EvalTarget,
    out: Path,
    report: dict,
    metrics: dict[str, float],
    artifact_path: str,
    step: int,
) -> Path | None:
    """summary.json (the curve's point), MLflow metrics and files; a run's eval_curves.png redrawn."""
    wall = training_wall_time(resolved.run_dir, resolved.iteration) if resolved.run_dir else None
    record = {
        "iteration": resolved.iteration,
        "weights": resolved.label,
        "splits": report["splits"],
        "wall_time_s": wall,
    }
    write_text(json.dumps(record, indent=2), out / "summary.json")  # whole or not at all: read to reuse
    tracking.log_metrics(uri, run_id, {k: v for k, v in metrics.items() if not math.isnan(v)}, step=step)
    tracking.log_artifacts(uri, run_id, [Path(p) for p in report["paths"]] + [out / "summary.json"], artifact_path)
    if resolved.run_dir is None or out.parent.name != "eval":  # the curves are the run's own wording's
        return None
    curves = plot_eval_curves(eval_history(resolved.run_dir), resolved.run_dir / "eval_curves.png")
    tracking.log_artifacts(uri, run_id, [curves], None)  # on the run's front page
    return curves
