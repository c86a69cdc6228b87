"""What a source hands to the store builder."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import numpy as np

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
