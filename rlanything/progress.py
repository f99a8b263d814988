"""Rich progress bars for long steps (rollout, judging, updates).

Set RLANYTHING_PROGRESS=0 to silence them (the tests do).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn


@contextmanager
def progress(description: str, total: int) -> Iterator[Callable[[int], None]]:
    """Yields `advance(n)`; shows `description [bar] done/total elapsed`."""
    disabled = os.environ.get("RLANYTHING_PROGRESS", "1") == "0"
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, disable=disabled, transient=False) as bar:
        task_id = bar.add_task(description, total=total)
        yield lambda n=1: bar.advance(task_id, n)
