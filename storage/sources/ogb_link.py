"""Read an unzipped OGB link-property folder: raw/edge.csv.gz, raw/num-node-list.csv.gz, optional
raw/node-feat.csv.gz, raw/edge_weight.csv.gz, split/<name>/{train,valid,test}.pt (or .npz copies).

The message-passing graph is the training split's positive edges (OGB's raw edges are those same edges; validation
and test edges never enter it); their weights come from train.pt's "weight" when it has one. Edge years
(raw/edge_year.csv.gz, "year") are not used by any model here and are not stored.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import numpy as np

from storage.schema import StoreError
from storage.sources.base import EdgeBlock, GraphSource
from storage.sources.csvio import count_columns, read_numeric
from storage.sources.link_arrays import LINK_SPLITS, LinkSplit, load_split_file, split_pairs
from storage.sources.ogb_folder import feature_rows, folder_problem, split_folder
from storage.sources.ogb_meta import OgbInfo

REQUIRED = ("raw/edge.csv.gz", "raw/num-node-list.csv.gz")
BLOCK = 1 << 22


def split_file(split_dir: Path, part: str) -> Path | None:
    """split/<name>/<part>.pt, else its .npz copy, else None."""
    for suffix in (".pt", ".npz"):
        if (split_dir / f"{part}{suffix}").is_file():
            return split_dir / f"{part}{suffix}"
    return None


def is_link_folder(root: Path) -> bool:
    """An OGB folder whose split files are .pt/.npz edge splits (node-property splits are .csv.gz)."""
    base = Path(root) / "split"
    subs = [p for p in base.iterdir() if p.is_dir()] if base.is_dir() else []
    return len(subs) == 1 and split_file(subs[0], "train") is not None


def ogb_link_source(root: Path, name: str, info: OgbInfo | None) -> GraphSource:
    """A GraphSource of task "link" over an OGB link-property folder; the metric from OGB's master.csv
    (``info``), else Hits@20 ... unless the split files hold MRR-style negatives (then MRR)."""
    root = Path(root)
    if info is not None and info.task_type != "link":
        raise StoreError(
            f"{name} is an OGB {info.task_type} dataset, not link prediction: not supported yet. "
            "Fix: choose a homogeneous link-prediction dataset such as ogbl-ddi or ogbl-collab"
        )
    for rel in REQUIRED:
        if not (root / rel).is_file():
            raise folder_problem(root, f"{rel} is missing")
    counts = read_numeric(root / "raw/num-node-list.csv.gz", "int64").ravel()
    if len(counts) != 1:
        raise folder_problem(root, f"raw/num-node-list.csv.gz lists {len(counts)} graphs; only one is supported")
    n = int(counts[0])
    split_dir = split_folder(root, info)
    files = {part: split_file(split_dir, part) for part in LINK_SPLITS}
    for part, path in files.items():
        if path is None:
            raise folder_problem(root, f"{(split_dir / part).relative_to(root)}.pt (or .npz) is missing")
    loaded = {part: load_split_file(path) for part, path in files.items()}  # small: the edges of every split
    splits: dict[str, LinkSplit] = {part: split_pairs(d, str(files[part])) for part, d in loaded.items()}
    train_weight = loaded["train"].get("weight")
    metric = info.metric if info is not None else _inferred_metric(splits)
    feat_path = root / "raw/node-feat.csv.gz"
    dim = count_columns(feat_path) if feat_path.is_file() else 0
    train_pos = splits["train"][0]

    def edge_blocks() -> Iterator[EdgeBlock]:
        w = None if train_weight is None else np.asarray(train_weight, np.float32).ravel()
        for start in range(0, len(train_pos), BLOCK):
            block = np.asarray(train_pos[start : start + BLOCK], dtype=np.int64)
            yield block[:, 0], block[:, 1], None if w is None else w[start : start + BLOCK]

    def feature_blocks() -> Iterator[np.ndarray]:
        if not dim:
            yield np.zeros((n, 0), np.float32)
            return
        yield from feature_rows(root, dim, n)

    if train_weight is not None and len(np.ravel(train_weight)) != len(train_pos):
        raise StoreError(
            f"split file {files['train']}: {len(np.ravel(train_weight))} weights for {len(train_pos)} "
            "edges. Fix: one weight per training edge, or none"
        )
    return GraphSource(
        name=name,
        num_nodes=n,
        feature_dim=dim,
        edge_blocks=edge_blocks,
        feature_blocks=feature_blocks,
        labels=lambda: np.zeros(0),
        splits=dict,
        link_splits=lambda: splits,
        task_type="link",
        metric=metric,
        num_classes=0,
        num_tasks=1,
        ogb_name=info.name if info is not None else None,
        weighted=train_weight is not None,
        expected_edges=len(train_pos),
        info={
            "kind": "ogb" if info else "ogb-link-layout",
            "dataset": name,
            "path": str(root),
            "release": info.version if info else None,
            "split": split_dir.name,
            "graph": "positive edges of the train split",
            "features": "node-feat.csv.gz" if dim else "none (models learn node embeddings)",
            "split_files": {part: path.name for part, path in files.items()},
        },
    )


def _inferred_metric(splits: dict[str, LinkSplit]) -> str:
    """Without OGB's metadata: MRR when negatives are per-positive target lists, else Hits@20 (OGB's ddi)."""
    neg = splits["valid"][1]
    return "mrr" if neg is not None and neg.ndim == 2 and neg.shape[1] != 2 else "hits@20"
