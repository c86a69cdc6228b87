"""Read an unzipped OGB folder in OGB's binary layout (ogbn-papers100M), streamed.

Files (as ogb's read_binary_graph_raw and NodePropPredDataset read them):
- raw/data.npz: edge_index int [2, E], num_nodes_list [1], num_edges_list [1],
  node_feat [n, F] (float16 for papers100M), other node_* / edge_* arrays (ignored);
- raw/node-label.npz: node_label float [n, 1] (or [n, T]), NaN = unlabeled;
- split/<name>/{train,valid,test}.csv.gz.

Arrays are never loaded whole: edges and feature rows come in blocks read from the .npy
members inside the zip (storage.sources.npz), so memory stays bounded whatever the size.
Counts come from the files themselves (num_*_list and array shapes), checked against each other.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import numpy as np

from storage.sources.base import EdgeBlock, GraphSource
from storage.sources.npz import NpzFile
from storage.sources.ogb_folder import checked_split_folder, folder_problem, ogb_source, task_of
from storage.sources.ogb_meta import OgbInfo

DATA = "raw/data.npz"
LABELS = "raw/node-label.npz"
# Edge blocks are larger than feature blocks: the CSR builder's counting pass costs O(num_nodes)
# per block, so 8M edges (128 MB as int64 pairs) per block keeps papers100M at ~200 blocks.
EDGE_BLOCK_BYTES = 128 << 20


def is_binary_folder(root: Path) -> bool:
    """An OGB folder in the binary layout (raw/data.npz, no raw/edge.csv.gz)."""
    return (root / DATA).is_file() and not (root / "raw/edge.csv.gz").is_file()


def _single(npz: NpzFile, key: str, root: Path) -> int:
    values = npz.member(key).read_all().ravel()
    if len(values) != 1:
        raise folder_problem(
            root, f"{DATA}: {key} lists {len(values)} graphs; only single-graph datasets are supported"
        )
    return int(values[0])


def ogb_binary_source(root: Path, name: str, info: OgbInfo | None) -> GraphSource:
    """A GraphSource over a binary-layout OGB folder; metadata from `info` or inferred."""
    root = Path(root)
    for rel in (DATA, LABELS):
        if not (root / rel).is_file():
            raise folder_problem(root, f"{rel} is missing")
    data, label_npz = NpzFile(root / DATA), NpzFile(root / LABELS)
    n = _single(data, "num_nodes_list", root)
    e = _single(data, "num_edges_list", root)
    edge_index = data.member("edge_index")
    if edge_index.shape != (2, e):
        raise folder_problem(
            root,
            f"{DATA}: edge_index has shape {edge_index.shape} but num_edges_list says {e} edges (expected (2, {e}))",
        )
    if not np.issubdtype(edge_index.dtype, np.integer):
        raise folder_problem(root, f"{DATA}: edge_index has dtype {edge_index.dtype}, expected integers")
    if "node_feat" not in data:
        raise folder_problem(root, f"{DATA} has no node_feat array (found {sorted(data.keys())})")
    node_feat = data.member("node_feat")
    if len(node_feat.shape) != 2 or node_feat.shape[0] != n:
        raise folder_problem(root, f"{DATA}: node_feat has shape {node_feat.shape} but num_nodes_list says {n} nodes")
    dim = node_feat.shape[1]
    node_label = label_npz.member("node_label")
    if len(node_label.shape) not in (1, 2) or node_label.shape[0] != n:
        raise folder_problem(
            root, f"{LABELS}: node_label has shape {node_label.shape} but num_nodes_list says {n} nodes"
        )
    label_cols = 1 if len(node_label.shape) == 1 else node_label.shape[1]
    split_dir = checked_split_folder(root, info)
    task = task_of(info, label_cols)
    task_type = task[0]

    def edge_blocks() -> Iterator[EdgeBlock]:
        for block in edge_index.iter_blocks(axis=1, block_bytes=EDGE_BLOCK_BYTES):
            yield block[0], block[1], None

    def feature_blocks() -> Iterator[np.ndarray]:
        yield from node_feat.iter_blocks(axis=0)

    def labels() -> np.ndarray:
        if task_type == "multiclass":
            if label_cols != 1:
                raise folder_problem(
                    root,
                    f"{LABELS}: node_label has {label_cols} columns but {name} is a multiclass dataset (expected 1)",
                )
            out = np.empty(n, dtype=np.float64)  # storage.labels checks they are class ids
        else:
            out = np.empty((n, label_cols), dtype=np.float32)
        pos = 0
        for block in node_label.iter_blocks(axis=0):
            k = len(block)
            if task_type == "multiclass":
                out[pos : pos + k] = block[:, 0]
            else:
                out[pos : pos + k] = block
            pos += k
        return out

    return ogb_source(
        root,
        name,
        info,
        split_dir,
        task,
        num_nodes=n,
        num_edges=e,
        feature_dim=dim,
        edge_blocks=edge_blocks,
        feature_blocks=feature_blocks,
        labels=labels,
        features=f"node_feat ({DATA}, {node_feat.dtype})",
        format="binary",
    )
