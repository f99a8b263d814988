"""The ablation experiment: the paper's arms as normal runs, then one comparison.

`rlanything experiment ablation -c CONFIG --seeds S (--iterations N | --budget-minutes M)`
trains every arm of `ARMS` with seeds run.seed, run.seed+1, ... on the same config, each
(arm, seed) a normal run `<run.root>/<name>-<arm>-s<seed>` (resumable with `rlanything resume`,
one MLflow run, nested under the experiment's parent MLflow run and tagged with the experiment,
arm and seed), held-out evaluation after every iteration (`eval.every` 1 unless the config sets
it, and always after the last one) so the curves have points. Every arm turns the reward-hacking
guard's fallback off (the paper has none; the alarm is still logged): a flagged iteration would
otherwise make the +RM arm outcome-only and leave the RM-signal-only arm without a reward.

The budget is equal for every arm: N iterations, or M minutes of training (the sum of the steps'
own times). Under a wall-time budget an arm is compared with the checkpoint it had when its M
minutes were up: it trains while its training so far is under M (`next_fits`), so its last
iteration runs past M, and the comparison takes its last iteration that ended within M
(`at_budget`, evaluated after the arm; the starting model if the first one overran). Every arm
so gets exactly M minutes; one with long iterations has more of them unfinished when time is up,
which is the cost of its iterations, not a budget overrun. The decisions read only the recorded
step times, so a resumed experiment decides exactly as an uninterrupted one. Both given:
whichever comes first. The comparison (`reports.experiment`) shows each arm's minutes up to the
compared checkpoint and the minutes its unfinished iteration had run at the budget; it is
rewritten after every finished arm: partial results are readable while the rest runs.

Resume: running the same command again (or Retry in the Prefect UI) skips arms marked finished
with this budget (`arms/<run>.done`) and resumes the unfinished one at its failed step; the same
command with a larger budget extends every arm (finished iterations are kept); a different
config, overrides, seeds or arms under the same experiment name is refused. One process
at a time runs an experiment (its folder's lock).

Departures from the paper: every arm runs the same number of iterations (or wall time), on a
small model. The policy-only arm has no RM in the loop (`rm.judgments_per_step 0` where the RM is
a judge: nothing is judged in training or evaluation, so under a wall-time budget it spends no
time on verdicts that could not change it), and its RM columns are empty (n/a); the RM's accuracy
at the start is the +RM arms' evaluation of the starting model. An RM that writes unit tests (rm.role
unit_tests, where m = 0 is refused) stays in that arm, frozen. The starting model's held-out
evaluation is the same in every arm of a seed whose evaluation judges alike (same model, same
problems, greedy; the same RM judging, or none), so it runs once per seed and kind and its files
are copied to the other arms of that kind.
"""

from __future__ import annotations

import functools
import json
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from prefect import flow, get_run_logger

from rlanything import stopping
from rlanything.config import Config, ConfigError, load_config
from rlanything.flows.evaluation import BASE, eval_dir, eval_flow
from rlanything.flows.runlock import run_lock
from rlanything.flows.training import prepare_run, train_flow
from rlanything.reports import experiment as report
from rlanything.reports.eval import step_seconds
from rlanything.storage import tracking
from rlanything.storage.layout import RunLayout
from rlanything.storage.parquet import write_text
from rlanything.tasks.cancellation import is_stop, stoppable


@dataclass(frozen=True)
class Arm:
    label: str
    overrides: tuple[str, ...]  # applied after the user's overrides
    no_rm_judge: bool = False  # a judging RM (rm.role judge) leaves the loop: `NO_RM`


NO_RM = "rm.judgments_per_step=0"  # no RM in the loop (config._check_no_rm: λ 0, frozen, no adaptation)


