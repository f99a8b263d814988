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
whichever comes first. The comparison (`reports.experiment_report`) shows each arm's minutes up to the
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

import pandas as pd
from prefect import flow, get_run_logger
from pydantic import ValidationError

from rlanything import stopping
from rlanything.agent.rm_roles import RM_ROLES
from rlanything.config import Config, ConfigError, load_config
from rlanything.flows.evaluation import BASE, eval_dir, eval_flow
from rlanything.flows.runlock import run_lock
from rlanything.flows.training import prepare_run, train_flow
from rlanything.reports import experiment_report as report
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
    no_rm = [NO_RM] if spec.no_rm_judge and RM_ROLES[config.rm.role].judges_steps else []  # unit_tests: m = 0 refused
    every = [] if config.eval.every else ["eval.every=1"]
    return [*overrides, *spec.overrides, *no_rm, f"run.name={run_name(name, arm, seed)}", f"run.seed={seed}", *every]


def run_name(name: str, arm: str, seed: int) -> str:
    """The run of experiment `name`'s `arm` with `seed`: <run.root>/<name>-<arm>-s<seed>."""
    return f"{name}-{arm}-s{seed}"


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
        if not same_experiment(json.loads(path.read_text()), base, seed_list, arms):
            raise ConfigError(
                f"experiment {name!r} already exists in {folder} with a different config, seeds or arms; "
                "choose another --name, or run the same command (a larger budget extends it)"
            )
    budget = {"iterations": iterations, "budget_minutes": budget_minutes}
    write_text(json.dumps(spec | budget, indent=2, sort_keys=True), path)
    return base, seed_list, folder


def same_experiment(before: dict, base: Config, seeds: list[int], arms: list[str]) -> bool:
    """Whether a stored `experiment.json` is this experiment: the same config up to the settings
    that change no result (`Config.digest`: run.memory_gb, where the steps run, ...), the same
    evaluation, seeds and arms. So a resumed experiment may take another memory budget."""
    try:
        config = Config.model_validate(before.get("config"))
    except ValidationError:
        return False
    same_eval = json.loads(json.dumps(base.to_dict()["eval"])) == before["config"].get("eval")
    return config.digest() == base.digest() and same_eval and (before.get("seeds"), before.get("arms")) == (seeds, arms)


def next_fits(history: pd.DataFrame, budget_minutes: float) -> bool:
    """Whether an arm whose finished iterations are `history` (`report.iteration_history`) starts
    one more under a budget of `budget_minutes` of training: while its training so far is under the
    budget. Its last iteration thus ends past the budget, and `report.at_budget` tells which
    checkpoint the arm had when its time was up.

    Why run past the budget: only a finished iteration shows whether it ended within the budget.
    The rules before this one stopped on a prediction (training so far plus the longest finished
    iteration, later plus half the median of the last three), so an arm whose iterations were long
    or uneven ended a whole iteration short or half of one over: a +RM arm on text games, with
    iterations of 28-42% of an 18-minute budget, ended up to 19% short or 12% over it. Why not stop a
    running iteration at the budget instead: its work would be lost, the run left with half an
    iteration, and where it stopped would depend on the clock, not on recorded times.

    >>> h = pd.DataFrame({"iteration": [0, 1], "wall_time_s": [20.0, 59.9]})
    >>> next_fits(h.head(0), 1.0), next_fits(h, 1.0), next_fits(h, 59.9 / 60)
    (True, True, False)
    """
    return history.empty or float(history.wall_time_s.iloc[-1]) < budget_minutes * 60


def _train_arm(config_path: str, overrides: list[str], config: Config, iterations, budget_minutes) -> None:
    """Train one (arm, seed) run to its budget: N iterations and/or M minutes of step time, one
    iteration at a time while `next_fits` (from the recorded times: a resumed or extended arm
    passes over its finished iterations deciding as before, then goes on); then evaluate the
    iteration it is compared at (`report.at_budget` under a wall-time budget, else its last)."""
    limit = iterations or (MAX_ITERATIONS if budget_minutes else config.run.iterations)
    if budget_minutes is None:
        train_flow(config_path, overrides, limit)
    else:
        done = 0
        while done < limit and next_fits(report.iteration_history(config.run_dir).head(done), budget_minutes):
            train_flow(config_path, overrides, done + 1)  # finished iterations are skipped
            done += 1
    compared = max(i for i in range(limit) if RunLayout(config.run_dir).iteration_done(i).exists())
    if budget_minutes is not None:
        compared = report.at_budget(report.iteration_history(config.run_dir).head(compared + 1), budget_minutes)
    if compared != BASE and not (eval_dir(config.run_dir, compared) / "summary.json").exists():
        eval_flow(f"{config.run_dir}@{compared}")  # eval.every may skip it


