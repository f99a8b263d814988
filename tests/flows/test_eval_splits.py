"""Evaluating a checkpoint split by split adds to its evaluation: `rlanything eval X --split ood`
after `--split in_domain` keeps the in-domain episodes, judgments and summary row (it replaced
them once, losing an evaluation that only MLflow's metrics still remembered)."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq

TINY = str(Path(__file__).resolve().parents[2] / "configs" / "tiny.yaml")


def _eval(root: Path, split: str) -> Path:
    from rlanything.flows.evaluation import eval_flow

    return Path(eval_flow("builtin:tiny-random", TINY, [f"run.root={root}"], split, 3)["out_dir"])


def _splits(out: Path, name: str) -> list[str]:
    return pq.read_table(out / name).column("split").to_pylist()


def test_a_second_split_is_added_to_the_first(prefect_server, tmp_path):
    out = _eval(tmp_path, "in_domain")
    first = pq.read_table(out / "episodes.parquet")
    first_judged = pq.read_table(out / "judgments.parquet")
    assert set(_splits(out, "episodes.parquet")) == {"in_domain"} and first_judged.num_rows > 0

    assert _eval(tmp_path, "ood") == out
    episodes = pq.read_table(out / "episodes.parquet")
    assert _splits(out, "episodes.parquet") == ["in_domain"] * 3 + ["ood"] * 3
    assert episodes.slice(0, 3).equals(first)  # the in-domain episodes, untouched
    judged = pq.read_table(out / "judgments.parquet")
    assert {"in_domain", "ood"} == set(judged.column("split").to_pylist())
    in_domain_judged = judged.slice(0, first_judged.num_rows)
    assert in_domain_judged.equals(first_judged)
    summary = json.loads((out / "summary.json").read_text())
    assert [row["split"] for row in summary["splits"]] == ["in_domain", "ood"]
    assert "| in_domain |" in (out / "summary.md").read_text() and "| ood |" in (out / "summary.md").read_text()

    _eval(tmp_path, "in_domain")  # evaluated again: replaced by the same greedy episodes, ood kept
    assert pq.read_table(out / "episodes.parquet").equals(episodes)
