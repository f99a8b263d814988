"""`swapped`: an attribute of a library's module or class set for the length of a `with` block,
then put back. For the few places where a library takes no option for what we need: how
Prefect launches its temporary server (flows/servers.py), accelerate's DeepSpeed check
(models/training/saving.py). It does what `unittest.mock.patch.object` does there, without a test
library in the package. It imports nothing of ours: every layer may import it."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


@contextmanager
def swapped(owner: Any, name: str, value: Any) -> Iterator[None]:
    """`owner.name` is `value` inside the block, its old value again after it (an error too).

    >>> import math
    >>> with swapped(math, "pi", 3):
    ...     math.pi
    3
    >>> math.pi
    3.141592653589793
    """
    old = getattr(owner, name)
    setattr(owner, name, value)
    try:
        yield
    finally:
        setattr(owner, name, old)