# Every arm: the paper's loop has no reward-hacking fallback (the alarm is still logged).
PAPER = ("algo.rm_guard.outcome_only_when_flagged=false",)
# The paper's ablation (policy-only vs +RM vs +RM+env, and step signals from the RM alone).
ARMS: dict[str, Arm] = {
    "policy-only": Arm(
        "policy only (outcome reward, λ = 0, no RM judging, no adaptation)",
        ("algo.lam=0", "algo.outcome_weight=1", "rm.optim.frozen=true", "adapt.enabled=false", *PAPER),
        no_rm_judge=True,
    ),
    "plus-rm": Arm(
        "+RM (λ = 1, RM trained, no adaptation)",
        ("algo.lam=1", "algo.outcome_weight=1", "rm.optim.frozen=false", "adapt.enabled=false", *PAPER),
    ),
    "plus-rm-env": Arm(
        "+RM+env (the full loop)",
        ("algo.lam=1", "algo.outcome_weight=1", "rm.optim.frozen=false", "adapt.enabled=true", *PAPER),
    ),
    "rm-signal-only": Arm(
        "RM signal only (policy reward λ·mean S, RM trained)",
        ("algo.lam=1", "algo.outcome_weight=0", "rm.optim.frozen=false", "adapt.enabled=false", *PAPER),
    ),
}
NAME = re.compile(r"[A-Za-z0-9._-]+")
MAX_ITERATIONS = 10_000  # a wall-time budget alone: effectively unbounded
EXPERIMENT_TAG, ARM_TAG, SEED_TAG = "rlanything.experiment", "rlanything.arm", "rlanything.seed"
PARENT_TAG = "mlflow.parentRunId"  # MLflow's UI nests a run under the run this tag names


def experiment_dir(config: Config, name: str) -> Path:
    return Path(config.run.root).resolve() / "experiments" / name


def arm_overrides(overrides: list[str], config: Config, name: str, arm: str, seed: int) -> list[str]:
    """The overrides of one (arm, seed) run: the user's, the arm's (with `NO_RM` where the arm
    leaves a judging RM out), its name and seed, and an evaluation after every iteration unless
    the config asks for one."""
    spec = ARMS[arm]
    no_rm = [NO_RM] if spec.no_rm_judge and config.rm.role == "judge" else []  # unit_tests: m = 0 refused
    every = [] if config.eval.every else ["eval.every=1"]
    return [*overrides, *spec.overrides, *no_rm, f"run.name={name}-{arm}-s{seed}", f"run.seed={seed}", *every]


def open_experiment(
    config_path: str, name: str, overrides: list[str], seeds: int, iterations, budget_minutes, arms: list[str]
) -> tuple[Config, list[int], Path]:
    """Check the spec and write `experiment.json`, or refuse a different spec under the same
    name (ConfigError). -> (the base config, the seeds, the experiment folder)."""
    unknown = [a for a in arms if a not in ARMS]
    if unknown:
        raise ConfigError(f"unknown arm(s) {unknown}; arms are {', '.join(ARMS)}")
    if not NAME.fullmatch(name):
        raise ConfigError(f"experiment name {name!r}: use letters, digits, '.', '_' and '-'")
    base = load_config(config_path, overrides)
    seed_list = [base.run.seed + k for k in range(seeds)]
    folder = experiment_dir(base, name)
    spec = {"config": base.to_dict(), "overrides": overrides, "seeds": seed_list, "arms": arms}
    path = folder / "experiment.json"
    if path.exists():
        before = json.loads(path.read_text())
        if {k: before.get(k) for k in spec} != json.loads(json.dumps(spec)):
            raise ConfigError(
                f"experiment {name!r} already exists in {folder} with a different config, seeds or arms; "
                "choose another --name, or run the same command (a larger budget extends it)"
            )
    budget = {"iterations": iterations, "budget_minutes": budget_minutes}
    write_text(json.dumps(spec | budget, indent=2, sort_keys=True), path)
    return base, seed_list, folder


def next_fits(seconds: list[float], budget_s: float) -> bool:
    """Whether an arm whose finished iterations took `seconds` (training time each) starts one
    more under a budget of `budget_s` training seconds: while its training so far is under the
    budget. Its last iteration thus ends past the budget, and `at_budget` tells which checkpoint
    the arm had when its time was up.

    Why run past the budget: only a finished iteration shows whether it ended within the budget.
    The rules before this one stopped on a prediction (training so far plus the longest finished
    iteration, later plus half the median of the last three), so an arm whose iterations were long
    or uneven ended a whole iteration short or half of one over: a +RM arm on text games, with
    iterations of 28-42% of an 18-minute budget, ended up to 19% short or 12% over it. Why not stop a
    running iteration at the budget instead: its work would be lost, the run left with half an
    iteration, and where it stopped would depend on the clock, not on recorded times.

    >>> next_fits([], 60), next_fits([20, 39.9], 60), next_fits([20, 40], 60)
    (True, True, False)
    """
    return sum(seconds) < budget_s


