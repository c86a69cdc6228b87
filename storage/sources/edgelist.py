"""Bring your own graph: an edge list plus optional features, labels and splits.

- edges: Parquet or CSV with a header and columns `src`, `dst` and optionally `weight`.
- node_features: .npy [n, F] (memory-mapped) or Parquet (one numeric column per feature,
  row i = vertex i).
- labels: .npy (int [n] with -1 = unlabeled, or float [n, T] with NaN = unlabeled) or Parquet
  (one column `label`, or one column per task).
- splits: a folder with train/valid/test files, each `.npy` (int ids) or `.csv`/`.txt`
  (one vertex id per line, no header).
Missing features give a single all-ones column; missing labels give -1 everywhere; missing
splits give empty splits. The vertex count is `nodes`, else the features' or labels' row
count, else max vertex id + 1.
"""

from __future__ import annotations

import gzip
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from storage.schema import StoreError
from storage.sources.base import EdgeBlock, GraphSource
from storage.sources.fileerrors import guarded, reading

ROW_BLOCK = 1 << 16
SPLIT_PARTS = ("train", "valid", "test")


def _bad(path: Path | None, problem: str, fix: str) -> StoreError:
    return StoreError(f"{path}: {problem}. Fix: {fix}")


def _edge_batches(path: Path) -> Iterator[pa.RecordBatch]:
    return guarded(path, _raw_edge_batches(path))


def _raw_edge_batches(path: Path) -> Iterator[pa.RecordBatch]:
    if path.suffix == ".parquet":
        yield from pq.ParquetFile(path).iter_batches(batch_size=1 << 20)
        return
    read = pacsv.ReadOptions(block_size=16 << 20)
    conv = pacsv.ConvertOptions(column_types={"src": pa.int64(), "dst": pa.int64(), "weight": pa.float32()})
    stream = pa.input_stream(str(path), compression="gzip" if path.name.endswith(".gz") else None)
    with pacsv.open_csv(stream, read_options=read, convert_options=conv) as reader:
        yield from reader


def _edge_columns(path: Path) -> list[str]:
    with reading(path):
        if path.suffix == ".parquet":
            return pq.ParquetFile(path).schema_arrow.names
        with (gzip.open if path.name.endswith(".gz") else open)(path, "rb") as f:
            return [c.strip() for c in f.readline().decode().strip().split(",")]


def split_files(splits: Path) -> dict[str, Path]:
    """train/valid/test files found in a splits folder."""
    found = {}
    for part in SPLIT_PARTS:
        hits = [splits / f"{part}{ext}" for ext in (".npy", ".csv", ".txt") if (splits / f"{part}{ext}").is_file()]
        if len(hits) != 1:
            raise _bad(
                splits,
                f"expected one of {part}.npy / {part}.csv / {part}.txt, found {len(hits)}",
                "put one index file per split in the folder",
            )
        found[part] = hits[0]
    return found


def _read_ids(path: Path) -> np.ndarray:
    with reading(path):
        if path.suffix == ".npy":
            return np.load(path).astype(np.int64).ravel()
        text = path.read_text().split()
        return np.array([int(t) for t in text], dtype=np.int64)


def _features(path: Path | None) -> tuple[int | None, int, Callable[[], Iterator[np.ndarray]] | None]:
    """(rows or None, width, block iterator factory)."""
    if path is None:
        return None, 1, None
    if path.suffix == ".npy":
        with reading(path):
            arr = np.load(path, mmap_mode="r")
        if arr.ndim != 2:
            raise _bad(path, f"features must be 2-D [n, F], got shape {arr.shape}", "save a 2-D array")
        return (
            arr.shape[0],
            arr.shape[1],
            lambda: guarded(
                path, (np.asarray(arr[i : i + ROW_BLOCK], np.float32) for i in range(0, arr.shape[0], ROW_BLOCK))
            ),
        )
    if path.suffix == ".parquet":
        with reading(path):
            pf = pq.ParquetFile(path)

        def blocks() -> Iterator[np.ndarray]:
            for b in pf.iter_batches(batch_size=ROW_BLOCK):
                yield np.stack([c.to_numpy(zero_copy_only=False) for c in b.columns], axis=1).astype(np.float32)

        return pf.metadata.num_rows, len(pf.schema_arrow.names), lambda: guarded(path, blocks())
    raise _bad(path, "unsupported feature file type", "use .npy or .parquet")


