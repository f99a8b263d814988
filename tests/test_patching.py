"""`patching.swapped`: the attribute is swapped inside the block and put back after it, an error too."""

from __future__ import annotations

import doctest
from types import SimpleNamespace

import pytest

from rlanything import patching
from rlanything.patching import swapped


def test_the_value_is_swapped_in_the_block_and_put_back():
    owner = SimpleNamespace(x=1)
    with swapped(owner, "x", 2):
        assert owner.x == 2
    assert owner.x == 1
    with pytest.raises(ValueError), swapped(owner, "x", 3):
        assert owner.x == 3
        raise ValueError
    assert owner.x == 1


def test_a_missing_attribute_is_an_error_and_nothing_is_set():
    owner = SimpleNamespace()
    with pytest.raises(AttributeError), swapped(owner, "x", 1):
        pass
    assert not vars(owner)


def test_the_docstring_example():
    assert doctest.testmod(patching).failed == 0
