"""Small graphs for exactness tests: sizes chosen so that 3 divides neither the vertex count nor the widths."""
from __future__ import annotations

import numpy as np

from ntp.engine.data import GraphData, from_arrays


def random_graph(n: int = 100, d: int = 17, classes: int = 5, avg_degree: int = 5, directed: bool = True,
                 seed: int = 0) -> dict:
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
    splits = {"train": np.sort(perm[: n // 2]), "valid": np.sort(perm[n // 2 : 3 * n // 4]), "test": np.sort(perm[3 * n // 4 :])}
    return {"edge_index": np.stack([src, dst]), "x": x, "y": y, "splits": splits}


def loader(graph: dict):
    """A DataLoader for ntp.engine.loop.setup that serves ``graph`` without a store."""

    def load(cfg, world: int, rank: int) -> GraphData:
        return from_arrays(graph["edge_index"], graph["x"], graph["y"], graph["splits"], world=world, rank=rank)

    return load