def at_budget(seconds: list[float], budget_s: float) -> int:
    """The iteration whose checkpoint an arm had when `budget_s` training seconds were up: the
    last whose iterations 0..i took at most the budget in all (`seconds`: each one's training
    time, in order); `BASE` (the starting model) when the first alone took more.

    >>> at_budget([30.0, 40.0, 50.0], 70.0), at_budget([30.0, 40.0, 50.0], 69.9), at_budget([80.0], 70.0)
    (1, 0, -1)
    """
    total, at = 0.0, BASE
    for iteration, taken in enumerate(seconds):
        total += taken
        if total > budget_s:
            break
        at = iteration
    return at


def iteration_seconds(run_dir: Path, count: int) -> list[float]:
    """Training seconds of each of iterations 0..count-1 that has its iter_NNNN/summary.json: the
    steps' own times (`reports.eval.step_seconds`, as the comparison counts them)."""
    paths = [RunLayout(run_dir).iter_dir(i) / "summary.json" for i in range(count)]
    return [step_seconds(json.loads(path.read_text())) for path in paths if path.exists()]


def _train_arm(config_path: str, overrides: list[str], config: Config, iterations, budget_minutes) -> None:
    """Train one (arm, seed) run to its budget: N iterations and/or M minutes of step time, one
    iteration at a time while `next_fits` (from the recorded times: a resumed or extended arm
    passes over its finished iterations deciding as before, then goes on); then evaluate the
    iteration it is compared at (`at_budget` under a wall-time budget, else its last)."""
    limit = iterations or (MAX_ITERATIONS if budget_minutes else config.run.iterations)
    if budget_minutes is None:
        train_flow(config_path, overrides, limit)
    else:
        done = 0
        while done < limit and next_fits(iteration_seconds(config.run_dir, done), budget_minutes * 60):
            train_flow(config_path, overrides, done + 1)  # finished iterations are skipped
            done += 1
    compared = max(i for i in range(limit) if RunLayout(config.run_dir).iteration_done(i).exists())
    if budget_minutes is not None:
        compared = at_budget(iteration_seconds(config.run_dir, compared + 1), budget_minutes * 60)
    if compared != BASE and not (eval_dir(config.run_dir, compared) / "summary.json").exists():
        eval_flow(f"{config.run_dir}@{compared}")  # eval.every may skip it


def base_eval_kind(config: Config) -> int:
    """What a run's evaluation of its starting model judges with: m RM verdicts per step, or 0
    (eval.rm off, no RM in the loop, an RM that writes unit tests). Arms of one kind share it."""
    return config.rm.judgments_per_step if config.eval.rm and config.rm.role == "judge" else 0


def _share_base_eval(source: Path | None, run_dir: Path) -> None:
    """Copy the evaluation of the starting model of the seed's first arm of this run's
    `base_eval_kind` (identical in every such arm)."""
    target = eval_dir(run_dir, BASE)
    if source and (source / "summary.json").exists() and not (target / "summary.json").exists():
        shutil.copytree(source, target, dirs_exist_ok=True)


def write_comparison(
    folder: Path, name: str, runs: list[dict], arms: list[str], splits: list[str], budget_minutes: float | None = None
) -> tuple[list[Path], dict[str, float]]:
    """comparison.md, comparison.json and the figures from the runs so far; the table's numbers.
    With a wall-time budget, the table reads every run as it stood at the budget
    (`report.cut_at_budget`); the figures show every iteration."""
    import pandas as pd

    frame = pd.DataFrame(runs, columns=["arm", "seed", "run_dir"])
    training, heldout = report.collect(frame)
    labels = {a: ARMS[a].label for a in arms}
    at = report.cut_at_budget(training, heldout, budget_minutes) if budget_minutes else (training, heldout)
    table = report.comparison_table(labels, *at, splits, budget_minutes)
    details = {
        "runs": ", ".join(Path(r["run_dir"]).name for r in runs),
        "spec": str(folder / "experiment.json"),
    }
    if budget_minutes is not None:
        details["budget"] = f"{budget_minutes:g} min of training steps per arm"
    text = report.comparison_markdown(f"ablation {name}", details, table, at[1], splits)
    write_text(text, folder / "comparison.md")
    write_text(table.to_json(orient="records", indent=2), folder / "comparison.json")
    figures = report.plot_figures(labels, training, heldout, splits, folder)
    return [folder / "comparison.md", folder / "comparison.json", *figures], report.table_metrics(table, splits)


