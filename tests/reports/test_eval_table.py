"""`rlanything eval`'s terminal table (`reports.eval_report.eval_table`): every figure whole at 80
columns, in a terminal or not (a pipe, a file), with the RM's measures and two splits."""

import io

from rich.console import Console

from rlanything.reports.eval_report import eval_table

BASE = {
    "env_kind": "reasoning_gym",
    "n": 48,
    "accuracy": 0.375,
    "ci_low": 0.2511,
    "ci_high": 0.5178,
    "strict_accuracy": 0.3125,
    "fallback_accuracy": 0.375,
    "format_rate": 0.9583,
    "env_errors": 1,
    "rm_judged": 48,
    "rm_outcome_accuracy": 0.75,
    "rm_step_accuracy": 0.6875,
    "rm_score_gap": 0.25,
    "rm_parse_rate": 1.0,
}
SUMMARY = [  # as summary.json has them: NaN as None
    BASE
    | {"split": "in_domain", "rm_outcome_auroc": 0.6871, "rm_outcome_auroc_low": 0.5612}
    | {"rm_outcome_auroc_high": 0.8149, "rm_solved_judged": 18, "rm_unsolved_judged": 30}
    | {"episodes_from": "eval/iter_0012", "judgments_from": None},
    BASE
    | {"split": "ood", "n": 64, "accuracy": 1.0, "ci_low": 0.9431, "ci_high": 1.0, "strict_accuracy": 1.0}
    | {"fallback_accuracy": 1.0, "format_rate": 1.0, "rm_judged": 1000, "rm_score_gap": -1.0}
    | {"rm_outcome_auroc": 0.6243, "rm_outcome_auroc_low": None, "rm_outcome_auroc_high": None}
    | {"rm_solved_judged": 1000, "rm_unsolved_judged": 0, "rm_parse_rate": None},
]


def render(table, **console) -> str:
    out = io.StringIO()
    Console(file=out, **console).print(table)
    return out.getvalue()


def test_every_figure_is_whole_at_80_columns_in_a_pipe_and_in_a_terminal():
    table = eval_table(SUMMARY, "rlanything eval: runs/smollm2-arith@13 (greedy, reasoning_gym)")
    cells = {column.header: list(column.cells) for column in table.columns}
    assert cells["in_domain"][:2] == ["48", "37.5% [25.1%, 51.8%]"] and cells["ood"][1] == "100.0% [94.3%, 100.0%]"
    for console in (
        {"width": 80, "force_terminal": False},
        {"width": 80, "force_terminal": True, "color_system": None},
    ):
        text = render(table, **console)
        lines = text.splitlines()
        assert max(map(len, lines)) <= 80 and "…" not in text, text
        every = [
            "in_domain",
            "ood",
            "37.5% [25.1%, 51.8%]",
            "100.0% [94.3%, 100.0%]",
            "strict (boxed)",
            "31.2%",
            "95.8%",
            "RM outcome accuracy",
            "75.0%",
            "RM AUROC [95% CI]",
            "0.69 [0.56, 0.81]",
            "0.62 (too few)",
            "48 (18 solved)",
            "1000 (1000 solved)",
            "+0.25",
            "-1.00",
            "RM parse rate",
            "reused: eval/iter_0012",
        ]
        for cell in every:  # each on one line, whole
            assert any(cell in line for line in lines), (cell, text)
        figures = [line for line in lines if "37.5% [25.1%, 51.8%]" in line]
        assert "100.0% [94.3%, 100.0%]" in figures[0]  # the splits side by side: one row per measure


def test_the_rm_auroc_shows_its_interval_or_that_too_few_episodes_decide_it():
    old = {k: v for k, v in SUMMARY[0].items() if not k.startswith("rm_solved") and not k.startswith("rm_unsolved")}
    summary = [
        SUMMARY[0],
        SUMMARY[1],
        # written before the AUROC's interval and its class counts existed
        old | {"split": "old", "rm_outcome_auroc": 0.6243, "rm_outcome_auroc_low": None, "rm_outcome_auroc_high": None},
        SUMMARY[0] | {"split": "none", "rm_outcome_auroc": None, "rm_outcome_auroc_low": None},
    ]
    table = eval_table(summary, "t")
    rows = {cells[0]: list(cells[1:]) for cells in zip(*(column.cells for column in table.columns))}
    assert rows["RM AUROC [95% CI]"] == ["0.69 [0.56, 0.81]", "0.62 (too few)", "0.62 [n/a, n/a]", "n/a"]
    assert rows["RM judged"] == ["48 (18 solved)", "1000 (1000 solved)", "48", "48 (18 solved)"]
    assert rows["RM score gap"] == ["+0.25", "-1.00", "+0.25", "+0.25"] and rows["RM parse rate"][1] == "n/a"
    assert rows["episodes"] == ["reused: eval/iter_0012", "played", "reused: eval/iter_0012", "reused: eval/iter_0012"]
    assert rows["RM judgments"] == ["new", "new", "new", "new"]


def test_without_the_rm_or_any_reuse_the_table_has_the_policy_rows_only():
    policy_only = [
        {k: v for k, v in row.items() if not k.startswith("rm_") and not k.endswith("_from")} for row in SUMMARY
    ]
    table = eval_table(policy_only, "t")
    measures = list(table.columns[0].cells)
    assert measures == [
        "n (valid episodes)",
        "accuracy [95% CI]",
        "strict (boxed)",
        "answer fallback",
        "format rate",
        "env errors",
    ]
    assert "RM" not in render(table, width=80)
