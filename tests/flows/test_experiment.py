"""`rlanything experiment ablation` end to end: four arms of one tiny iteration each through the
real CLI, Prefect and MLflow, killed with SIGKILL after the first arm and run again.

What must hold: the second process does not retrain the finished arm (its files keep their
modification times and it is not started again), every arm ends as a normal run with its arm's
config (the policy-only arm without its RM in the loop: no RM measure, n/a in the table; the
others' RM judged, the starting model too), the comparison table and the five figures exist, the
MLflow parent run holds them and the arms' runs are nested under it, and a different spec under
the same name is refused.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml
from cli_spares import cli_command
from mlflow.tracking import MlflowClient
from test_resume import REPO, TINY, cli, cli_options, finish  # helpers of the resume tests

from rlanything.config import ConfigError, load_config
from rlanything.flows.evaluation import BASE, eval_dir
from rlanything.flows.experiment import (
    ARMS,
    NO_RM,
    PARENT_TAG,
    ablation_flow,
    arm_overrides,
    base_eval_kind,
    compare_experiments,
    next_fits,
    open_experiment,
)
from rlanything.reports.experiment_report import FIGURES, at_budget, iteration_history
from rlanything.storage.layout import RunLayout

NAME = "abl"
# Shorter generations than tiny.yaml's (16 policy, 8 RM tokens): nothing here reads what a model
# wrote, only that each arm ran, judged, was evaluated and compared. The RM still reasons, then
# gives its constrained verdict.
SHORT = ["policy.max_new_tokens=4", "rm.max_new_tokens=2"]


def _args(root: Path, small_overrides: list[str], seeds: int = 1) -> list[str]:
    sets = [f"run.root={root}", "eval.problems=2", *SHORT, *small_overrides]
    return [
        "experiment",
        "ablation",
        "-c",
        TINY,
        "--seeds",
        str(seeds),
        "-n",
        "1",
        "--name",
        NAME,
        *[a for s in sets for a in ("--set", s)],
    ]


def _wait_for(path: Path, proc, timeout: float = 400) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None, f"the experiment ended before {path} appeared"
        assert time.monotonic() < deadline, f"{path} did not appear in {timeout} s"
        time.sleep(0.2)


def test_ablation_killed_after_an_arm_resumes_and_compares(prefect_api_url, small_overrides, tmp_path):
    folder = tmp_path / "experiments" / NAME
    first, second = (f"{NAME}-{arm}-s0" for arm in list(ARMS)[:2])
    with open(tmp_path / "first.log", "w") as log:  # a file, not a pipe nobody reads: no blocked writes
        proc = subprocess.Popen(cli_command(_args(tmp_path, small_overrides)), **cli_options(prefect_api_url, log))
        _wait_for(folder / "arms" / f"{first}.done", proc)
        os.killpg(proc.pid, signal.SIGKILL)  # the whole process group, while the second arm runs
        proc.wait()
    assert not (folder / "arms" / f"{second}.done").exists()
    kept = [RunLayout(tmp_path / first).iteration_done(0), tmp_path / first / "eval" / "iter_0000" / "summary.json"]
    mtimes = [p.stat().st_mtime_ns for p in kept]

    out = finish(cli(_args(tmp_path, small_overrides), prefect_api_url), timeout=900)
    assert "comparison, figures:" in out, out[-3000:]
    assert [p.stat().st_mtime_ns for p in kept] == mtimes  # the finished arm was not redone
    assert f"arm {list(ARMS)[0]}, seed 0" not in out and f"arm {list(ARMS)[1]}, seed 0" in out

    for arm, spec in ARMS.items():  # each arm is a normal run with its arm's settings
        config = yaml.safe_load((tmp_path / f"{NAME}-{arm}-s0" / "config.yaml").read_text())
        assert config["rm"]["judgments_per_step"] == (0 if arm == "policy-only" else 3), arm  # tiny.yaml: 3
        for override in spec.overrides:
            key, value = override.split("=")
            node = config
            for part in key.split("."):
                node = node[part]
            assert node == yaml.safe_load(value), (arm, key)
        assert (tmp_path / f"{NAME}-{arm}-s0" / "eval" / "iter_0000" / "summary.json").exists()
        base = json.loads((tmp_path / f"{NAME}-{arm}-s0" / "eval" / "base" / "summary.json").read_text())
        in_domain = next(s for s in base["splits"] if s["split"] == "in_domain")
        judged = in_domain.get("rm_outcome_accuracy")  # no copy of the policy-only arm's (RM-less) one
        assert judged is None if arm == "policy-only" else 0 <= judged <= 1, (arm, in_domain)

    table = (folder / "comparison.md").read_text()
    for spec in ARMS.values():
        assert f"| {spec.label} | 1 | 1 |" in table
    po_row = next(line for line in table.splitlines() if line.startswith(f"| {ARMS['policy-only'].label} |"))
    cells = [c.strip() for c in po_row.strip("| ").split(" | ")]  # arm, seeds, iterations, min, 4 accuracies,
    assert cells[8:13] == ["n/a"] * 5, po_row  # then the RM's: 3 on training rollouts, 2 held-out
    records = json.loads((folder / "comparison.json").read_text())
    assert [r["arm"] for r in records] == ["base", *ARMS]  # the starting model first
    assert all(r["strict_in_domain"]["n"] == 2 and r["strict_ood"]["n"] == 2 for r in records)
    rm_columns = ("rm/outcome_accuracy", "heldout_rm_outcome_accuracy_in_domain", "heldout_rm_outcome_accuracy_ood")
    for r in records:  # NaN is null in the JSON
        if r["arm"] == "policy-only":  # no RM in the loop
            assert all(r[c] is None for c in rm_columns), r
        else:  # eval.rm: the RM judged (the starting model's: a judging arm's evaluation)
            assert all(0 <= r[c] <= 1 for c in rm_columns[1:]), r
            assert r["arm"] == "base" or 0 <= r["rm/outcome_accuracy"] <= 1, r
    for figure in FIGURES:
        assert (folder / f"{figure}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    mlf = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    runs = mlf.search_runs([e.experiment_id for e in mlf.search_experiments()])
    parent = next(r for r in runs if r.info.run_name == f"ablation {NAME}")
    children = [r for r in runs if r.data.tags.get(PARENT_TAG) == parent.info.run_id]
    assert sorted(r.data.tags["rlanything.arm"] for r in children) == sorted(ARMS)
    assert parent.info.status == "FINISHED"
    logged = {a.path for a in mlf.list_artifacts(parent.info.run_id)}
    assert {"comparison.md", *(f"{f}.png" for f in FIGURES)} <= logged
    assert parent.data.metrics  # the table's numbers, every one a number (NaN: not logged)
    assert "plus-rm/rm_outcome_accuracy" in parent.data.metrics
    assert not [k for k in parent.data.metrics if k.startswith("policy-only/rm_")], parent.data.metrics
    assert all(math.isfinite(v) for v in parent.data.metrics.values())

    refused = finish(cli(_args(tmp_path, small_overrides, seeds=2), prefect_api_url), timeout=300)
    assert "already exists" in refused and "different config, seeds" in refused, refused[-2000:]


def test_a_resumed_experiment_may_take_another_memory_budget_but_not_another_setting(tmp_path):
    """`run.memory_gb` is outside the config's digest (it changes how much is taken at once, not
    what is computed): an experiment killed by it resumes under another; λ or the evaluation
    changes what the arms compute or how they are compared, and is refused."""
    sets = [f"run.root={tmp_path}", "run.memory_gb=6"]
    open_experiment(TINY, "e", sets, 1, 1, None, ["policy-only"])
    open_experiment(TINY, "e", [f"run.root={tmp_path}", "run.memory_gb=8"], 1, 1, None, ["policy-only"])
    for other in ("algo.lam=0.5", "eval.problems=3"):
        with pytest.raises(ConfigError, match="different config, seeds or arms"):
            open_experiment(TINY, "e", [*sets, other], 1, 1, None, ["policy-only"])
    with pytest.raises(ConfigError, match="different config, seeds or arms"):
        open_experiment(TINY, "e", sets, 1, 1, None, ["policy-only", "plus-rm"])


def test_arm_overrides_leave_a_judging_rm_out_of_the_policy_only_arm():
    judge = load_config(TINY)
    coding = load_config(str(REPO / "configs" / "tiny-coding.yaml"))
    assert (judge.rm.role, coding.rm.role) == ("judge", "unit_tests")
    for arm in ARMS:
        overrides = arm_overrides(["eval.problems=2"], judge, "e", arm, 5)
        assert overrides[0] == "eval.problems=2" and (NO_RM in overrides) == (arm == "policy-only"), arm
        config = load_config(TINY, overrides)  # valid: m = 0 only with λ 0, a frozen RM, no adaptation
        assert config.rm.judgments_per_step == (0 if arm == "policy-only" else 3), arm
        assert base_eval_kind(config) == config.rm.judgments_per_step  # policy-only's base eval: a kind of its own
        unjudged = load_config(TINY, [*overrides, "eval.rm=false"])
        assert base_eval_kind(unjudged) == 0  # no arm's starting model judged: all one kind
        tests = arm_overrides([], coding, "e", arm, 5)
        assert NO_RM not in tests, arm  # unit tests: m = 0 is refused, the RM stays (frozen in policy-only)
        assert base_eval_kind(load_config(str(REPO / "configs" / "tiny-coding.yaml"), tests)) == 0


def test_an_arm_trains_until_its_minutes_are_up_and_is_compared_at_its_checkpoint_then():
    history = lambda *ends: pd.DataFrame({"iteration": range(len(ends)), "wall_time_s": ends})  # noqa: E731
    assert next_fits(history(), 1 / 60)  # nothing measured: the first iteration always runs
    assert next_fits(history(30.0), 30.1 / 60) and not next_fits(history(30.0), 0.5)  # under the budget: one more
    # iterations ending at 30, 70 and 120 s: at 120 s the third had ended, at 119.9 s it had not
    assert at_budget(history(30.0, 70.0, 120.0), 2.0) == 2 and at_budget(history(30.0, 70.0, 120.0), 119.9 / 60) == 1
    assert at_budget(history(11.0), 10 / 60) == at_budget(history(), 1.0) == BASE  # the first ran past: the start


def test_a_wall_time_budget_holds_when_an_experiment_is_extended_to_it(prefect_server, small_overrides, tmp_path):
    """One iteration per arm measures each arm's iteration; the same experiment extended to a
    budget of 1.5 such iterations of the slower arm must run every arm on while its training is
    under the budget (so its last iteration ends past it), evaluate the iteration that had ended
    when the budget was up, and compare the arm there: its minutes, its held-out numbers. The
    rules before this one stopped on a predicted iteration length and ended arms up to half an
    iteration over or a whole one short of the budget. (1.5, not more: the policy-only arm's
    iterations are several times shorter than the +RM arm's, so it already runs several.)"""
    arms, name = ["policy-only", "plus-rm"], "budget"
    sets = [
        f"run.root={tmp_path}",
        "eval.problems=2",
        "eval.every=100",
        "run.keep_checkpoints=1",
        *SHORT,
        *small_overrides,
    ]
    ablation_flow(TINY, name, sets, seeds=1, iterations=1, arms=arms)
    first = {arm: iteration_history(tmp_path / f"{name}-{arm}-s0").wall_time_s.tolist() for arm in arms}
    budget_s = 1.5 * max(t for ends in first.values() for t in ends)
    ablation_flow(TINY, name, sets, seeds=1, budget_minutes=budget_s / 60, arms=arms)

    records = {r["arm"]: r for r in json.loads((tmp_path / "experiments" / name / "comparison.json").read_text())}
    table = (tmp_path / "experiments" / name / "comparison.md").read_text()
    assert f"- budget: {budget_s / 60:g} min of training steps per arm" in table
    for arm in arms:
        run = tmp_path / f"{name}-{arm}-s0"
        ends = iteration_history(run).wall_time_s.tolist()  # training time at each iteration's end
        assert ends[:1] == first[arm] and len(ends) >= 2, (arm, ends)  # extended: iteration 0 kept
        assert all(end < budget_s for end in ends[:-1]), (arm, ends, budget_s)  # each began under it
        assert ends[-1] >= budget_s, (arm, ends, budget_s)  # it trained until the budget was up
        compared = at_budget(iteration_history(run), budget_s / 60)
        assert compared == max(k for k, end in enumerate(ends) if end <= budget_s)
        # the compared checkpoint outlived the iteration after it (keep_checkpoints raised to 2): evaluated
        assert (eval_dir(run, compared) / "summary.json").exists()
        assert load_config(str(run / "config.yaml")).run.keep_checkpoints == 2
        minutes = ends[compared] / 60
        assert records[arm]["training_min_seeds"] == pytest.approx([minutes])
        assert records[arm]["budget_left"] == pytest.approx([budget_s / 60 - minutes])
        assert f"| {ARMS[arm].label} | 1 | {compared + 1} | {minutes:.2f} |" in table
        assert f"| {arm} | 0 | {compared} | in_domain |" in table  # its held-out row: the compared iteration


def test_experiments_that_differ_in_their_seeds_compare_as_one(prefect_server, small_overrides, tmp_path):
    """Seeds run as separate experiments (one at a time, for memory) pool into one comparison:
    the same numbers as one experiment with both seeds (each seed's held-out successes summed),
    and experiments that differ in more than their seeds, or share a seed, are refused."""
    sets = [f"run.root={tmp_path}", "eval.problems=2", *SHORT, *small_overrides]
    for seed in (0, 1):
        ablation_flow(TINY, f"cmp-s{seed}", [*sets, f"run.seed={seed}"], seeds=1, iterations=1, arms=["policy-only"])
    folders = [tmp_path / "experiments" / f"cmp-s{seed}" for seed in (0, 1)]
    out = tmp_path / "experiments" / "cmp"
    compare_experiments(folders, out)

    pooled = next(r for r in json.loads((out / "comparison.json").read_text()) if r["arm"] == "policy-only")
    evals = [
        json.loads((eval_dir(tmp_path / f"cmp-s{s}-policy-only-s{s}", 0) / "summary.json").read_text()) for s in (0, 1)
    ]
    in_domain = [next(x for x in e["splits"] if x["split"] == "in_domain") for e in evals]
    assert pooled["seeds"] == 2 and len(pooled["training_min_seeds"]) == 2
    assert pooled["strict_in_domain"]["n"] == 4
    assert pooled["strict_in_domain"]["successes"] == sum(round(x["strict_accuracy"] * x["n"]) for x in in_domain)
    rows = pd.read_csv(out / "iterations.csv")
    assert sorted(zip(rows.seed, rows.iteration)) == [(0, 0), (1, 0)] and (rows.wall_time_s > 0).all()
    assert json.loads((out / "compared.json").read_text())["experiments"] == [str(f.resolve()) for f in folders]

    with pytest.raises(ConfigError, match="seed appears in more than one"):
        compare_experiments([folders[0], folders[0]], tmp_path / "twice")
    other = tmp_path / "experiments" / "cmp-other"  # seed 2, but 3 held-out problems: not comparable
    (other / "arms").mkdir(parents=True)
    spec = json.loads((folders[1] / "experiment.json").read_text())
    spec["seeds"], spec["config"]["eval"]["problems"] = [2], 3
    (other / "experiment.json").write_text(json.dumps(spec))
    with pytest.raises(ConfigError, match="differ in more than their seeds"):
        compare_experiments([folders[0], other], tmp_path / "other")
    assert not (tmp_path / "twice").exists() and not (tmp_path / "other").exists()
