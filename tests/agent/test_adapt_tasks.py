"""Judging pending rewrites: the acceptance rule applied to the task buffer (step 7)."""

import pytest

from rlanything.agent.adapt_tasks import judge_pending
from rlanything.storage.buffer import add_pending, initial_buffer


def buffer_with_pending(direction, parent_acc):
    buffer = initial_buffer([{"k": 1}, {"k": 2}])
    buffer, new_id = add_pending(buffer, "s0000v00", {"k": 10}, direction, "critic says", parent_acc, iteration=0)
    return buffer, new_id


@pytest.mark.parametrize(
    "direction, parent_acc, acc, decision, reason",
    [
        ("harder", 0.9, 0.5, "accepted", "accepted"),
        ("harder", 0.9, 0.2, "accepted", "accepted"),  # = α_low is inside
        ("harder", 0.9, 0.125, "rejected", "below_band"),
        ("harder", 0.9, 0.9, "rejected", "not_harder"),  # equal accuracies
        ("harder", 0.9, 0.0, "rejected", "zero_accuracy"),
        ("easier", 0.0, 0.5, "accepted", "accepted"),
        ("easier", 0.1, 0.8, "accepted", "accepted"),  # = α_high is inside
        ("easier", 0.1, 0.875, "rejected", "above_band"),
        ("easier", 0.1, 0.1, "rejected", "not_easier"),
        ("easier", 0.0, 0.0, "rejected", "zero_accuracy"),
    ],
)
def test_judge_pending_applies_the_acceptance_rule(direction, parent_acc, acc, decision, reason):
    buffer, new_id = buffer_with_pending(direction, parent_acc)
    after, judged = judge_pending(buffer, {new_id: acc, "s0000v00": parent_acc}, iteration=3, low=0.2, high=0.8)
    assert judged == [
        {"task_id": new_id, "accuracy": acc, "parent_accuracy": parent_acc, "decision": decision, "reason": reason}
    ]
    status = after.set_index("task_id").status
    if decision == "accepted":
        assert status[new_id] == "active" and status["s0000v00"] == "retired"
    else:
        assert status[new_id] == "rejected" and status["s0000v00"] == "active"
    assert status["s0001v00"] == "active"
    row = after.set_index("task_id").loc[new_id]
    assert (row.decided_iter, row.decision, row.accuracy) == (3, reason, acc)
    assert buffer.set_index("task_id").status[new_id] == "pending"  # the input is not modified


def test_unmeasured_pending_is_rejected():
    buffer, new_id = buffer_with_pending("easier", 0.0)
    after, judged = judge_pending(buffer, {}, iteration=1, low=0.2, high=0.8)
    assert judged[0]["reason"] == "not_measured" and after.set_index("task_id").status[new_id] == "rejected"


def test_judge_pending_without_pending_versions_changes_nothing():
    buffer = initial_buffer([{"k": 1}])
    after, judged = judge_pending(buffer, {"s0000v00": 1.0}, iteration=0, low=0.2, high=0.8)
    assert judged == [] and after.equals(buffer) and after is not buffer
