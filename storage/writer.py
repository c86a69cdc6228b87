"""Write a GraphSource into a Zarr group (the arrays, then the metadata last)."""

from __future__ import annotations

import hashlib
from functools import partial
from pathlib import Path
from typing import Any, Callable, Iterable

import numpy as np
import zarr

from storage import schema as S
from storage.csr import CsrArrays, CsrBuilder, Preprocessing, transpose_indices
from storage.hetero_arrays import hetero_meta, write_hetero
from storage.labels import checked_labels
from storage.layout import Layout, create_array
from storage.schema import StoreError, StoreMeta
from storage.sources.base import GraphSource
from storage.sources.link_arrays import checked_link_splits


class SequentialWriter:
    """Append row blocks to an array in order, writing whole chunks and hashing the bytes."""

    def __init__(self, array: zarr.Array, convert: Callable[[np.ndarray], np.ndarray] | None = None):
        self.array = array
        self.convert = convert
        self.rows = array.chunks[0] * (8 if array.ndim == 1 else 1)
        self.pos = 0
        self.buf: list[np.ndarray] = []
        self.buffered = 0
        self.hash = hashlib.blake2b(digest_size=16)

    def append(self, block: np.ndarray) -> None:
        block = np.asarray(block)
        if self.convert is not None:
            block = self.convert(block)
        block = block.astype(self.array.dtype, copy=False)
        if block.shape[1:] != self.array.shape[1:]:
            raise StoreError(
                f"{self.array.name}: block of shape {block.shape} does not fit array shape {self.array.shape}"
            )
        self.buf.append(block)
        self.buffered += len(block)
        if self.buffered >= self.rows:
            self._flush(final=False)

    def _flush(self, final: bool) -> None:
        data = np.concatenate(self.buf) if len(self.buf) > 1 else self.buf[0]
        cut = len(data) if final else (len(data) // self.rows) * self.rows
        if self.pos + cut > self.array.shape[0]:
            raise StoreError(f"{self.array.name}: the source gave more than {self.array.shape[0]} rows")
        if cut:
            chunk = np.ascontiguousarray(data[:cut])
            self.array[self.pos : self.pos + cut] = chunk
            self.hash.update(chunk.tobytes())
            self.pos += cut
        rest = data[cut:]
        self.buf = [rest] if len(rest) else []
        self.buffered = len(rest)

    def close(self) -> str:
        """Write what is left, check the row count, return the content hash."""
        if self.buf:
            self._flush(final=True)
        if self.pos != self.array.shape[0]:
            raise StoreError(f"{self.array.name}: the source gave {self.pos} rows, expected {self.array.shape[0]}")
        return self.hash.hexdigest()


def write_array(group: zarr.Group, name: str, data: np.ndarray, chunks: tuple[int, ...]) -> str:
    """Create `name` and write all of `data`; return its content hash."""
    arr = create_array(group, name, data.shape, data.dtype.str, chunks)
    w = SequentialWriter(arr)
    step = max(arr.chunks[0] * 16, 1)
    for start in range(0, len(data), step):
        w.append(data[start : start + step])
    return w.close()


def to_bfloat16_bits(x: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bit patterns (uint16), rounding to nearest even."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = (bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)
    nan = np.isnan(x)
    out = rounded.astype(np.uint16)
    out[nan] = 0x7FC0
    return out


def storage_dtype(feature_dtype: str) -> str:
    """Zarr dtype holding features of the given logical dtype."""
    return {"float32": "float32", "float16": "float16", "bfloat16": "uint16"}[feature_dtype]


def write_store(
    source: GraphSource,
    tmp: Path,
    *,
    prep: Preprocessing,
    feature_dtype: str,
    layout: Layout,
    build_key: str,
    rebuild_command: str,
    progress: Callable[[str], None],
) -> StoreMeta:
    """Write every array of `source` under `tmp`, then the metadata (the completion marker)."""
    n = source.num_nodes
    index_dtype = S.index_dtype_for(n)
    group = zarr.open_group(str(tmp), mode="w")
    sums: dict[str, str] = {}

    progress(f"{source.name}: streaming edges (pass 1: count)")
    builder = CsrBuilder(n, index_dtype, tmp, source.weighted, prep, progress)
    _read_edges(source, builder, progress)
    csr = builder.finish()
    sums.update(_write_topology(group, csr, n, layout, progress, symmetric=prep.effective().symmetrize))
    del csr, builder

    progress(f"{source.name}: writing features ({n:,} x {source.feature_dim}, {feature_dtype})")
    sums[S.FEATURES] = _write_features(group, source, feature_dtype, layout)
    if source.hetero is not None:
        sums.update(
            write_hetero(
                group,
                source.hetero,
                layout,
                index_dtype,
                write_array,
                partial(_write_feature_array, feature_dtype=feature_dtype, layout=layout),
                progress,
            )
        )
    if source.task_type == "link":
        split_names, num_classes = _write_link_splits(group, source, layout, sums), 0
    else:
        split_names, num_classes = _write_node_targets(group, source, layout, sums)

    meta_fields: dict[str, Any] = dict(
        name=source.name,
        num_nodes=n,
        num_edges=int(group[S.INDICES].shape[0]),
        feature_dim=source.feature_dim,
        num_classes=num_classes,
        task_type=source.task_type,
        metric=source.metric,
        num_tasks=source.num_tasks,
        ogb_name=source.ogb_name,
        directed=not prep.effective().symmetrize,
        preprocessing=prep.to_dict(),
        source=source.info,
        feature_dtype=feature_dtype,
        has_edge_weights=source.weighted,
        split_names=tuple(split_names),
        index_dtype=index_dtype,
        rebuild_command=rebuild_command,
        layout=layout.to_dict(),
        checksums=sums,
        build_key=build_key,
        hetero=hetero_meta(source.hetero) if source.hetero is not None else {},
    )
    meta = StoreMeta(fingerprint=S.fingerprint(meta_fields), schema_version=S.SCHEMA_VERSION, **meta_fields)
    group.attrs.update(meta.to_dict())  # written last: a store without it never opens
    return meta


def _read_edges(source: GraphSource, builder: CsrBuilder, progress: Callable[[str], None]) -> None:
    """Every edge block of ``source`` into ``builder``, saying the count every 10 million; as many as it expects."""
    reported = 0
    for src, dst, w in source.edge_blocks():
        builder.add(src, dst, w)
        if not reported or builder.raw_edges - reported >= 10_000_000:
            progress(f"  {builder.raw_edges:,} edges read")
            reported = builder.raw_edges
    progress(f"  {builder.raw_edges:,} edges read in all")
    if source.expected_edges is not None and builder.raw_edges != source.expected_edges:
        raise StoreError(
            f"{source.name}: the edge file has {builder.raw_edges} edges but the "
            f"dataset says {source.expected_edges}; the download is incomplete or "
            "damaged: delete it and prepare again"
        )


def _write_node_targets(
    group: zarr.Group, source: GraphSource, layout: Layout, sums: dict[str, str]
) -> tuple[list[str], int]:
    """Labels and node splits of a node-property task; returns (split names, number of classes)."""
    n = source.num_nodes
    labels, num_classes = checked_labels(
        source.name, source.task_type, source.labels(), n, source.num_classes, source.num_tasks
    )
    sums[S.LABELS] = write_array(group, S.LABELS, labels, (layout.row_chunk,) + labels.shape[1:])
    del labels
    split_names = []
    for split_name, ids in source.splits().items():
        ids = np.unique(np.asarray(ids, dtype=np.int64))
        if ids.size and (ids[0] < 0 or ids[-1] >= n):
            raise StoreError(f"{source.name}: split {split_name!r} has vertex ids outside [0, {n})")
        sums[S.SPLIT_PREFIX + split_name] = write_array(group, S.SPLIT_PREFIX + split_name, ids, (layout.row_chunk,))
        split_names.append(split_name)
    return split_names, num_classes


def _write_link_splits(group: zarr.Group, source: GraphSource, layout: Layout, sums: dict[str, str]) -> list[str]:
    """Positive and negative edges of each link split (checked by storage.sources.link_arrays)."""
    if source.link_splits is None:
        raise StoreError(f"{source.name}: a link-prediction source must give its edge splits")
    splits = checked_link_splits(source.name, source.link_splits(), source.num_nodes, source.metric)
    for split_name, (pos, neg) in splits.items():
        for kind, arr in (("pos", pos), ("neg", neg)):
            if arr is not None:
                name = S.link_array(split_name, kind)
                sums[name] = write_array(group, name, arr, (layout.row_chunk, arr.shape[1]))
    return list(splits)


def _write_topology(
    group: zarr.Group, csr: CsrArrays, n: int, layout: Layout, progress: Callable[[str], None], symmetric: bool
) -> dict[str, str]:
    """The in-edge CSR, both degree arrays and, unless the graph was symmetrised, the column ids of ``A^T``'s CSR
    (its row pointers are the cumulative out-degrees): sorted once here, every training start-up reads them."""
    progress(f"writing topology ({len(csr.indices):,} edges)")
    sums = {
        S.INDPTR: write_array(group, S.INDPTR, csr.indptr, (layout.row_chunk,)),
        S.INDICES: write_array(group, S.INDICES, csr.indices, (layout.edge_chunk,)),
        S.IN_DEGREE: write_array(group, S.IN_DEGREE, np.diff(csr.indptr), (layout.row_chunk,)),
    }
    out_deg = np.zeros(n, dtype=np.int64)
    for start in range(0, len(csr.indices), 1 << 24):
        out_deg += np.bincount(csr.indices[start : start + (1 << 24)], minlength=n)
    sums[S.OUT_DEGREE] = write_array(group, S.OUT_DEGREE, out_deg, (layout.row_chunk,))
    if csr.weights is not None:
        sums[S.WEIGHTS] = write_array(group, S.WEIGHTS, csr.weights, (layout.edge_chunk,))
    if not symmetric:
        progress("writing the transpose (out-edge CSR)")
        sums[S.T_INDICES] = write_array(
            group, S.T_INDICES, transpose_indices(csr.indptr, csr.indices), (layout.edge_chunk,)
        )
    return sums


def _write_features(group: zarr.Group, source: GraphSource, feature_dtype: str, layout: Layout) -> str:
    return _write_feature_array(
        group,
        S.FEATURES,
        source.num_nodes,
        source.feature_dim,
        source.feature_blocks,
        feature_dtype=feature_dtype,
        layout=layout,
    )


def _write_feature_array(
    group: zarr.Group,
    name: str,
    rows: int,
    dim: int,
    blocks: Callable[[], Iterable[np.ndarray]],
    *,
    feature_dtype: str,
    layout: Layout,
) -> str:
    dtype = storage_dtype(feature_dtype)
    chunks = layout.feature_chunks(rows, dim, np.dtype(dtype).itemsize)
    arr = create_array(group, name, (rows, dim), dtype, chunks)
    convert = to_bfloat16_bits if feature_dtype == "bfloat16" else None
    w = SequentialWriter(arr, convert)
    for block in blocks():
        w.append(block)
    return w.close()
