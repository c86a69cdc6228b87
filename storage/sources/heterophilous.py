"""Read a graph in the format of Platonov et al.'s heterophilous benchmarks (yandex-research/heterophilous-graphs:
roman-empire, amazon-ratings, tolokers, questions, minesweeper, and the filtered chameleon/squirrel): one .npz with
``node_features`` [n, F], ``node_labels`` [n], ``edges`` [E, 2] and boolean ``train_masks``/``val_masks``/
``test_masks`` [splits, n].

Every split set is kept: set 0 under the usual names, set k under ``train_k``/``valid_k``/``test_k``
(storage.schema.split_array); ``ntp train --split K`` picks one. Edges are listed once: the store symmetrises them
(the paper's models run on the undirected graph). A 2-class task is scored by ROC-AUC, as the paper reports it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import numpy as np

from storage.schema import StoreError, split_array
from storage.sources.base import EdgeBlock, GraphSource
from storage.sources.fileerrors import READ_ERRORS, unreadable

KEYS = ("node_features", "node_labels", "edges", "train_masks", "val_masks", "test_masks")
MASKS = {"train": "train_masks", "valid": "val_masks", "test": "test_masks"}


def _problem(path: Path, problem: str) -> StoreError:
    return StoreError(
        f"{path}: {problem}. Fix: --from-npz takes the heterophilous benchmarks' format "
        f"({', '.join(KEYS)}), as in yandex-research/heterophilous-graphs"
    )


def load_arrays(path: Path) -> dict[str, np.ndarray]:
    """The file's arrays, checked for the format's keys and shapes."""
    try:
        with np.load(path, allow_pickle=False) as f:
            missing = [k for k in KEYS if k not in f.files]
            if missing:
                raise _problem(path, f"arrays {missing} are missing (found {sorted(f.files)})")
            arrays = {k: f[k] for k in KEYS}
    except READ_ERRORS as e:
        raise unreadable(path, e) from None
    x, y, edges = arrays["node_features"], arrays["node_labels"], arrays["edges"]
    n = len(y)
    if x.ndim != 2 or len(x) != n:
        raise _problem(path, f"node_features has shape {x.shape}; expected [{n}, F] (one row per label)")
    if edges.ndim != 2 or edges.shape[1] != 2 or edges.dtype.kind not in "iu":
        raise _problem(path, f"edges is {edges.dtype} {edges.shape}; expected integer [E, 2]")
    shapes = {arrays[m].shape for m in MASKS.values()}
    if len(shapes) != 1 or len(next(iter(shapes))) != 2 or next(iter(shapes))[1] != n:
        raise _problem(path, f"the masks have shapes {sorted(shapes)}; expected boolean [splits, {n}] each")
    return arrays


def heterophilous_source(path: Path, name: str) -> GraphSource:
    """A GraphSource over one heterophilous-benchmark .npz."""
    path = Path(path)
    arrays = load_arrays(path)
    x, y, edges = arrays["node_features"], arrays["node_labels"], arrays["edges"]
    n, sets = len(y), arrays["train_masks"].shape[0]
    classes = int(y.max()) + 1 if n else 0

    def edge_blocks() -> Iterator[EdgeBlock]:
        yield edges[:, 0].astype(np.int64), edges[:, 1].astype(np.int64), None

    def splits() -> dict[str, np.ndarray]:
        return {
            split_array(split, k): np.flatnonzero(arrays[key][k]) for k in range(sets) for split, key in MASKS.items()
        }

    return GraphSource(
        name=name,
        num_nodes=n,
        feature_dim=x.shape[1],
        edge_blocks=edge_blocks,
        feature_blocks=lambda: iter([np.ascontiguousarray(x, np.float32)]),
        labels=lambda: y,
        splits=splits,
        metric="rocauc" if classes == 2 else "acc",
        num_classes=classes,
        expected_edges=len(edges),
        info={"format": "heterophilous npz", "file": path.name, "split_sets": sets},
    )
