"""One rank's view of a heterogeneous graph: every relation's CSR (whole), this rank's feature rows of every node
type with features, and the target type's labels and splits (local ids of that type)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np

from ntp.engine.distributed.partition import Partition


@dataclass
class RelationData:
    """``src --name--> dst``: the in-edge CSR over the destination type's rows, sources local to ``src``."""

    key: str
    src: str
    dst: str
    indptr: np.ndarray  # int64 [n_dst + 1]
    indices: np.ndarray  # [E_r]


@dataclass
class HeteroGraphData:
    counts: dict[str, int]  # node type -> nodes (in the store's order)
    relations: list[RelationData]
    features: dict[str, np.ndarray]  # type -> float32 [rows of this rank, d_type]; featureless types absent
    feature_dims: dict[str, int]
    target: str
    labels: np.ndarray  # int64 [n_target] (-1: unlabeled)
    splits: dict[str, np.ndarray]  # name -> sorted local ids of the target type
    num_classes: int
    metric: str = "acc"
    name: str = "graph"
    ogb_name: str | None = None
    fingerprint: str = ""
    meta: dict = field(default_factory=dict)
    task_type: str = "multiclass"
    hetero: bool = True  # ntp.engine.train.setup dispatches on it

    @property
    def num_nodes(self) -> int:
        return sum(self.counts.values())

    @property
    def num_edges(self) -> int:
        return sum(len(r.indices) for r in self.relations)

    @property
    def out_dim(self) -> int:
        return self.num_classes

    @property
    def feature_dim(self) -> int:  # the homogeneous field; per type: feature_dims
        return 0

    def signature(self) -> tuple:
        """What every rank must agree on before the first collective."""
        return (
            tuple(self.counts.items()),
            tuple((r.key, len(r.indices)) for r in self.relations),
            tuple(self.feature_dims.items()),
            self.target,
            self.num_classes,
        )


def load_hetero(store, world: int, rank: int) -> HeteroGraphData:
    """Read what one rank needs from a heterogeneous store (a path or an open ``storage.GraphStore``)."""
    from storage import open_store

    store = open_store(store) if isinstance(store, (str, os.PathLike)) else store
    meta, h = store.meta, store.meta.hetero
    types = {t["name"]: t for t in h["node_types"]}
    counts = {name: t["count"] for name, t in types.items()}
    relations = load_relations(store)
    features = {}
    for name, t in types.items():
        if t["feature_dim"]:
            r0, r1 = Partition(t["count"], world, rank).rows()
            features[name] = store.type_features(name, rows=slice(r0, r1))
    target = types[h["target"]]
    off = target["offset"]
    labels = np.asarray(store.labels()[off : off + target["count"]], np.int64)
    splits = {s: np.asarray(store.split(s), np.int64) - off for s in ("train", "valid", "test")}
    return HeteroGraphData(
        counts=counts,
        relations=relations,
        features=features,
        feature_dims={n: t["feature_dim"] for n, t in types.items()},
        target=h["target"],
        labels=labels,
        splits=splits,
        num_classes=meta.num_classes,
        metric=meta.metric,
        name=meta.name,
        ogb_name=meta.ogb_name,
        fingerprint=meta.fingerprint,
        meta=meta.to_dict(),
    )


def load_relations(store) -> list[RelationData]:
    """Every relation's CSR of an open heterogeneous store (the topology alone: what the memory plan reads)."""
    return [
        RelationData(r["key"], r["src"], r["dst"], *store.relation_csr(r["key"]))
        for r in store.meta.hetero["relations"]
    ]


def hetero_from_arrays(
    counts: dict[str, int],
    edges: dict[tuple[str, str, str], np.ndarray],
    features: dict[str, np.ndarray],
    target: str,
    labels: np.ndarray,
    splits: dict[str, np.ndarray],
    world: int = 1,
    rank: int = 0,
    num_classes: int | None = None,
) -> HeteroGraphData:
    """In-memory data (tests, tools): ``edges[(src, rel, dst)]`` [2, E] local ids; whole feature matrices."""
    from storage.hetero_arrays import relation_csr

    relations = []
    for (s, r, d), e in edges.items():
        indptr, indices = relation_csr(np.asarray(e[0], np.int64), np.asarray(e[1], np.int64), counts[d])
        relations.append(RelationData(f"{s}___{r}___{d}", s, d, indptr, indices))
    own = {t: x[slice(*Partition(counts[t], world, rank).rows())] for t, x in features.items()}
    return HeteroGraphData(
        counts=dict(counts),
        relations=relations,
        features=own,
        feature_dims={t: (features[t].shape[1] if t in features else 0) for t in counts},
        target=target,
        labels=np.asarray(labels, np.int64),
        splits={k: np.sort(np.asarray(v, np.int64)) for k, v in splits.items()},
        num_classes=int(num_classes if num_classes is not None else labels.max() + 1),
    )
