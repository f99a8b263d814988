"""The lr schedule, against values worked out by hand."""

import math

import pytest

from rlanything.algo.schedule import learning_rate

CONSTANT = dict(schedule="constant", total_steps=0, min_lr_ratio=0.0)  # total and floor unused: no decay


def test_warmup_rises_linearly_then_holds():
    # warmup 4: steps 0..3 at 1/4, 2/4, 3/4, 4/4 of the lr, then the lr
    lrs = [learning_rate(s, 2e-5, warmup_steps=4, **CONSTANT) for s in range(6)]
    assert lrs == pytest.approx([5e-6, 1e-5, 1.5e-5, 2e-5, 2e-5, 2e-5])


def test_no_warmup_is_the_constant_lr_from_the_first_step():
    assert [learning_rate(s, 1e-5, warmup_steps=0, **CONSTANT) for s in (0, 1, 100)] == [1e-5, 1e-5, 1e-5]


def test_cosine_goes_from_the_lr_to_its_floor_over_the_span():
    # warmup 2, total 6, floor 0.2: steps 2..5 span half a cosine in 3 intervals
    lrs = [learning_rate(s, 1.0, warmup_steps=2, schedule="cosine", total_steps=6, min_lr_ratio=0.2) for s in range(8)]
    half = [0.5 * (1 + math.cos(math.pi * k / 3)) for k in range(4)]  # 1, 0.75, 0.25, 0
    assert lrs == pytest.approx([0.5, 1.0] + [0.2 + 0.8 * h for h in half] + [0.2, 0.2])
    assert lrs[3] == pytest.approx(0.8) and lrs[4] == pytest.approx(0.4)


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="step"):
        learning_rate(-1, 1.0, warmup_steps=0, **CONSTANT)
    with pytest.raises(ValueError, match="schedule"):
        learning_rate(3, 1.0, warmup_steps=0, **{**CONSTANT, "schedule": "linear"})
