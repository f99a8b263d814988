"""Task-buffer edits: pending versions are added and settled, lineage is kept."""

import json

import pytest

from rlanything.storage.buffer import add_pending, initial_buffer, lineage, read_buffer, settle_pending, write_buffer


def buffer_with_pending(direction, parent_acc):
    buffer = initial_buffer([{"k": 1}, {"k": 2}])
    buffer, new_id = add_pending(buffer, "s0000v00", {"k": 10}, direction, "critic says", parent_acc, iteration=0)
    return buffer, new_id


def test_add_pending_records_lineage():
    buffer, new_id = buffer_with_pending("harder", 0.9)
    assert new_id == "s0000v01"
    row = buffer[buffer.task_id == new_id].iloc[0]
    assert (row.parent_id, row.status, row.direction, row.critic_summary) == (
        "s0000v00",
        "pending",
        "harder",
        "critic says",
    )
    assert (row.parent_accuracy, row.created_iter, json.loads(row.spec)) == (0.9, 1, {"k": 10})
    buffer, again = add_pending(buffer, "s0000v00", {"k": 11}, "harder", "", 0.9, iteration=1)
    assert again == "s0000v02"  # versions count per slot, rejected ones included


def test_settle_pending_accepts_or_rejects_one_version():
    buffer, new_id = buffer_with_pending("harder", 0.9)
    accepted = settle_pending(buffer, new_id, True, "accepted", 0.5, iteration=2).set_index("task_id")
    assert accepted.status.to_dict() == {"s0000v00": "retired", "s0001v00": "active", new_id: "active"}
    assert (accepted.decision[new_id], accepted.decided_iter[new_id], accepted.accuracy[new_id]) == ("accepted", 2, 0.5)
    rejected = settle_pending(buffer, new_id, False, "not_harder", 0.9, iteration=2).set_index("task_id")
    assert rejected.status.to_dict() == {"s0000v00": "active", "s0001v00": "active", new_id: "rejected"}
    assert buffer.set_index("task_id").status[new_id] == "pending"  # the input is not modified
    with pytest.raises(ValueError, match="not a pending version"):
        settle_pending(buffer, "s0000v00", True, "accepted", 0.5, iteration=2)


def test_lineage_and_snapshot_round_trip(tmp_path):
    buffer, new_id = buffer_with_pending("harder", 0.9)
    buffer = settle_pending(buffer, new_id, True, "accepted", 0.5, iteration=1)
    write_buffer(buffer, tmp_path / "v0002.parquet")
    history = lineage(read_buffer(tmp_path / "v0002.parquet"), slot=0)
    assert history.task_id.tolist() == ["s0000v00", "s0000v01"]
    assert history.status.tolist() == ["retired", "active"] and history.parent_id.tolist()[1] == "s0000v00"
