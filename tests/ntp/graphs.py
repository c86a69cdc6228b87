"""Small graphs for exactness tests: sizes chosen so that 3 divides neither the vertex count nor the widths."""

from __future__ import annotations

import numpy as np

from ntp.engine.graph.data import GraphData, from_arrays


def random_graph(
    n: int = 100, d: int = 17, classes: int = 5, avg_degree: int = 5, directed: bool = True, seed: int = 0
) -> dict:
    """A random graph with isolated vertices, a few self-loops and a duplicate edge; labels correlate with x."""
    rng = np.random.default_rng(seed)
    e = n * avg_degree
    src, dst = rng.integers(0, n - 3, e), rng.integers(0, n - 3, e)  # the last 3 vertices are isolated
    src, dst = np.append(src, [0, 1, src[0]]), np.append(dst, [0, 1, dst[0]])  # self-loops, a duplicate
    if not directed:
        src, dst = np.concatenate([src, dst]), np.concatenate([dst, src])
    y = rng.integers(0, classes, n)
    x = rng.normal(size=(n, d)).astype(np.float32)
    x[:, :classes] += 2.0 * np.eye(classes, dtype=np.float32)[y]
    perm = rng.permutation(n)
    splits = {
        "train": np.sort(perm[: n // 2]),
        "valid": np.sort(perm[n // 2 : 3 * n // 4]),
        "test": np.sort(perm[3 * n // 4 :]),
    }
    return {"edge_index": np.stack([src, dst]), "x": x, "y": y, "splits": splits}


def loader(graph: dict):
    """A DataLoader for ntp.engine.train.loop.setup that serves ``graph`` without a store."""

    def load(cfg, world: int, rank: int) -> GraphData:
        return from_arrays(graph["edge_index"], graph["x"], graph["y"], graph["splits"], world=world, rank=rank)

    return load


def budget_leaving(
    chunk_bytes: int, cfg, *, num_nodes: int, num_edges: int, feature_dim: int, out_dim: int, world: int
) -> str:
    """A ``--memory-budget`` that leaves ``chunk_bytes`` to the aggregation chunks of a CPU rank once what stays
    resident there (topology, embeddings, NN stage: ntp.engine.memory.placement) is counted, as the ranks count it."""
    from ntp.engine.memory.parts import rank_resident_parts
    from ntp.engine.nn.models import build_model

    params = sum(p.numel() for p in build_model(cfg, feature_dim, out_dim).parameters())
    resident = rank_resident_parts(
        cfg,
        num_nodes=num_nodes,
        num_edges=num_edges,
        feature_dim=feature_dim,
        out_dim=out_dim,
        world=world,
        params=params,
        nn_on_device=True,
        device_type="cpu",
    )
    return f"{sum(resident.values()) + chunk_bytes}B"


def graph_budget(chunk_bytes: int, cfg, graph: dict, world: int) -> str:
    """:func:`budget_leaving` for one of the graphs above."""
    n, d = graph["x"].shape
    return budget_leaving(
        chunk_bytes,
        cfg,
        num_nodes=n,
        num_edges=graph["edge_index"].shape[1],
        feature_dim=d,
        out_dim=int(graph["y"].max()) + 1,
        world=world,
    )


def store_budget(path: str, chunk_bytes: int = 300_000, world: int = 2, **cfg) -> str:
    """A --memory-budget that leaves ``chunk_bytes`` to the chunks of a run on the store at ``path``
    (:func:`budget_leaving`; ``cfg``: TrainConfig fields)."""
    from ntp.config import TrainConfig
    from storage import open_store

    m = open_store(path).meta
    return budget_leaving(
        chunk_bytes,
        TrainConfig(**cfg),
        num_nodes=m.num_nodes,
        num_edges=m.num_edges,
        feature_dim=m.feature_dim,
        out_dim=m.num_classes,
        world=world,
    )
