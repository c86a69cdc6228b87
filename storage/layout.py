"""Chunk layout of a store and the Zarr codecs used to write it.

Every array is stored uncompressed with a CRC32C checksum per chunk, so a damaged chunk is
detected on read and every chunk file has a known size (checked cheaply on open).

- Row-indexed arrays (indptr, degrees, labels) are chunked in blocks of `row_chunk` rows.
- `indices` / `edge_weights` are chunked in fixed blocks of `edge_chunk` edges; a row block
  [a, b) touches only the chunks covering indptr[a]..indptr[b] (at most two partially).
- `features` [n, F] is chunked (feature_row_chunk, feature_col_chunk) so that one row block
  (all columns) and one worker's column slice (all rows) both read whole, contiguous chunks.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import zarr
from zarr.codecs import BytesCodec, Crc32cCodec

CRC_BYTES = 4
_CONFIG = {"write_empty_chunks": True}


@dataclass(frozen=True)
class Layout:
    """Chunk sizes; none of them changes the store's content."""

    row_chunk: int = 1 << 16
    edge_chunk: int = 1 << 20
    feature_row_chunk: int = 0  # 0: chosen from the feature width
    feature_col_chunk: int = 32

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if value < 0 or (value == 0 and name != "feature_row_chunk"):
                raise ValueError(f"Layout.{name} must be positive, got {value}")

    def feature_chunks(self, num_nodes: int, feature_dim: int, itemsize: int) -> tuple[int, int]:
        """(rows, cols) of a feature chunk: about 1 MiB each unless set explicitly."""
        cols = max(1, min(self.feature_col_chunk, feature_dim))
        rows = self.feature_row_chunk or 2 ** round(math.log2(max(1, (1 << 20) // (cols * itemsize))))
        return max(1, min(rows, max(num_nodes, 1))), cols

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def create_array(
    group: zarr.Group, name: str, shape: tuple[int, ...], dtype: str, chunks: tuple[int, ...]
) -> zarr.Array:
    """An uncompressed, checksummed array that writes every chunk (even all-zero ones)."""
    chunks = tuple(max(1, min(c, s)) if s else max(1, c) for c, s in zip(chunks, shape))
    return group.create_array(
        name,
        shape=shape,
        dtype=dtype,
        chunks=chunks,
        serializer=BytesCodec(),
        compressors=[Crc32cCodec()],
        fill_value=0,
        config=_CONFIG,
    )


def expected_chunk_files(
    shape: tuple[int, ...], chunks: tuple[int, ...], itemsize: int
) -> tuple[list[tuple[int, ...]], int]:
    """Chunk grid coordinates and the byte size every chunk file must have."""
    grid = [math.ceil(s / c) for s, c in zip(shape, chunks)]
    coords = [tuple(int(i) for i in ix) for ix in np.ndindex(*grid)] if all(grid) else []
    return coords, int(np.prod(chunks)) * itemsize + CRC_BYTES
