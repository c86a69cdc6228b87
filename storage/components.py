"""``--largest-component``: keep only the largest connected component of a graph (its edges taken as undirected),
as Shchur et al. evaluate Amazon and Coauthor graphs and PyG's ``LargestConnectedComponents`` does.

The kept vertices are renumbered in their original order; edges, features, labels and the source's splits follow
them (split ids outside the component are dropped). Of two equally large components, the one holding the lowest
vertex id is kept. The edges are held in memory while the component is found (16 bytes an edge).
"""

from __future__ import annotations

import dataclasses
from typing import Iterator

import numpy as np

from storage.schema import StoreError
from storage.sources.base import EdgeBlock, GraphSource, all_edges


def largest_component(num_nodes: int, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """Boolean mask of the vertices of the largest weakly connected component."""
    import scipy.sparse as sp  # here: a store without --largest-component needs no SciPy
    from scipy.sparse.csgraph import connected_components

    if num_nodes == 0:
        return np.zeros(0, bool)
    graph = sp.coo_matrix((np.ones(len(src), np.int8), (src, dst)), shape=(num_nodes, num_nodes))
    _, component = connected_components(graph, directed=True, connection="weak")
    sizes = np.bincount(component)
    return component == component[np.flatnonzero(component == np.argmax(sizes))[0]]


def with_largest_component(source: GraphSource) -> GraphSource:
    """``source`` restricted to its largest connected component."""
    if source.hetero is not None or source.task_type == "link":
        kind = "heterogeneous" if source.hetero is not None else "a link-prediction dataset with its own edge splits"
        raise StoreError(
            f"--largest-component keeps part of a homogeneous graph; {source.name} is {kind}. "
            "Fix: drop --largest-component"
        )
    src, dst = all_edges(source)
    keep = largest_component(source.num_nodes, src, dst)
    kept_edges = int(keep[src].sum())  # promised to the builder, which checks it and sizes the build by it
    del src, dst  # the builder reads the edges again, block by block
    new_id = np.cumsum(keep) - 1

    def edge_blocks() -> Iterator[EdgeBlock]:
        for src, dst, weight in source.edge_blocks():
            src, dst = np.asarray(src, np.int64), np.asarray(dst, np.int64)
            inside = keep[src]  # an edge of a kept vertex is inside the component at both ends
            yield new_id[src[inside]], new_id[dst[inside]], None if weight is None else np.asarray(weight)[inside]

    def feature_blocks() -> Iterator[np.ndarray]:
        first = 0
        for block in source.feature_blocks():
            yield block[keep[first : first + len(block)]]
            first += len(block)

    def splits() -> dict[str, np.ndarray]:
        split = {name: np.asarray(ids, np.int64) for name, ids in source.splits().items()}
        return {name: new_id[ids[keep[ids]]] for name, ids in split.items()}

    info = {**source.info, "largest_component": {"nodes": int(keep.sum()), "of": source.num_nodes}}
    return dataclasses.replace(
        source,
        num_nodes=int(keep.sum()),
        edge_blocks=edge_blocks,
        feature_blocks=feature_blocks,
        labels=lambda: np.asarray(source.labels())[keep],
        splits=splits,
        expected_edges=kept_edges,
        info=info,
    )
