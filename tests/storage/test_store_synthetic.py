"""The synthetic generator: deterministic, power-law, learnable."""

from __future__ import annotations

import numpy as np
from store_helpers import quiet

from storage import open_store, prepare
from storage.sources.synthetic import SyntheticSpec, synthetic_source


def arrays(store) -> dict[str, bytes]:
    return {
        "indptr": store.indptr().tobytes(),
        "indices": store.indices().tobytes(),
        "features": store.features().tobytes(),
        "labels": store.labels().tobytes(),
        **{s: store.split(s).tobytes() for s in store.meta.split_names},
    }


def test_same_seed_same_bytes(tmp_path):
    kw = dict(nodes=3000, avg_degree=8, features=16, classes=5, progress=quiet)
    a = open_store(prepare("synthetic", out=tmp_path / "a", **kw))
    b = open_store(prepare("synthetic", out=tmp_path / "b", **kw))
    c = open_store(prepare("synthetic", out=tmp_path / "c", seed=1, **kw))
    assert arrays(a) == arrays(b) and a.meta.fingerprint == b.meta.fingerprint
    assert a.meta.fingerprint != c.meta.fingerprint
    assert all(arrays(a)[k] != arrays(c)[k] for k in ("indices", "features", "labels"))


def test_graph_shape_and_signal():
    spec = SyntheticSpec(nodes=20_000, avg_degree=10, features=32, classes=6, seed=3)
    src_ = synthetic_source(spec)
    src, dst = map(np.concatenate, zip(*[(s, d) for s, d, _ in src_.edge_blocks()]))
    assert len(src) == spec.num_edges and src.max() < spec.nodes and dst.min() >= 0
    y = src_.labels()
    assert set(np.unique(y)) == set(range(6))
    assert (y[src] == y[dst]).mean() > 0.7  # homophily
    deg = np.bincount(dst, minlength=spec.nodes)
    assert deg.max() > 20 * deg.mean() and (deg == 0).sum() > 0  # heavy tail, some isolated
    x = np.concatenate(list(src_.feature_blocks()))
    assert x.shape == (spec.nodes, 32) and x.dtype == np.float32
    centroids = np.stack([x[y == k].mean(0) for k in range(6)])
    pred = np.argmin(((x[:, None, :] - centroids[None]) ** 2).sum(-1), axis=1)
    assert 0.3 < (pred == y).mean() < 0.95  # features carry signal but the graph still helps
    splits = src_.splits()
    ids = np.concatenate(list(splits.values()))
    assert len(ids) == spec.nodes and len(np.unique(ids)) == spec.nodes
    assert abs(len(splits["train"]) / spec.nodes - 0.6) < 0.02
