"""Link-prediction data of one rank: the node-side GraphData (whole topology, this rank's feature rows) and the
edge splits, which every rank holds whole (each rank scores every pair of a batch on its column slice)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np

from ntp.engine.graph.data import GraphData, from_arrays

#: split -> (positive pairs [E, 2], negatives [E_neg, 2] or [E, K] (MRR) or None)
LinkSplits = dict[str, tuple[np.ndarray, "np.ndarray | None"]]


@dataclass
class LinkGraphData(GraphData):
    """GraphData of a link-prediction graph with its edge splits (no labels, no node splits)."""

    link_splits: LinkSplits = field(default_factory=dict)

    @property
    def out_dim(self) -> int:
        return 0  # the encoder's width is the config's hidden width


def read_link_splits(store_path: str) -> LinkSplits:
    """The edge splits of a link-prediction store."""
    from storage import open_store

    store = open_store(store_path)
    return {name: store.link_split(name) for name in store.meta.split_names}


def with_link_splits(data: GraphData, splits: LinkSplits) -> LinkGraphData:
    """``data`` (as any loader builds it) with its edge splits."""
    values = {f.name: getattr(data, f.name) for f in dataclasses.fields(data) if f.init}
    return LinkGraphData(**values, link_splits=splits)


def link_from_arrays(
    edge_index: np.ndarray,
    num_nodes: int,
    splits: LinkSplits,
    x: np.ndarray | None = None,
    world: int = 1,
    rank: int = 0,
    metric: str = "hits@20",
    ogb_name: str | None = None,
) -> LinkGraphData:
    """In-memory link-prediction data (tests, tools): ``edge_index`` [2, E] is the message-passing graph;
    ``x`` None means no features (the model learns node embeddings)."""
    x = np.zeros((num_nodes, 0), np.float32) if x is None else x
    data = from_arrays(
        edge_index,
        x,
        np.zeros(num_nodes, np.int64),
        {},
        world=world,
        rank=rank,
        task_type="link",
        metric=metric,
        num_classes=0,
        ogb_name=ogb_name,
    )
    data.labels = np.zeros(0, np.int64)
    return with_link_splits(data, splits)
