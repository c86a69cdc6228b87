"""The engine's only door to a graph store: load what one rank needs, nothing more."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from functools import partial
from typing import Callable

import numpy as np

from ntp.engine.distributed.partition import Partition
from ntp.engine.graph import topology as T

#: builds a topology's arrays with the allocator it is given (ntp.engine.graph.node_shared.on_node shares them on a node)
Share = Callable[[T.Builder], dict[str, np.ndarray]]


@dataclass
class GraphData:
    """One rank's view of a graph: the whole topology, its own feature rows, all labels and splits."""

    topology: T.Topology  # in-edges and their transpose, 32-bit indices (ntp.engine.graph.topology)
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
    def indptr(self) -> np.ndarray:
        """int64 [n+1]: row pointers of the in-edge CSR."""
        return self.topology.indptr.numpy()

    @property
    def indices(self) -> np.ndarray:
        """[E]: the source vertex of each in-edge (32-bit where the vertex count allows)."""
        return self.topology.indices.numpy()

    @property
    def num_nodes(self) -> int:
        return self.topology.num_nodes

    @property
    def num_edges(self) -> int:
        return self.topology.num_edges

    @property
    def out_dim(self) -> int:
        """Width of the model output: classes for multiclass, tasks otherwise."""
        return self.num_classes if self.task_type == "multiclass" else self.labels.shape[1]


def load_rank_data(
    store, world: int, rank: int, share: Share = lambda build: build(T.empty), split: int = 0
) -> GraphData:
    """Read the whole topology (built through ``share``: once per node when shared) and this rank's feature rows
    from ``store`` (a path, or an open ``storage.GraphStore``); the node splits of split set ``split``."""
    from storage import open_store

    store = open_store(store) if isinstance(store, (str, os.PathLike)) else store
    meta = store.meta
    start, stop = Partition(meta.num_nodes, world, rank).rows()
    return GraphData(
        topology=T.Topology.from_arrays(share(lambda alloc: store_topology(store, alloc))),
        features=store.features(rows=slice(start, stop)),
        labels=store.labels(),
        splits={name: store.split(name, split) for name in ("train", "valid", "test")},
        feature_dim=meta.feature_dim,
        num_classes=meta.num_classes,
        task_type=meta.task_type,
        metric=meta.metric,
        name=meta.name,
        ogb_name=meta.ogb_name,
        fingerprint=meta.fingerprint,
        meta=meta.to_dict(),
    )


def store_topology(store, alloc: T.Allocator = T.empty) -> dict[str, np.ndarray]:
    """A store's topology arrays, its CSR read chunk by chunk straight into ``alloc``'s arrays."""
    from storage import schema as S

    def fill(indptr: np.ndarray, indices: np.ndarray) -> None:
        store.read_into(S.INDPTR, indptr)
        store.read_into(S.INDICES, indices)

    def fill_transpose(t_indptr: np.ndarray, t_indices: np.ndarray) -> None:
        t_indptr[0] = 0
        np.cumsum(store.out_degrees(), out=t_indptr[1:])
        store.read_into(S.T_INDICES, t_indices)

    meta = store.meta
    symmetric = True if meta.preprocessing.get("symmetrized") else None
    stored = fill_transpose if S.T_INDICES in meta.checksums else None  # older stores: sorted here
    return T.build(meta.num_nodes, meta.num_edges, fill, alloc, symmetric=symmetric, fill_transpose=stored)


def topology_bytes(num_nodes: int, num_edges: int) -> int:
    """An upper bound of a topology's arrays (both directions, self-loop counts)."""
    return 2 * (num_nodes + 1) * 8 + 2 * num_edges * T.index_dtype(num_nodes).itemsize + num_nodes * 4


def from_arrays(
    edge_index: np.ndarray,
    x: np.ndarray,
    y: np.ndarray,
    splits: dict[str, np.ndarray],
    world: int = 1,
    rank: int = 0,
    **kw,
) -> GraphData:
    """A GraphData from in-memory arrays (edge_index [2, E] as source, target), for tests and tools."""
    n = x.shape[0]
    src, dst = np.asarray(edge_index[0], np.int64), np.asarray(edge_index[1], np.int64)
    order = np.argsort(dst, kind="stable")
    indptr = np.zeros(n + 1, np.int64)
    np.cumsum(np.bincount(dst, minlength=n), out=indptr[1:])
    topology = T.from_csr(indptr, src[order])
    start, stop = Partition(n, world, rank).rows()
    if y.ndim == 1:  # class ids: multi-class accuracy
        task = dict(num_classes=int(y.max()) + 1, task_type="multiclass", metric="acc")
    else:  # 0/1 per task (NaN: unlabeled): ROC-AUC
        task = dict(num_classes=y.shape[1], task_type="binary" if y.shape[1] == 1 else "multilabel", metric="rocauc")
    return GraphData(
        topology=topology,
        features=np.ascontiguousarray(x[start:stop], np.float32),
        labels=y,
        splits=splits,
        feature_dim=x.shape[1],
        **{**task, **kw},
    )


def load_shared(store, env, split: int = 0) -> GraphData:  # noqa: ANN001 (storage.Store, ntp...dist.DistEnv)
    """This rank's data from an opened store; the topology is built once per machine and shared by its ranks
    (ntp.engine.graph.node_shared)."""
    from ntp.engine.graph.node_shared import job_key, on_node

    meta = store.meta
    share = partial(
        on_node,
        local_rank=env.local_rank,
        local_world=env.local_world,
        key=job_key(meta.fingerprint),
        required_bytes=topology_bytes(meta.num_nodes, meta.num_edges),
    )
    return load_rank_data(store, env.world, env.rank, share, split)
