"""Read an unzipped OGB node-property folder (raw/*.csv.gz, split/<name>/*.csv.gz).

Folders in OGB's binary layout (raw/data.npz, e.g. ogbn-papers100M) go to storage.sources.ogb_binary.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import numpy as np

from storage.schema import StoreError
from storage.sources.base import EdgeBlock, GraphSource
from storage.sources.csvio import count_columns, iter_numeric_blocks, read_numeric
from storage.sources.ogb_meta import OgbInfo

REQUIRED = ("raw/edge.csv.gz", "raw/num-node-list.csv.gz", "raw/num-edge-list.csv.gz",
            "raw/node-label.csv.gz")


def _fail(root: Path, problem: str) -> StoreError:
    return StoreError(f"OGB folder {root}: {problem}. Fix: point --from-dir at an unzipped OGB "
                      "dataset folder (it holds raw/ and split/), or download it again")


def split_folder(root: Path, info: OgbInfo | None) -> Path:
    """split/<name>: the name from OGB's metadata, else the folder's only subfolder."""
    base = root / "split"
    if info is not None:
        found = base / info.split
        if not found.is_dir():
            raise _fail(root, f"split folder split/{info.split} is missing")
        return found
    subs = sorted(p for p in base.iterdir() if p.is_dir()) if base.is_dir() else []
    if len(subs) != 1:
        raise _fail(root, f"expected exactly one folder under split/, found {[p.name for p in subs]}")
    return subs[0]


def identity_files(root: Path) -> dict[str, int]:
    """Relative path -> size of every file under raw/ and split/ (the source's identity)."""
    return {str(p.relative_to(root)): p.stat().st_size
            for sub in ("raw", "split") if (root / sub).is_dir()
            for p in sorted((root / sub).rglob("*")) if p.is_file()}


def _single_count(root: Path, rel: str) -> int:
    values = read_numeric(root / rel, "int64").ravel()
    if len(values) != 1:
        raise _fail(root, f"{rel} lists {len(values)} graphs; only single-graph datasets are supported")
    return int(values[0])


SPLIT_PARTS = ("train", "valid", "test")


def checked_split_folder(root: Path, info: OgbInfo | None) -> Path:
    """The split folder, with its three index files present."""
    split_dir = split_folder(root, info)
    for part in SPLIT_PARTS:
        if not (split_dir / f"{part}.csv.gz").is_file():
            raise _fail(root, f"{(split_dir / f'{part}.csv.gz').relative_to(root)} is missing")
    return split_dir


def read_splits(split_dir: Path) -> dict[str, np.ndarray]:
    return {part: read_numeric(split_dir / f"{part}.csv.gz", "int64").ravel() for part in SPLIT_PARTS}


def task_of(info: OgbInfo | None, label_cols: int) -> tuple[str, str, int, int]:
    """(task type, metric, classes, tasks): OGB's metadata, else inferred from the label columns."""
    if info is not None:
        return info.task_type, info.metric, info.num_classes, info.num_tasks
    if label_cols == 1:
        return "multiclass", "acc", 0, 1
    return "multilabel", "rocauc", 2, label_cols


def ogb_source(root: Path, name: str, info: OgbInfo | None, split_dir: Path, task: tuple[str, str, int, int], *,
               num_nodes: int, num_edges: int, feature_dim: int, edge_blocks, feature_blocks, labels,
               **notes: str) -> GraphSource:
    """The GraphSource of an OGB-layout folder (CSV or binary), with its provenance."""
    task_type, metric, num_classes, num_tasks = task
    return GraphSource(
        name=name, num_nodes=num_nodes, feature_dim=feature_dim, edge_blocks=edge_blocks,
        feature_blocks=feature_blocks, labels=labels, splits=lambda: read_splits(split_dir), task_type=task_type,
        metric=metric, num_classes=num_classes, num_tasks=num_tasks,
        ogb_name=info.name if info is not None else None,
        expected_edges=num_edges,
        info={"kind": "ogb" if info else "ogb-layout", "dataset": name, "path": str(root),
              "release": info.version if info else None, "split": split_dir.name, **notes},
    )


def ogb_layout_source(root: Path, name: str, info: OgbInfo | None) -> GraphSource:
    """A GraphSource over an OGB-layout folder; metadata from `info` or inferred."""
    root = Path(root)
    if info is not None and info.is_hetero:
        raise StoreError(f"{name} is a heterogeneous graph: not supported yet. "
                         "Fix: choose a homogeneous dataset such as ogbn-arxiv")
    from storage.sources.ogb_binary import is_binary_folder, ogb_binary_source  # imports this module

    if (info is not None and info.binary) or (info is None and is_binary_folder(root)):
        return ogb_binary_source(root, name, info)
    for rel in REQUIRED:
        if not (root / rel).is_file():
            raise _fail(root, f"{rel} is missing")
    n = _single_count(root, "raw/num-node-list.csv.gz")
    e = _single_count(root, "raw/num-edge-list.csv.gz")
    split_dir = checked_split_folder(root, info)
    feat_path = root / "raw/node-feat.csv.gz"
    edge_feat_path = root / "raw/edge-feat.csv.gz"
    if feat_path.is_file():
        dim = count_columns(feat_path)
        feature_note = "node-feat.csv.gz"
    elif edge_feat_path.is_file():
        dim = count_columns(edge_feat_path)
        feature_note = "mean of incident edge features (edge-feat.csv.gz)"
    else:
        raise _fail(root, "neither raw/node-feat.csv.gz nor raw/edge-feat.csv.gz exists")
    label_cols = count_columns(root / "raw/node-label.csv.gz")
    task = task_of(info, label_cols)

    def edge_blocks() -> Iterator[EdgeBlock]:
        for block in iter_numeric_blocks(root / "raw/edge.csv.gz", 2, "int64"):
            yield block[:, 0], block[:, 1], None

    def feature_blocks() -> Iterator[np.ndarray]:
        if feat_path.is_file():
            rows = 0
            for block in iter_numeric_blocks(feat_path, dim, "float32"):
                rows += len(block)
                yield block
            if rows != n:
                raise _fail(root, f"node-feat.csv.gz has {rows} rows but num-node-list says {n}")
        else:
            yield _mean_edge_features(root, n, dim)

    def labels() -> np.ndarray:
        raw = read_numeric(root / "raw/node-label.csv.gz", "float64")
        if len(raw) != n:
            raise _fail(root, f"node-label.csv.gz has {len(raw)} rows but num-node-list says {n}")
        if task[0] == "multiclass":
            return np.where(np.isnan(raw[:, 0]), -1, np.nan_to_num(raw[:, 0])).astype(np.int64)
        return raw.astype(np.float32)

    return ogb_source(root, name, info, split_dir, task, num_nodes=n, num_edges=e, feature_dim=dim,
                      edge_blocks=edge_blocks, feature_blocks=feature_blocks, labels=labels, features=feature_note)


def _mean_edge_features(root: Path, n: int, dim: int) -> np.ndarray:
    """Node features as the mean of the features of incident edges (both directions)."""
    sums = np.zeros((n, dim), dtype=np.float64)
    counts = np.zeros(n, dtype=np.int64)
    edges = iter_numeric_blocks(root / "raw/edge.csv.gz", 2, "int64")
    feats = iter_numeric_blocks(root / "raw/edge-feat.csv.gz", dim, "float32")
    pending = np.zeros((0, dim), dtype=np.float32)
    for block in edges:
        while len(pending) < len(block):
            nxt = next(feats, None)
            if nxt is None:
                raise _fail(root, "edge-feat.csv.gz has fewer rows than edge.csv.gz")
            pending = np.concatenate([pending, nxt])
        f, pending = pending[:len(block)], pending[len(block):]
        for ends in (block[:, 0], block[:, 1]):
            for j in range(dim):
                sums[:, j] += np.bincount(ends, weights=f[:, j], minlength=n)
            counts += np.bincount(ends, minlength=n)
    return (sums / np.maximum(counts, 1)[:, None]).astype(np.float32)
