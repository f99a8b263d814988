"""The task buffer: one slot per original problem, every version kept with its lineage.

Snapshot `tasks/vNNNN.parquet` is the buffer as iteration NNNN starts; `adapt_tasks` of
iteration N writes v(N+1). This module only reads, writes and edits the frame; which rewrite
is accepted is decided in `algo/curriculum.py`, the adaptation itself in
`agent/adapt_tasks.py`. Statuses: active (the slot's current version), pending (a rewrite
awaiting evaluation), rejected, retired (an accepted rewrite's parent).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pandas as pd

from rlanything.storage.parquet import read_table, write_table
from rlanything.storage.schemas import TASKS


def task_id(slot: int, version: int) -> str:
    return f"s{slot:04d}v{version:02d}"


def initial_buffer(specs: list[dict]) -> pd.DataFrame:
    rows = [
        {
            "task_id": task_id(slot, 0),
            "slot": slot,
            "version": 0,
            "parent_id": None,
            "spec": json.dumps(spec, sort_keys=True),
            "status": "active",
            "direction": None,
            "critic_summary": None,
            "accuracy": None,
            "parent_accuracy": None,
            "decision": None,
            "created_iter": 0,
            "decided_iter": None,
        }
        for slot, spec in enumerate(specs)
    ]
    return pd.DataFrame(rows, columns=TASKS.names)


def read_buffer(path: Path) -> pd.DataFrame:
    return read_table(path, TASKS)


def write_buffer(frame: pd.DataFrame, path: Path) -> Path:
    return write_table(frame, TASKS, path)


def sample_batch(buffer: pd.DataFrame, n: int, seed: int) -> list[dict]:
    """`n` active tasks chosen with `seed` (all of them if fewer), plus every pending task."""
    active = buffer[buffer.status == "active"].sort_values("slot")
    chosen = sorted(random.Random(seed).sample(range(len(active)), min(n, len(active))))
    picked = [active.iloc[i] for i in chosen] + [row for _, row in buffer[buffer.status == "pending"].iterrows()]
    return [
        {
            "task_id": r.task_id,
            "slot": int(r.slot),
            "version": int(r.version),
            "spec": json.loads(r.spec),
            "pending": r.status == "pending",
        }
        for r in picked
    ]


def settle_pending(
    buffer: pd.DataFrame, task_id: str, accepted: bool, reason: str, accuracy: float | None, iteration: int
) -> pd.DataFrame:
    """Record the decision on pending version `task_id` (the rule lives in algo/curriculum.py)
    -> a new buffer. Accepted: the version becomes its slot's active one and its parent is
    retired; rejected: it stays in the buffer as `rejected`. `reason` goes to `decision`."""
    buffer = buffer.copy()
    rows = buffer.index[(buffer.task_id == task_id) & (buffer.status == "pending")]
    if len(rows) != 1:
        raise ValueError(f"{task_id!r} is not a pending version in the task buffer")
    idx = rows[0]
    buffer.loc[idx, ["status", "decision", "decided_iter"]] = ["active" if accepted else "rejected", reason, iteration]
    buffer.loc[idx, "accuracy"] = accuracy
    if accepted:
        buffer.loc[buffer.task_id == buffer.loc[idx, "parent_id"], "status"] = "retired"
    return buffer


def add_pending(
    buffer: pd.DataFrame,
    parent_id: str,
    spec: dict,
    direction: str,
    critic_summary: str,
    parent_accuracy: float,
    iteration: int,
) -> tuple[pd.DataFrame, str]:
    """Append a pending rewrite of `parent_id` (rolled out next iteration) -> (buffer, its id)."""
    parent = buffer[buffer.task_id == parent_id].iloc[0]
    version = int(buffer[buffer.slot == parent.slot].version.max()) + 1
    row = {
        "task_id": task_id(int(parent.slot), version),
        "slot": int(parent.slot),
        "version": version,
        "parent_id": parent_id,
        "spec": json.dumps(spec, sort_keys=True),
        "status": "pending",
        "direction": direction,
        "critic_summary": critic_summary,
        "accuracy": None,
        "parent_accuracy": parent_accuracy,
        "decision": None,
        "created_iter": iteration + 1,
        "decided_iter": None,
    }
    return pd.concat([buffer, pd.DataFrame([row], columns=buffer.columns)], ignore_index=True), row["task_id"]


def lineage(buffer: pd.DataFrame, slot: int) -> pd.DataFrame:
    """Every version of one slot, oldest first."""
    return buffer[buffer.slot == slot].sort_values("version").reset_index(drop=True)
