"""The engine's only door to a graph store: load what one rank needs, nothing more."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ntp.engine.partition import Partition


@dataclass
class GraphData:
    """One rank's view of a graph: the whole topology, its own feature rows, all labels and splits."""

    indptr: np.ndarray  # int64 [n+1], CSR over in-edges
    indices: np.ndarray  # [E] source vertex of each in-edge
    features: np.ndarray  # float32 [rows of this rank, d]
    labels: np.ndarray  # int64 [n] (-1: unlabeled) or float32 [n, tasks] (NaN: unlabeled)
    splits: dict[str, np.ndarray]  # name -> sorted vertex ids
    feature_dim: int
    num_classes: int
    task_type: str = "multiclass"  # multiclass | binary | multilabel
    metric: str = "acc"  # acc | rocauc
    name: str = "graph"
    ogb_name: str | None = None
    fingerprint: str = ""
    meta: dict = field(default_factory=dict)

    @property
    def num_nodes(self) -> int:
        return len(self.indptr) - 1

    @property
    def num_edges(self) -> int:
        return int(self.indices.shape[0])

    @property
    def out_dim(self) -> int:
        """Width of the model output: classes for multiclass, tasks otherwise."""
        return self.num_classes if self.task_type == "multiclass" else self.labels.shape[1]


def load_rank_data(store_path: str, world: int, rank: int) -> GraphData:
    """Read the whole topology and this rank's feature rows from a store."""
    from storage import open_store

    store = open_store(store_path)
    meta = store.meta
    start, stop = Partition(meta.num_nodes, world, rank).rows()
    return GraphData(
        indptr=store.indptr(),
        indices=store.indices(),
        features=store.features(rows=slice(start, stop)),
        labels=store.labels(),
        splits={name: store.split(name) for name in ("train", "valid", "test")},
        feature_dim=meta.feature_dim,
        num_classes=meta.num_classes,
        task_type=meta.task_type,
        metric=meta.metric,
        name=meta.name,
        ogb_name=meta.ogb_name,
        fingerprint=meta.fingerprint,
        meta=meta.to_dict(),
    )


def from_arrays(edge_index: np.ndarray, x: np.ndarray, y: np.ndarray, splits: dict[str, np.ndarray],
                world: int = 1, rank: int = 0, **kw) -> GraphData:
    """A GraphData from in-memory arrays (edge_index [2, E] as source, target), for tests and tools."""
    n = x.shape[0]
    src, dst = np.asarray(edge_index[0], np.int64), np.asarray(edge_index[1], np.int64)
    order = np.argsort(dst, kind="stable")
    indptr = np.zeros(n + 1, np.int64)
    np.cumsum(np.bincount(dst, minlength=n), out=indptr[1:])
    start, stop = Partition(n, world, rank).rows()
    if y.ndim == 1:  # class ids: multi-class accuracy
        task = dict(num_classes=int(y.max()) + 1, task_type="multiclass", metric="acc")
    else:  # 0/1 per task (NaN: unlabeled): ROC-AUC
        task = dict(num_classes=y.shape[1], task_type="binary" if y.shape[1] == 1 else "multilabel", metric="rocauc")
    return GraphData(indptr=indptr, indices=src[order], features=np.ascontiguousarray(x[start:stop], np.float32),
                     labels=y, splits=splits, feature_dim=x.shape[1], **{**task, **kw})
