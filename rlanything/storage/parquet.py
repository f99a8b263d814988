"""Atomic file writes: write to a temp file in the same folder, then `os.replace`.

A reader therefore sees either no file or a complete one; a step is done iff its file exists.
Every file a run writes goes through here: Parquet tables, screenshots, summary.json, DONE,
the reports (PNG and markdown) and mlflow_run_id.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from rlanything.storage.schemas import LATER_COLUMNS


def write_table(rows: pd.DataFrame | list[dict], schema: pa.Schema, path: Path) -> Path:
    """Validate `rows` against `schema` (exact columns, types cast) and write atomically."""
    if isinstance(rows, pd.DataFrame):
        frame = rows
    else:  # no `columns=` here: it would silently drop unexpected keys
        frame = pd.DataFrame(rows) if rows else pd.DataFrame(columns=schema.names)
    missing = set(schema.names) - set(frame.columns)
    extra = set(frame.columns) - set(schema.names)
    if missing or extra:
        raise ValueError(f"{path.name}: columns differ from schema (missing {sorted(missing)}, extra {sorted(extra)})")
    table = pa.Table.from_pandas(frame[schema.names], schema=schema, preserve_index=False)
    return atomic_write(path, lambda tmp: pq.write_table(table, tmp))


def write_bytes(data: bytes, path: Path) -> Path:
    """Write a small binary file (a screenshot) atomically, like `write_table`."""
    return atomic_write(path, lambda tmp: tmp.write_bytes(data))


def write_text(text: str, path: Path) -> Path:
    """Write a small text file (summary.json, DONE, markdown) atomically, UTF-8."""
    return atomic_write(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))


def atomic_write(path: Path, write: Callable[[Path], object]) -> Path:
    """`write(tmp)` to a temp file beside `path`, then rename it over `path`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def read_table(path: Path, schema: pa.Schema) -> pd.DataFrame:
    """Read an artifact, checking it was written with `schema`; a file of an earlier version that
    lacks only `schemas.LATER_COLUMNS` reads with those columns null."""
    table = pq.read_table(path)
    missing = [f for f in schema if f.name not in table.column_names]
    if missing and all(f.name in LATER_COLUMNS and f.nullable for f in missing):
        have = set(table.column_names)
        fields = [table.schema.field(f.name) if f.name in have else f for f in schema]
        columns = [table.column(f.name) if f.name in have else pa.nulls(len(table), f.type) for f in schema]
        table = pa.Table.from_arrays(columns, schema=pa.schema(fields))
    if not table.schema.equals(schema, check_metadata=False):
        raise ValueError(f"{path}: schema mismatch\n{table.schema}\n!=\n{schema}")
    return table.to_pandas()
