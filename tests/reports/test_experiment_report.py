"""The ablation's comparison from hand-written run folders: every number by hand."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pandas as pd
import pytest

from rlanything.reports import experiment_report as report

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the pixel checks beside this file
from pictures import panels, share_of  # noqa: E402

ARMS = {"policy-only": "policy only", "plus-rm": "+RM"}
ARM_COLOURS = [(31, 119, 180), (255, 127, 14)]  # matplotlib's C0, C1: the arms in order


def _split(split: str, n: int, strict: float, accuracy: float, rm_acc: float | None = None, auroc=None) -> dict:
    row = {
        "split": split,
        "env_kind": "reasoning_gym",
        "n": n,
        "accuracy": accuracy,
        "ci_low": 0.0,
        "ci_high": 1.0,
        "strict_accuracy": strict,
        "strict_ci_low": 0.0,
        "strict_ci_high": 1.0,
    }
    row |= {"rm_outcome_accuracy": rm_acc} if rm_acc is not None else {}
    if auroc is not None:  # (AUROC, low, high, solved judged, unsolved judged)
        keys = ("rm_outcome_auroc", "rm_outcome_auroc_low", "rm_outcome_auroc_high")
        row |= dict(zip((*keys, "rm_solved_judged", "rm_unsolved_judged"), auroc))
    return row


def _run(root: Path, name: str, iterations: list[dict], evals: dict[str, tuple[int, float, list[dict]]]) -> Path:
    run = root / name
    for i, metrics in enumerate(iterations):
        (run / f"iter_{i:04d}").mkdir(parents=True)
        record = {"iteration": i, "time/rollout_s": 60.0, "time/rm_score_s": 30.0, **metrics}
        (run / f"iter_{i:04d}" / "summary.json").write_text(json.dumps(record))
    for folder, (iteration, wall, splits) in evals.items():
        (run / "eval" / folder).mkdir(parents=True)
        record = {"iteration": iteration, "wall_time_s": wall, "splits": splits}
        (run / "eval" / folder / "summary.json").write_text(json.dumps(record))
    return run


@pytest.fixture
def runs(tmp_path) -> pd.DataFrame:
    rows = []
    # policy-only: seeds 0, 1; no RM in the loop (no RM measure anywhere); no adaptation
    for seed, strict in enumerate([0.2, 0.4]):
        its = [{"accuracy": 0.5}, {"accuracy": 0.6}]
        evals = {"base": (-1, 0.0, [_split("in_domain", 10, 0.1, 0.3)]), "iter_0001": (1, 180.0, [])}
        evals["iter_0001"] = (1, 180.0, [_split("in_domain", 10, strict, strict + 0.1)])
        run = _run(tmp_path, f"po-s{seed}", its, evals)
        rows.append({"arm": "policy-only", "seed": seed, "run_dir": str(run)})
    # +RM: seeds 0, 1 with accepted tasks, AUROC and the RM judged on held-out episodes, the
    # starting model's too (the same accuracies as policy-only's evaluation of it)
    for seed, (strict, rm_acc, accepted, heldout_rm) in enumerate([(0.5, 0.6, 2, 0.5), (0.7, 0.8, 4, 0.75)]):
        its = [
            {"accuracy": 0.5, "rm/outcome_accuracy": 0.5, "adapt/accepted_total": 1},
            {"accuracy": 0.7, "rm/outcome_accuracy": rm_acc, "rm/outcome_auroc": 0.9, "adapt/accepted_total": accepted},
        ]
        # held-out AUROC: seed 0 with its interval, seed 1 with too few solved episodes for one
        auroc = [(0.7, 0.55, 0.85, 12, 20), (0.9, None, None, 3, 7)][seed]
        evals = {"iter_0001": (1, 180.0, [_split("in_domain", 10, strict, strict, heldout_rm, auroc)])}
        evals["base"] = (-1, 0.0, [_split("in_domain", 10, 0.1, 0.3, 0.4 + 0.2 * seed, (0.5, 0.4, 0.6, 12, 20))])
        run = _run(tmp_path, f"rm-s{seed}", its, evals)
        rows.append({"arm": "plus-rm", "seed": seed, "run_dir": str(run)})
    return pd.DataFrame(rows)


def test_iteration_history_sums_step_times(runs):
    history = report.iteration_history(Path(runs.run_dir[2]))
    assert history.wall_time_s.tolist() == [90.0, 180.0]  # 60 + 30 per iteration, cumulative
    assert history["adapt/accepted_total"].tolist() == [1.0, 2.0]
    assert math.isnan(history["rm/process_accuracy"][0])  # not measured: NaN, not 0


def test_comparison_table_by_hand(runs):
    training, heldout = report.collect(runs)
    table = report.comparison_table(ARMS, training, heldout, ["in_domain"]).set_index("arm")
    po, rm, base = table.loc["policy-only"], table.loc["plus-rm"], table.loc["base"]
    # the starting model: 0.1 strict, 0.3 with fallback of 10, per seed; its RM measures from +RM's
    # evaluations (0.4, 0.6), the first arm whose RM judged it, not policy-only's (none)
    assert (base.seeds, base.iterations) == (2, 0) and list(table.index) == ["base", "policy-only", "plus-rm"]
    assert (base.strict_in_domain["successes"], base.accuracy_in_domain["successes"]) == (2, 6)
    assert base.strict_in_domain["n"] == 20 and base.heldout_rm_outcome_accuracy_in_domain == pytest.approx(0.5)
    assert (po.seeds, po.iterations, po.training_min) == (2, 2, 3.0)
    # last evaluation, seeds pooled: (2 + 4) of 20 strict, (3 + 5) of 20 with fallback
    assert (po.strict_in_domain["successes"], po.strict_in_domain["n"]) == (6, 20)
    assert po.accuracy_in_domain["successes"] == 8
    # +RM: 5 + 7 = 12 of 20 -> 0.6, Wilson 95% [0.3866, 0.7812] (z = 1.96)
    assert rm.strict_in_domain["rate"] == 0.6
    assert round(rm.strict_in_domain["ci_low"], 4) == 0.3866 and round(rm.strict_in_domain["ci_high"], 4) == 0.7812
    assert all(math.isnan(po[metric]) for metric in report.RM_ACCURACY)  # no RM in the loop
    # (0.6 + 0.8) / 2 at the last iteration
    assert rm["rm/outcome_accuracy"] == pytest.approx(0.7) and rm["rm/outcome_auroc"] == pytest.approx(0.9)
    assert rm["adapt/accepted_total"] == 3.0 and math.isnan(po["adapt/accepted_total"])
    assert rm["heldout_rm_outcome_accuracy_in_domain"] == pytest.approx(0.625)
    assert math.isnan(po["heldout_rm_outcome_accuracy_in_domain"]) and math.isnan(rm["rm/process_accuracy"])

    text = report.comparison_markdown("ablation t", {}, table.reset_index(), heldout, ["in_domain"])
    assert "| +RM | 2 | 2 | 3.00, 3.00 | 60.0% [38.7%, 78.1%] (n=20) |" in text  # 90 s + 90 s per seed
    assert "unfinished at the budget" not in text and "budget_left" not in table  # no wall-time budget
    assert "| 0.70 | 0.90 | n/a |" in text  # RM outcome acc, AUROC, process acc (not measured)
    po_row = next(line for line in text.splitlines() if line.startswith("| policy only |"))
    assert po_row.endswith("| n/a | n/a | n/a | n/a | n/a | n/a |")  # RM train x3, held-out acc, AUROC, accepted
    assert "| 0.62 | 0.80 | 3.0 |" in text  # +RM held-out: outcome acc, AUROC (0.7 + 0.9) / 2, accepted tasks
    rm_seeds = [line for line in text.splitlines() if line.startswith("| plus-rm |")]
    assert rm_seeds[0].endswith("| 10 | 0.70 [0.55, 0.85] |")
    assert rm_seeds[1].endswith("| 10 | 0.90 (too few: 3 solved, 7 unsolved) |")
    po_seeds = [line for line in text.splitlines() if line.startswith("| policy-only |")]
    assert len(po_seeds) == 2 and all(line.endswith("| n/a |") for line in po_seeds)  # never judged
    seeds = [line for line in text.splitlines() if line.startswith("| policy-only |") or line.startswith("| plus-rm |")]
    assert [line.split(" | ")[:3] for line in seeds][:2] == [["| policy-only", "0", "1"], ["| policy-only", "1", "1"]]
    metrics = report.table_metrics(table.reset_index(), ["in_domain"])
    assert metrics["plus-rm/heldout_in_domain_strict"] == 0.6 and "policy-only/adapt_accepted_total" not in metrics
    assert metrics["plus-rm/rm_outcome_accuracy"] == pytest.approx(0.7)
    assert not [k for k in metrics if k.startswith("policy-only/rm_")]  # NaN: not logged (MLflow takes numbers)


def test_under_a_wall_time_budget_every_arm_is_read_as_it_stood_when_its_minutes_were_up():
    # iterations end at these training seconds; an 8-minute (480 s) budget
    rows = [("policy-only", 0, 0, 240.0), ("policy-only", 0, 1, 480.0), ("policy-only", 0, 2, 700.0)]
    rows += [("policy-only", 1, 0, 500.0)]  # seed 1's first iteration alone ran past it
    rows += [("plus-rm", 0, 0, 200.0), ("plus-rm", 0, 1, 444.0), ("plus-rm", 0, 2, 600.0)]
    rows += [("plus-rm", 1, 0, 300.0), ("plus-rm", 1, 1, 481.0)]
    training = pd.DataFrame(rows, columns=["arm", "seed", "iteration", "wall_time_s"])
    training = training.assign(**{metric: math.nan for metric in report.TRAINING_METRICS})
    compared_rows = [(0, 1), (1, 0)]  # +RM's iterations at the budget: their RM measures are read
    for seed, it in compared_rows:
        training.loc[
            (training.arm == "plus-rm") & (training.seed == seed) & (training.iteration == it), "rm/outcome_accuracy"
        ] = 0.6 + 0.2 * seed
    training.loc[(training.arm == "plus-rm") & (training.iteration == 2), "rm/outcome_accuracy"] = 0.0  # past it
    evals = [("policy-only", 0, it, 0.1 * (it + 2)) for it in (-1, 1, 2)] + [("policy-only", 1, -1, 0.1)]
    evals += [("plus-rm", 0, it, 0.1 * (it + 5)) for it in (-1, 0, 2)]  # its iteration 1 was not evaluated
    evals += [("plus-rm", 1, it, 0.1 * (it + 5)) for it in (-1, 0, 1)]
    heldout = pd.DataFrame(evals, columns=["arm", "seed", "iteration", "strict_accuracy"])
    heldout = heldout.assign(split="in_domain", n=10, accuracy=heldout.strict_accuracy)
    heldout = heldout.assign(strict_ci_low=0.0, strict_ci_high=1.0, ci_low=0.0, ci_high=1.0)

    cut_training, cut_heldout = report.cut_at_budget(training, heldout, 8.0)
    # what ended within 480 s: policy-only s0 0-1, s1 nothing; +RM s0 0-1, s1 0 (1 ended at 481 s)
    kept = cut_training.groupby(["arm", "seed"]).iteration.max().to_dict()
    assert kept == {("plus-rm", 0): 1, ("plus-rm", 1): 0, ("policy-only", 0): 1, ("policy-only", 1): -1}
    # evaluations: the compared iteration's (the start for policy-only s1), and each start; +RM
    # seed 0's iteration 1 has none, and its older evaluation of iteration 0 does not stand in
    compared = cut_heldout[cut_heldout.iteration >= 0].groupby(["arm", "seed"]).iteration.max().to_dict()
    assert compared == {("plus-rm", 1): 0, ("policy-only", 0): 1}
    assert len(cut_heldout[cut_heldout.iteration < 0]) == 4

    table = report.comparison_table(ARMS, cut_training, cut_heldout, ["in_domain"], budget_minutes=8.0)
    po, rm, base = (table.set_index("arm").loc[arm] for arm in ("policy-only", "plus-rm", "base"))
    assert po.training_min_seeds == pytest.approx([8.0, 0.0]) and po.budget_left == pytest.approx([0.0, 8.0])
    assert (po.seeds, po.iterations, rm.iterations) == (2, 2, 2)  # the most iterations any seed had
    assert rm.training_min_seeds == pytest.approx([7.4, 5.0]) and rm.budget_left == pytest.approx([0.6, 3.0])
    assert base.budget_left is None and base.training_min_seeds == []
    # held out: policy-only s0 at iteration 1 (0.3) and s1 at its start (0.1 * 1 = 0.1): 4 of 20
    assert (po.strict_in_domain["successes"], po.strict_in_domain["n"]) == (4, 20)
    assert (rm.strict_in_domain["successes"], rm.strict_in_domain["n"]) == (5, 10)  # s1 at iteration 0; s0 has none
    assert rm["rm/outcome_accuracy"] == pytest.approx(0.7)  # (0.6 + 0.8) / 2, not iteration 2's 0.0

    text = report.comparison_markdown("ablation t", {}, table, cut_heldout, ["in_domain"])
    assert "| arm | seeds | iterations | training min (per seed) | min unfinished at the budget (per seed) |" in text
    assert "| +RM | 2 | 2 | 7.40, 5.00 | 0.60, 3.00 |" in text
    assert "| policy only | 2 | 2 | 8.00, 0.00 | 0.00, 8.00 |" in text
    assert "| starting model (before training) | 2 | 0 | 0.00 | n/a |" in text
    seeds = [line.split(" | ")[:3] for line in text.splitlines() if line.startswith("| policy-only |")]
    assert seeds == [["| policy-only", "0", "1"], ["| policy-only", "1", "-1"]]
    record = json.loads(table.to_json(orient="records"))[2]
    assert record["budget_left"] == pytest.approx([0.6, 3.0]) and record["training_min_seeds"] == pytest.approx(
        [7.4, 5.0]
    )


def test_figures_draw_each_arm_where_it_was_measured(runs, tmp_path):
    training, heldout = report.collect(runs)
    paths = report.plot_figures(ARMS, training, heldout, ["in_domain"], tmp_path)
    assert [p.name for p in paths] == [f"{name}.png" for name in report.FIGURES]
    sizes = {"integrated_vs_outcome": ((960, 336), 2), "rm_accuracy": ((1200, 336), 3), "heldout_rm": ((960, 336), 2)}

    def arms_drawn(name: str) -> list[set[str]]:
        """Per panel of the figure, the arms whose colour (C0, C1 in ARMS order) it shows."""
        size, count = sizes.get(name, ((480, 336), 1))
        cells = panels(tmp_path / f"{name}.png", size, (1, count))
        return [{arm for arm, rgb in zip(ARMS, ARM_COLOURS) if share_of(cell, rgb) > 1e-4} for cell in cells]

    both = set(ARMS)
    assert arms_drawn("heldout_vs_iteration") == arms_drawn("heldout_vs_wall_time") == [both]
    assert arms_drawn("integrated_vs_outcome") == [both, both]  # training-batch and held-out accuracy
    # outcome accuracy and AUROC: only +RM measured (policy-only has no RM); process accuracy nobody
    assert arms_drawn("rm_accuracy") == [{"plus-rm"}, {"plus-rm"}, set()]
    assert arms_drawn("heldout_rm") == [both, {"plus-rm"}]  # policy accuracy; held-out AUROC where the RM judged
    assert arms_drawn("accepted_tasks") == [{"plus-rm"}]  # policy-only adapted no task


def test_pooled_accuracy_of_nothing_is_nan():
    pool = report.pooled_accuracy(pd.DataFrame({"n": [0], "strict_accuracy": [math.nan]}))
    assert pool["n"] == 0 and math.isnan(pool["rate"]) and math.isnan(pool["ci_low"])


def test_heldout_figure_dashes_the_fallback_accuracy_only_where_it_differs(runs):
    _, heldout = report.collect(runs)
    fig = report.heldout_figure(ARMS, heldout, ["in_domain"], "iteration", 1.0, "iteration")
    lines = fig.axes[0].get_lines()
    solid = [line for line in lines if line.get_linestyle() == "-"]
    dashed = [line for line in lines if line.get_linestyle() == "--"]
    assert len(solid) == len(dashed) == 4  # 2 arms x 2 seeds
    # policy-only seed 0: the starting model (iteration -1) and iteration 1, strict 0.1, 0.2; with fallback 0.3, 0.3
    assert list(solid[0].get_xdata()) == [-1, 1] and list(solid[0].get_ydata()) == [0.1, 0.2]
    assert list(dashed[0].get_ydata()) == pytest.approx([0.3, 0.3])
    assert fig.axes[0].get_legend_handles_labels()[1] == list(ARMS.values())  # each arm labelled once
    same = heldout.assign(accuracy=heldout.strict_accuracy)  # no answer needed the fallback
    fig = report.heldout_figure(ARMS, same, ["in_domain"], "iteration", 1.0, "iteration")
    assert {line.get_linestyle() for line in fig.axes[0].get_lines()} == {"-"}
    assert "dashed" not in fig.axes[0].get_title()


def test_heldout_rm_figure_draws_the_auroc_interval_where_there_is_one(runs):
    _, heldout = report.collect(runs)
    fig = report.heldout_rm_figure(ARMS, heldout, "in_domain")
    right = fig.axes[1]
    # +RM seed 0: the starting model's 0.5 and iteration 1's 0.7; seed 1: 0.5 and 0.9
    points = [list(line.get_ydata()) for line in right.get_lines() if line.get_linestyle() == "-"]
    assert points == [[0.5, 0.7], [0.5, 0.9]]
    # bars: 0.5 [0.4, 0.6], 0.7 [0.55, 0.85]; seed 1's iteration 1 (too few solved) gets none
    segments = [seg for coll in right.collections for seg in coll.get_segments()]
    spans = sorted((round(seg[0][1], 2), round(seg[1][1], 2)) for seg in segments)
    assert spans == [(0.4, 0.6), (0.4, 0.6), (0.55, 0.85), (0.9, 0.9)]
    none = report.heldout_rm_figure(ARMS, heldout.drop(columns="rm_outcome_auroc"), "in_domain")
    assert [t.get_text() for t in none.axes[1].texts] == ["not measured"]
