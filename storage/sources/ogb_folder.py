"""What the two OGB folder layouts (CSV files, or ogbn-papers100M's binary .npz files) share: the split folder,
feature rows, task metadata, provenance, and the error that names the folder."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import numpy as np

from storage.schema import StoreError
from storage.sources.base import GraphSource
from storage.sources.csvio import iter_numeric_blocks, read_numeric
from storage.sources.ogb_meta import OgbInfo


def folder_problem(root: Path, problem: str) -> StoreError:
    return StoreError(
        f"OGB folder {root}: {problem}. Fix: point --from-dir at an unzipped OGB "
        "dataset folder (it holds raw/ and split/), or download it again"
    )


def split_folder(root: Path, info: OgbInfo | None) -> Path:
    """split/<name>: the name from OGB's metadata, else the folder's only subfolder."""
    base = root / "split"
    if info is not None:
        found = base / info.split
        if not found.is_dir():
            raise folder_problem(root, f"split folder split/{info.split} is missing")
        return found
    subs = sorted(p for p in base.iterdir() if p.is_dir()) if base.is_dir() else []
    if len(subs) != 1:
        raise folder_problem(root, f"expected exactly one folder under split/, found {[p.name for p in subs]}")
    return subs[0]


SPLIT_PARTS = ("train", "valid", "test")


def checked_split_folder(root: Path, info: OgbInfo | None) -> Path:
    """The split folder, with its three index files present."""
    split_dir = split_folder(root, info)
    for part in SPLIT_PARTS:
        if not (split_dir / f"{part}.csv.gz").is_file():
            raise folder_problem(root, f"{(split_dir / f'{part}.csv.gz').relative_to(root)} is missing")
    return split_dir


def read_splits(split_dir: Path) -> dict[str, np.ndarray]:
    return {part: read_numeric(split_dir / f"{part}.csv.gz", "int64").ravel() for part in SPLIT_PARTS}


def task_of(info: OgbInfo | None, label_cols: int) -> tuple[str, str, int, int]:
    """(task type, metric, classes, tasks): OGB's metadata, else inferred from the label columns."""
    if info is not None:
        return info.task_type, info.metric, info.num_classes, info.num_tasks
    if label_cols == 1:
        return "multiclass", "acc", 0, 1
    return "multilabel", "rocauc", 2, label_cols


def ogb_source(
    root: Path,
    name: str,
    info: OgbInfo | None,
    split_dir: Path,
    task: tuple[str, str, int, int],
    *,
    num_nodes: int,
    num_edges: int,
    feature_dim: int,
    edge_blocks,
    feature_blocks,
    labels,
    **notes: str,
) -> GraphSource:
    """The GraphSource of an OGB-layout folder (CSV or binary), with its provenance."""
    task_type, metric, num_classes, num_tasks = task
    return GraphSource(
        name=name,
        num_nodes=num_nodes,
        feature_dim=feature_dim,
        edge_blocks=edge_blocks,
        feature_blocks=feature_blocks,
        labels=labels,
        splits=lambda: read_splits(split_dir),
        task_type=task_type,
        metric=metric,
        num_classes=num_classes,
        num_tasks=num_tasks,
        ogb_name=info.name if info is not None else None,
        expected_edges=num_edges,
        info={
            "kind": "ogb" if info else "ogb-layout",
            "dataset": name,
            "path": str(root),
            "release": info.version if info else None,
            "split": split_dir.name,
            **notes,
        },
    )


def feature_rows(root: Path, dim: int, n: int) -> Iterator[np.ndarray]:
    """raw/node-feat.csv.gz in row blocks, checked to hold one row per vertex."""
    rows = 0
    for block in iter_numeric_blocks(root / "raw/node-feat.csv.gz", dim, "float32"):
        rows += len(block)
        yield block
    if rows != n:
        raise folder_problem(root, f"node-feat.csv.gz has {rows} rows but num-node-list says {n}")