def base_eval_kind(config: Config) -> int:
    """What a run's evaluation of its starting model judges with: m RM verdicts per step, or 0
    (eval.rm off, no RM in the loop, an RM that writes unit tests). Arms of one kind share it."""
    return config.rm.judgments_per_step if config.eval.rm and RM_ROLES[config.rm.role].judges_steps else 0


def _share_base_eval(source: Path | None, run_dir: Path) -> None:
    """Copy the evaluation of the starting model of the seed's first arm of this run's
    `base_eval_kind` (identical in every such arm)."""
    target = eval_dir(run_dir, BASE)
    if source and (source / "summary.json").exists() and not (target / "summary.json").exists():
        shutil.copytree(source, target, dirs_exist_ok=True)


def write_comparison(
    folder: Path,
    name: str,
    runs: list[dict],
    arms: list[str],
    splits: list[str],
    budget_minutes: float | None = None,
    spec: str | None = None,
) -> tuple[list[Path], dict[str, float]]:
    """comparison.md, comparison.json, iterations.csv and the figures from the runs so far; the
    table's numbers. With a wall-time budget, the table reads every run as it stood at the budget
    (`report.cut_at_budget`); the figures and iterations.csv show every iteration."""
    frame = pd.DataFrame(runs, columns=["arm", "seed", "run_dir"])
    training, heldout = report.collect(frame)
    labels = {a: ARMS[a].label for a in arms}
    at = report.cut_at_budget(training, heldout, budget_minutes) if budget_minutes else (training, heldout)
    table = report.comparison_table(labels, *at, splits, budget_minutes)
    details = {
        "runs": ", ".join(Path(r["run_dir"]).name for r in runs),
        "spec": spec or str(folder / "experiment.json"),
    }
    if budget_minutes is not None:
        details["budget"] = f"{budget_minutes:g} min of training steps per arm"
    text = report.comparison_markdown(f"ablation {name}", details, table, at[1], splits)
    write_text(text, folder / "comparison.md")
    write_text(table.to_json(orient="records", indent=2), folder / "comparison.json")
    write_text(report.iteration_table(frame).to_csv(index=False), folder / "iterations.csv")
    figures = report.plot_figures(labels, training, heldout, splits, folder)
    files = [folder / "comparison.md", folder / "comparison.json", folder / "iterations.csv", *figures]
    return files, report.table_metrics(table, splits)


def compare_experiments(folders: list[Path], out: Path) -> Path:
    """One comparison of experiments whose specs differ in their seeds alone (each seed run as its
    own experiment, say, where two whole-method runs side by side do not fit the machine's
    memory): their finished (arm, seed) runs pooled as one experiment would pool them, written to
    `out` with a list of the experiments compared. -> its comparison.md. ConfigError when a folder
    holds no experiment, the specs differ in more than their seeds, a seed repeats, or no arm has
    finished."""
    folders, specs = [Path(f).resolve() for f in folders], []
    for folder in folders:
        path = folder / "experiment.json"
        if not path.exists():
            raise ConfigError(f"{folder}: no experiment here (no experiment.json)")
        specs.append(json.loads(path.read_text()))
    first = _but_seeds(specs[0])
    for folder, spec in zip(folders[1:], specs[1:]):
        if _but_seeds(spec) != first:
            raise ConfigError(f"{folder} and {folders[0]} differ in more than their seeds: not comparable")
    seeds = [s for spec in specs for s in spec["seeds"]]
    if len(set(seeds)) < len(seeds):
        raise ConfigError(f"a seed appears in more than one experiment (seeds {seeds}): pooling would count it twice")
    budget = json.dumps({"iterations": specs[0]["iterations"], "budget_minutes": specs[0]["budget_minutes"]})
    runs = []
    for folder, spec in zip(folders, specs):
        for seed in spec["seeds"]:
            for arm in spec["arms"]:
                run = run_name(folder.name, arm, seed)
                marker = folder / "arms" / f"{run}.done"
                if marker.exists() and marker.read_text() == budget:
                    runs.append({"arm": arm, "seed": seed, "run_dir": str(folder.parents[1] / run)})
    if not runs:
        raise ConfigError(f"no arm of {', '.join(map(str, folders))} has finished: nothing to compare")
    out.mkdir(parents=True, exist_ok=True)
    write_text(json.dumps({"experiments": [str(f) for f in folders]}, indent=2), out / "compared.json")
    title = " + ".join(f.name for f in folders)
    splits = specs[0]["config"]["eval"]["splits"]
    write_comparison(out, title, runs, specs[0]["arms"], splits, specs[0]["budget_minutes"], str(out / "compared.json"))
    return out / "comparison.md"


def _but_seeds(spec: dict) -> dict:
    """An experiment's spec without what its seeds set: `seeds`, run.seed and its override."""
    config = {**spec["config"], "run": {k: v for k, v in spec["config"]["run"].items() if k != "seed"}}
    overrides = [o for o in spec["overrides"] if not o.startswith("run.seed=")]
    return {**spec, "config": config, "overrides": overrides, "seeds": None}


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
