"""Where rlanything keeps files shared by runs (converted models, generated games): a neutral
module every layer may import (it imports nothing of ours)."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """``$RLANYTHING_CACHE`` or ``~/.cache/rlanything``, created if missing."""
    root = os.environ.get("RLANYTHING_CACHE") or Path.home() / ".cache" / "rlanything"
    path = Path(root).expanduser()
    path.mkdir(parents=True, exist_ok=True)
    return path
