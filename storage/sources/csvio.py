"""Streaming readers for (gzipped) headerless numeric CSV files, built on pyarrow."""

from __future__ import annotations

import gzip
from pathlib import Path
from typing import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv

from storage.sources.fileerrors import guarded, reading

BLOCK_BYTES = 16 << 20


def _compression(path: Path) -> str | None:
    return "gzip" if path.name.endswith(".gz") else None


def count_columns(path: Path) -> int:
    """Number of comma-separated fields on the first line (0 for an empty file)."""
    opener = gzip.open if _compression(path) else open
    with reading(path), opener(path, "rb") as f:
        first = f.readline()
    return len(first.decode().strip().split(",")) if first.strip() else 0


def iter_numeric_blocks(
    path: Path, num_cols: int, dtype: str, header: bool = False, names: list[str] | None = None
) -> Iterator[np.ndarray]:
    """Yield [rows, num_cols] arrays of `dtype`, one per pyarrow block (bounded memory).

    A truncated, damaged or unreadable file raises StoreError naming it.
    """
    return guarded(path, _numeric_blocks(path, num_cols, dtype, header, names))


def _numeric_blocks(
    path: Path, num_cols: int, dtype: str, header: bool, names: list[str] | None
) -> Iterator[np.ndarray]:
    if num_cols == 0:
        return
    names = names or [f"c{i}" for i in range(num_cols)]
    pa_type = pa.from_numpy_dtype(np.dtype(dtype))
    stream = pa.input_stream(str(path), compression=_compression(path))
    read = pacsv.ReadOptions(column_names=None if header else names, block_size=BLOCK_BYTES)
    conv = pacsv.ConvertOptions(column_types={n: pa_type for n in names})
    with pacsv.open_csv(stream, read_options=read, convert_options=conv) as reader:
        for batch in reader:
            if batch.num_rows:
                cols = [batch.column(i).to_numpy(zero_copy_only=False) for i in range(batch.num_columns)]
                yield np.stack(cols, axis=1) if len(cols) > 1 else cols[0][:, None]


def read_numeric(path: Path, dtype: str) -> np.ndarray:
    """A whole (small) numeric CSV as [rows, cols]."""
    cols = count_columns(path)
    blocks = list(iter_numeric_blocks(path, cols, dtype))
    return np.concatenate(blocks) if blocks else np.zeros((0, cols), dtype=dtype)
