"""What a person sees in a report's PNG, checked on its pixels: it decodes, it has the size its
figure declares, and its panels have data drawn in them (coloured pixels: axes, ticks and text
are black and grey; data lines, markers, bars and heat maps are coloured)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image


def panels(path: Path, size: tuple[int, int], grid: tuple[int, int] = (1, 1)) -> list[np.ndarray]:
    """The PNG at `path`, checked to decode at `size` (width, height), cut into the cells of the
    rows × cols `grid` its figure's panels sit in, row by row (a wide panel spans several cells);
    each cell height × width × RGB."""
    with Image.open(path) as image:
        assert image.format == "PNG" and image.size == size, (path, image.format, image.size)
        rgb = np.asarray(image.convert("RGB"))
    rows, cols = grid
    return [cell for band in np.array_split(rgb, rows, axis=0) for cell in np.array_split(band, cols, axis=1)]


def coloured(cell: np.ndarray) -> float:
    """Share of a picture's pixels that are coloured (neither white, grey nor black)."""
    rgb = cell.astype(int)
    return float(((rgb.max(axis=-1) - rgb.min(axis=-1)) > 40).mean())


def share_of(cell: np.ndarray, rgb: tuple[int, int, int], tolerance: int = 3) -> float:
    """Share of a picture's pixels of colour `rgb` (each channel within `tolerance`)."""
    return float((np.abs(cell.astype(int) - np.array(rgb)).max(axis=-1) <= tolerance).mean())


def assert_every_panel_drawn(path: Path, size: tuple[int, int], grid: tuple[int, int], least: float = 0.002) -> None:
    """`path` is a PNG of `size` with data drawn in every cell of `grid`: more than `least` of
    each cell's pixels coloured (a line across a panel is about 0.5%)."""
    shares = [coloured(cell) for cell in panels(path, size, grid)]
    assert min(shares) > least, (path, [round(s, 4) for s in shares])
