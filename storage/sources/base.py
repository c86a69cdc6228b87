"""What a source hands to the store builder."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import numpy as np

from storage.schema import StoreError

EdgeBlock = tuple[np.ndarray, np.ndarray, "np.ndarray | None"]


@dataclass
class GraphSource:
    """A graph to be written into a store, read lazily in blocks.

    edge_blocks() yields (src, dst, weight | None) blocks of raw edges u -> v;
    feature_blocks() yields consecutive float row blocks covering all num_nodes rows;
    labels() returns class ids [n], int or float (-1 or NaN = unlabeled; checked by storage.labels),
    or float32 [n, num_tasks] (NaN = unlabeled);
    splits() returns {"train"|"valid"|"test": vertex ids}.
    Link prediction (task_type "link"): link_splits() returns {split: (positive pairs [E, 2], negatives or None)}
    (storage.sources.link_arrays); labels() and splits() are not called, and edge_blocks() yields the
    message-passing graph (the training edges only).
    """

    name: str
    num_nodes: int
    feature_dim: int
    edge_blocks: Callable[[], Iterator[EdgeBlock]]
    feature_blocks: Callable[[], Iterator[np.ndarray]]
    labels: Callable[[], np.ndarray]
    splits: Callable[[], dict[str, np.ndarray]]
    task_type: str = "multiclass"
    metric: str = "acc"
    num_classes: int = 0  # 0: inferred from the labels (max + 1)
    num_tasks: int = 1
    ogb_name: str | None = None
    weighted: bool = False
    expected_edges: int | None = None  # raw edge count the source promises (verified)
    info: dict[str, Any] = field(default_factory=dict)  # recorded as meta.source
    link_splits: Callable[[], dict[str, tuple[np.ndarray, "np.ndarray | None"]]] | None = None
    hetero: "HeteroParts | None" = None  #: node types and relations of a heterogeneous graph (storage.hetero_arrays)


@dataclass
class Relation:
    """One relation ``src --name--> dst`` of a heterogeneous graph: its edges in the types' local ids."""

    src: str
    name: str
    dst: str
    src_ids: np.ndarray
    dst_ids: np.ndarray
    reverse_of: str | None = None  #: the relation this one reverses (``--add-reverse``)

    @property
    def key(self) -> str:
        """OGB's folder name ``src___name___dst``."""
        return f"{self.src}___{self.name}___{self.dst}"


@dataclass
class HeteroParts:
    """What a heterogeneous source adds: node types (global ids are the types' ranges, in this order), the labeled
    target type, the relations, and per-type features (a type without ``feature_blocks`` is featureless)."""

    node_types: list[str]
    counts: dict[str, int]
    target: str
    relations: list[Relation]
    feature_dims: dict[str, int]
    feature_blocks: dict[str, Callable[[], Iterator[np.ndarray]]]


def all_edges(source: GraphSource) -> tuple[np.ndarray, np.ndarray]:
    """Every edge of ``source`` in memory (16 bytes an edge): (src, dst), ids checked against the node count."""
    srcs, dsts = [], []
    for src, dst, _ in source.edge_blocks():
        srcs.append(np.asarray(src, np.int64))
        dsts.append(np.asarray(dst, np.int64))
    src = np.concatenate(srcs) if srcs else np.zeros(0, np.int64)
    dst = np.concatenate(dsts) if dsts else np.zeros(0, np.int64)
    n = source.num_nodes
    bad = (src < 0) | (src >= n) | (dst < 0) | (dst >= n)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise StoreError(
            f"{source.name}: edge {i} ({src[i]}, {dst[i]}) refers to a node outside [0, {n}). "
            "Fix: node ids must be below the node count (or pass --nodes)"
        )
    return src, dst
