"""Read an unzipped OGB node-property folder (raw/*.csv.gz, split/<name>/*.csv.gz).

Link-property folders (split/<name>/*.pt) go to storage.sources.ogb_link.
Folders in OGB's binary layout (raw/data.npz, e.g. ogbn-papers100M) go to storage.sources.ogb_binary.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import numpy as np

from storage.schema import StoreError
from storage.sources.base import EdgeBlock, GraphSource
from storage.sources.csvio import count_columns, iter_numeric_blocks, read_numeric
from storage.sources.ogb_binary import is_binary_folder, ogb_binary_source
from storage.sources.ogb_folder import checked_split_folder, feature_rows, folder_problem, ogb_source, task_of
from storage.sources.ogb_link import is_link_folder, ogb_link_source
from storage.sources.ogb_meta import OgbInfo

REQUIRED = ("raw/edge.csv.gz", "raw/num-node-list.csv.gz", "raw/num-edge-list.csv.gz", "raw/node-label.csv.gz")


def _single_count(root: Path, rel: str) -> int:
    values = read_numeric(root / rel, "int64").ravel()
    if len(values) != 1:
        raise folder_problem(root, f"{rel} lists {len(values)} graphs; only single-graph datasets are supported")
    return int(values[0])


def ogb_layout_source(root: Path, name: str, info: OgbInfo | None) -> GraphSource:
    """A GraphSource over an OGB-layout folder; metadata from `info` or inferred."""
    root = Path(root)
    if info is not None and info.is_hetero:
        raise StoreError(
            f"{name} is a heterogeneous graph: not supported yet. Fix: choose a homogeneous dataset such as ogbn-arxiv"
        )
    if (info is not None and info.task_type == "link") or (info is None and is_link_folder(root)):
        return ogb_link_source(root, name, info)
    if (info is not None and info.binary) or (info is None and is_binary_folder(root)):
        return ogb_binary_source(root, name, info)
    for rel in REQUIRED:
        if not (root / rel).is_file():
            raise folder_problem(root, f"{rel} is missing")
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
        raise folder_problem(root, "neither raw/node-feat.csv.gz nor raw/edge-feat.csv.gz exists")
    label_cols = count_columns(root / "raw/node-label.csv.gz")
    task = task_of(info, label_cols)

    def edge_blocks() -> Iterator[EdgeBlock]:
        for block in iter_numeric_blocks(root / "raw/edge.csv.gz", 2, "int64"):
            yield block[:, 0], block[:, 1], None

    def feature_blocks() -> Iterator[np.ndarray]:
        if feat_path.is_file():
            yield from feature_rows(root, dim, n)
        else:
            yield _mean_edge_features(root, n, dim)

    def labels() -> np.ndarray:
        raw = read_numeric(root / "raw/node-label.csv.gz", "float64")
        if len(raw) != n:
            raise folder_problem(root, f"node-label.csv.gz has {len(raw)} rows but num-node-list says {n}")
        if task[0] == "multiclass":
            return raw[:, 0]  # floats: storage.labels checks they are class ids
        return raw.astype(np.float32)

    return ogb_source(
        root,
        name,
        info,
        split_dir,
        task,
        num_nodes=n,
        num_edges=e,
        feature_dim=dim,
        edge_blocks=edge_blocks,
        feature_blocks=feature_blocks,
        labels=labels,
        features=feature_note,
    )


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
                raise folder_problem(root, "edge-feat.csv.gz has fewer rows than edge.csv.gz")
            pending = np.concatenate([pending, nxt])
        f, pending = pending[: len(block)], pending[len(block) :]
        for ends in (block[:, 0], block[:, 1]):
            for j in range(dim):
                sums[:, j] += np.bincount(ends, weights=f[:, j], minlength=n)
            counts += np.bincount(ends, minlength=n)
    return (sums / np.maximum(counts, 1)[:, None]).astype(np.float32)
