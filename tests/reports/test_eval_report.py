"""The held-out evaluation's views: the RM's table in summary.md and the evaluation history of a
run, whose RM columns are NaN where no RM judged (eval.rm off, or a summary written before)."""

import json
import math
import sys
from pathlib import Path

import pandas as pd
import pytest

from rlanything.metric_names import RM_MEASURES
from rlanything.reports.eval_report import eval_history, plot_splits, summary_markdown

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the pixel checks beside this file
from pictures import panels, share_of  # noqa: E402

ROW = {
    "split": "in_domain",
    "env_kind": "reasoning_gym",
    "n": 4,
    "accuracy": 0.5,
    "ci_low": 0.15,
    "ci_high": 0.85,
    "strict_accuracy": 0.25,
    "strict_ci_low": 0.05,
    "strict_ci_high": 0.7,
    "fallback_accuracy": 0.5,
    "format_rate": 0.75,
    "env_errors": 0,
}
RM = {
    "rm_step_accuracy": 0.5,
    "rm_outcome_accuracy": 0.75,
    "rm_outcome_auroc": None,  # one outcome only: null in summary.json
    "rm_score_gap": -1 / 3,
    "rm_judged": 4,
    "rm_parse_rate": 1.0,
}


def write_summary(run_dir, folder: str, iteration: int, splits: list[dict]) -> None:
    out = run_dir / "eval" / folder
    out.mkdir(parents=True)
    record = {"iteration": iteration, "weights": "w", "splits": splits, "wall_time_s": float(iteration + 1)}
    (out / "summary.json").write_text(json.dumps(record))


def test_eval_history_has_the_rm_columns_nan_where_no_rm_judged(tmp_path):
    write_summary(tmp_path, "base", -1, [ROW])  # written before the RM was evaluated, or eval.rm off
    write_summary(tmp_path, "iter_0000", 0, [ROW | RM])
    history = eval_history(tmp_path).sort_values("iteration")
    assert set(RM_MEASURES) <= set(history) and all(history[c].dtype == float for c in RM_MEASURES)
    old, new = history.iloc[0], history.iloc[1]
    assert all(math.isnan(old[c]) for c in RM_MEASURES)
    assert new.rm_outcome_accuracy == 0.75 and math.isnan(new.rm_outcome_auroc) and new.rm_judged == 4
    assert eval_history(tmp_path / "no-such-run").empty


def test_summary_markdown_adds_the_rm_table_only_where_it_judged():
    details = {"reward model": "checkpoints/rm/iter_0000 (m = 3, constrained verdicts)"}
    text = summary_markdown(pd.DataFrame([ROW | RM]), "t", details)
    assert "| in_domain | 4 | 75.0% | n/a | 50.0% | -0.33 | 100.0% |" in text  # AUROC undefined: n/a
    assert "## Reward model" not in summary_markdown(pd.DataFrame([ROW]), "t", details)


INTERVAL = {"rm_outcome_auroc_low": 0.5612, "rm_outcome_auroc_high": 0.8149}


def test_the_rm_table_gives_the_auroc_interval_or_the_class_too_small_to_decide():
    rows = [
        ROW | RM | INTERVAL | {"rm_outcome_auroc": 0.6871, "rm_solved_judged": 10, "rm_unsolved_judged": 30},
        ROW | RM | {"split": "ood", "rm_outcome_auroc": 0.6243, "rm_solved_judged": 1, "rm_unsolved_judged": 63},
        ROW | RM | {"split": "hard", "rm_outcome_auroc": 0.55, "rm_solved_judged": 40, "rm_unsolved_judged": 9},
        ROW | RM | {"split": "tiny", "rm_outcome_auroc": 0.5, "rm_solved_judged": 3, "rm_unsolved_judged": 2},
        ROW | RM | {"split": "lost", "rm_solved_judged": 0, "rm_unsolved_judged": 12},  # AUROC null: one outcome
        ROW | RM | {"split": "old", "rm_outcome_auroc": 0.6243},  # an evaluation written before the interval
    ]
    text = summary_markdown(pd.DataFrame(rows), "t", {})
    assert "| outcome AUROC [95% CI] |" in text
    assert "| in_domain | 4 | 75.0% | 0.69 [0.56, 0.81] | 50.0% |" in text
    assert "| ood | 4 | 75.0% | 0.62 (too few: 1 solved) | 50.0% |" in text
    assert "| hard | 4 | 75.0% | 0.55 (too few: 9 unsolved) | 50.0% |" in text
    assert "| tiny | 4 | 75.0% | 0.50 (too few: 3 solved, 2 unsolved) | 50.0% |" in text
    assert "| lost | 4 | 75.0% | n/a (too few: 0 solved) | 50.0% |" in text
    assert "| old | 4 | 75.0% | 0.62 [n/a, n/a] | 50.0% |" in text
    assert "at least 10 judged episodes were solved" in text


def test_the_split_plot_draws_each_rate_as_a_bar_of_its_height(tmp_path):
    ood = ROW | {"split": "ood", "accuracy": 1.0, "strict_accuracy": 0.75, "format_rate": 0.5}
    out = plot_splits(pd.DataFrame([ROW, ood]), "t", tmp_path / "eval.png")
    for half, row in zip(panels(out, (560, 320), (1, 2)), (ROW, ood)):  # a split's bars in each half
        # accuracy tab:blue, strict accuracy tab:green, format rate tab:grey: areas as the rates
        blue, green, grey = (share_of(half, rgb) for rgb in ((31, 119, 180), (44, 160, 44), (127, 127, 127)))
        assert green / blue == pytest.approx(row["strict_accuracy"] / row["accuracy"], rel=0.1)
        assert grey / blue == pytest.approx(row["format_rate"] / row["accuracy"], rel=0.1)