@flow(name="rlanything-experiment", flow_run_name="ablation {name}")
@stoppable
def ablation_flow(
    config_path: str,
    name: str,
    overrides: list[str] | None = None,
    seeds: int = 2,
    iterations: int | None = None,
    budget_minutes: float | None = None,
    arms: list[str] | None = None,
) -> dict:
    """Train every arm with `seeds` seeds on an equal budget, then compare them."""
    overrides, arms = list(overrides or []), list(arms or ARMS)
    with run_lock(experiment_dir(load_config(config_path, overrides), name)):
        base, seed_list, folder = open_experiment(config_path, name, overrides, seeds, iterations, budget_minutes, arms)
        uri = base.mlflow_uri
        root = Path(base.run.root).resolve()
        parent = tracking.get_or_create_run(uri, base.run.experiment, root / "mlartifacts", folder, f"ablation {name}")
        tracking.set_tags(uri, parent, {EXPERIMENT_TAG: name})
        tracking.set_running(uri, parent)
        runs: list[dict] = []
        killed = functools.partial(tracking.set_terminated, uri, parent, "KILLED")
        try:
            with stopping.on_forced_exit(killed):  # a second Ctrl-C ends the process before `except` runs
                spec = (config_path, overrides, iterations, budget_minutes)
                paths, metrics = _run_arms(base, name, folder, parent, spec, seed_list, arms, runs)
            tracking.log_metrics(uri, parent, metrics, step=0)
            tracking.log_artifacts(uri, parent, paths, None)
        except BaseException as exc:
            tracking.set_terminated(uri, parent, "KILLED" if is_stop(exc) else "FAILED")
            raise
        tracking.set_terminated(uri, parent, "FINISHED")
    return {"folder": str(folder), "comparison": str(folder / "comparison.md"), "mlflow_run_id": parent, "runs": runs}


def _run_arms(
    base: Config, name: str, folder: Path, parent: str, spec: tuple, seeds: list[int], arms: list[str], runs: list[dict]
) -> tuple[list[Path], dict[str, float]]:
    """Train every (seed, arm) not finished with this budget, appending each to `runs`, and
    rewrite the comparison after each. -> the comparison's files and numbers."""
    config_path, overrides, iterations, budget_minutes = spec
    uri, logger = base.mlflow_uri, get_run_logger()
    # under a wall-time budget the compared checkpoint is often the one before the last
    keep = ["run.keep_checkpoints=2"] if budget_minutes and (base.run.keep_checkpoints or 2) < 2 else []
    for seed in seeds:
        base_evals: dict[int, Path] = {}  # base_eval_kind -> the first such arm's evaluation
        for arm in arms:
            stopping.check()
            run_overrides = arm_overrides(overrides, base, name, arm, seed) + keep
            config = load_config(config_path, run_overrides)
            runs.append({"arm": arm, "seed": seed, "run_dir": str(config.run_dir)})
            marker = folder / "arms" / f"{config.run.name}.done"
            budget = json.dumps({"iterations": iterations, "budget_minutes": budget_minutes})
            if not marker.exists() or marker.read_text() != budget:  # new, or a new budget
                logger.info("arm %s, seed %d: run %s", arm, seed, config.run_dir)
                _share_base_eval(base_evals.get(base_eval_kind(config)), config.run_dir)
                layout = prepare_run(config)  # creates its MLflow run, to nest it before it starts
                tags = {PARENT_TAG: parent, EXPERIMENT_TAG: name, ARM_TAG: arm, SEED_TAG: str(seed)}
                tracking.set_tags(uri, layout.mlflow_run_id(), tags)
                _train_arm(config_path, run_overrides, config, iterations, budget_minutes)
                write_text(budget, marker)
            base_evals.setdefault(base_eval_kind(config), eval_dir(config.run_dir, BASE))
            paths, metrics = write_comparison(folder, name, runs, arms, list(base.eval.splits), budget_minutes)
    return paths, metrics