def _labels(path: Path | None) -> np.ndarray | None:
    if path is None:
        return None
    if path.suffix not in (".npy", ".parquet"):
        raise _bad(path, "unsupported label file type", "use .npy or .parquet")
    with reading(path):
        if path.suffix == ".npy":
            y = np.load(path)
        else:
            cols = [c.to_numpy(zero_copy_only=False) for c in pq.read_table(path).columns]
            y = cols[0] if len(cols) == 1 else np.stack(cols, axis=1)
    if y.ndim == 1:
        return y  # class ids, checked (integers, range) by storage.labels
    if y.ndim == 2:
        return y.astype(np.float32)
    raise _bad(path, f"labels of shape {y.shape} and dtype {y.dtype}", "use int [n] or float [n, T]")


def edgelist_source(
    name: str,
    edges: Path,
    node_features: Path | None = None,
    labels: Path | None = None,
    splits: Path | None = None,
    nodes: int | None = None,
    classes: int | None = None,
) -> GraphSource:
    """A GraphSource over user files; see the module docstring for the formats."""
    cols = _edge_columns(edges)
    if "src" not in cols or "dst" not in cols:
        raise _bad(edges, f"edge list columns are {cols}", "name the columns src, dst (and weight)")
    weighted = "weight" in cols
    feat_rows, dim, feat_blocks = _features(node_features)
    y = _labels(labels)

    def edge_blocks() -> Iterator[EdgeBlock]:
        for b in _edge_batches(edges):
            src = b.column("src").to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
            dst = b.column("dst").to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
            w = b.column("weight").to_numpy(zero_copy_only=False) if weighted else None
            yield src, dst, w

    if nodes is not None and nodes < 1:
        raise _bad(edges, f"--nodes {nodes} is not a vertex count", "pass --nodes N with N >= 1, or leave it out")
    n = nodes or feat_rows or (len(y) if y is not None else None)
    if n is None:
        n = max((int(max(s.max(initial=-1), d.max(initial=-1))) for s, d, _ in edge_blocks()), default=-1) + 1
    for what, rows in (("node_features", feat_rows), ("labels", None if y is None else len(y))):
        if rows is not None and rows != n:
            raise _bad(
                edges,
                f"{what} has {rows} rows but the graph has {n} vertices",
                "give one row per vertex (and check --nodes)",
            )
    if y is None:
        y = np.full(n, -1, dtype=np.int64)
    multi = y.ndim == 2
    files = split_files(splits) if splits is not None else {}
    return GraphSource(
        name=name,
        num_nodes=n,
        feature_dim=dim,
        edge_blocks=edge_blocks,
        feature_blocks=feat_blocks
        or (lambda: (np.ones((min(ROW_BLOCK, n - i), 1), np.float32) for i in range(0, n, ROW_BLOCK))),
        labels=lambda: y,
        splits=lambda: (
            {p: _read_ids(f) for p, f in files.items()} if files else {p: np.zeros(0, np.int64) for p in SPLIT_PARTS}
        ),
        task_type="multilabel" if multi else "multiclass",
        metric="rocauc" if multi else "acc",
        num_classes=2 if multi else (classes or 0),
        num_tasks=y.shape[1] if multi else 1,
        weighted=weighted,
        info={
            "kind": "edgelist",
            "edges": str(edges),
            "node_features": str(node_features),
            "labels": str(labels),
            "splits": str(splits),
        },
    )
