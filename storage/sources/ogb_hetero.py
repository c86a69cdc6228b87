"""Read OGB's heterogeneous node-property layout (as ogbn-mag ships it):

    raw/num-node-dict.csv.gz            header: node types; one line of counts
    raw/triplet-type-list.csv.gz        one relation per line: src_type,relation,dst_type
    raw/relations/<src>___<rel>___<dst>/{edge,num-edge-list}.csv.gz   local ids src,dst; the edge count
    raw/node-feat/<type>/node-feat.csv.gz        (optional per type: a type without it is featureless)
    raw/node-label/<type>/node-label.csv.gz      (the labeled type; -1 = unlabeled)
    split/<name>/<type>/{train,valid,test}.csv.gz local ids of the labeled type

The store keeps every type's nodes in one global id space (types in the order of num-node-dict, each a contiguous
range, as PyG's ``HeteroData.to_homogeneous``): the union graph is the store's ordinary CSR, and each relation also
gets its own CSR over its destination type's local ids (storage.hetero_arrays). ``add_reverse`` adds, for every
relation (s, r, d), the relation (d, rev_r, s) with every edge reversed (PyG's ``ToUndirected`` names).
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import numpy as np

from storage.schema import StoreError
from storage.sources.base import EdgeBlock, GraphSource, HeteroParts, Relation
from storage.sources.csvio import count_columns, iter_numeric_blocks, read_numeric
from storage.sources.ogb_folder import SPLIT_PARTS, folder_problem
from storage.sources.ogb_meta import OgbInfo

SEP = "___"


def is_hetero_folder(root: Path) -> bool:
    return (Path(root) / "raw/num-node-dict.csv.gz").is_file()


def _problem(root: Path, rel: str, problem: str, fix: str) -> StoreError:
    return StoreError(f"OGB heterogeneous folder {root}: {rel}: {problem}. Fix: {fix}")


def _lines(path: Path) -> list[list[str]]:
    import gzip

    with gzip.open(path, "rt") as f:
        return [line.strip().split(",") for line in f if line.strip()]


def read_node_counts(root: Path) -> dict[str, int]:
    rel = "raw/num-node-dict.csv.gz"
    rows = _lines(root / rel)
    if len(rows) != 2 or len(rows[0]) != len(rows[1]):
        raise _problem(
            root,
            rel,
            "expected a header line of node types and one line of as many counts",
            "write it as OGB does, e.g. `author,paper` then `1134649,736389`",
        )
    try:
        counts = {t: int(c) for t, c in zip(rows[0], rows[1])}
    except ValueError:
        raise _problem(root, rel, f"counts {rows[1]} are not whole numbers", "one integer per node type") from None
    if any(c < 0 for c in counts.values()) or len(counts) != len(rows[0]):
        raise _problem(root, rel, "a count is negative or a type is listed twice", "one count >= 0 per type")
    return counts


def read_triplets(root: Path, counts: dict[str, int]) -> list[tuple[str, str, str]]:
    rel = "raw/triplet-type-list.csv.gz"
    if not (root / rel).is_file():
        raise _problem(root, rel, "is missing", "list one relation per line as src_type,relation,dst_type")
    triplets = [tuple(row) for row in _lines(root / rel)]
    for t in triplets:
        if len(t) != 3:
            raise _problem(root, rel, f"line {','.join(t)!r} is not src_type,relation,dst_type", "three fields a line")
        for node_type in (t[0], t[2]):
            if node_type not in counts:
                raise _problem(
                    root,
                    rel,
                    f"relation {SEP.join(t)} names node type {node_type!r}, which "
                    f"raw/num-node-dict.csv.gz does not list ({sorted(counts)})",
                    "add the type and its count to num-node-dict, or correct the relation",
                )
    folders = root / "raw/relations"
    listed = {SEP.join(t) for t in triplets}
    found = {p.name for p in folders.iterdir() if p.is_dir()} if folders.is_dir() else set()
    for name in sorted(found - listed):
        raise _problem(
            root,
            f"raw/relations/{name}",
            f"unknown relation name: triplet-type-list.csv.gz does not list it (it lists {sorted(listed)})",
            "add the relation to triplet-type-list, or remove the folder",
        )
    if len(listed) != len(triplets):
        raise _problem(root, rel, "a relation is listed twice", "list each relation once")
    return triplets  # type: ignore[return-value]


def read_relation(root: Path, triplet: tuple[str, str, str], counts: dict[str, int]) -> tuple[np.ndarray, np.ndarray]:
    """(src, dst) local ids of one relation's edges, checked against its edge count and the types' node counts."""
    folder = f"raw/relations/{SEP.join(triplet)}"
    edge_file, count_file = root / folder / "edge.csv.gz", root / folder / "num-edge-list.csv.gz"
    if not edge_file.is_file():
        raise _problem(
            root,
            f"{folder}/edge.csv.gz",
            "is missing (triplet-type-list.csv.gz lists the relation)",
            "add the relation's edges, or remove it from triplet-type-list",
        )
    blocks = list(iter_numeric_blocks(edge_file, 2, "int64"))
    edges = np.concatenate(blocks) if blocks else np.zeros((0, 2), np.int64)
    if count_file.is_file():
        expected = read_numeric(count_file, "int64").ravel()
        if len(expected) != 1 or int(expected[0]) != len(edges):
            raise _problem(
                root,
                f"{folder}/num-edge-list.csv.gz",
                f"says {expected.tolist()} edges but edge.csv.gz has {len(edges)} (mismatched counts)",
                "download the dataset again, or correct the count",
            )
    for col, node_type in ((0, triplet[0]), (1, triplet[2])):
        ids = edges[:, col]
        if len(ids) and (ids.min() < 0 or ids.max() >= counts[node_type]):
            raise _problem(
                root,
                f"{folder}/edge.csv.gz",
                f"{('source', 'target')[col]} ids range over "
                f"[{ids.min()}, {ids.max()}] but type {node_type!r} has {counts[node_type]} nodes",
                "ids are local to their node type, from 0; check num-node-dict.csv.gz",
            )
    return edges[:, 0].copy(), edges[:, 1].copy()


def _target_type(root: Path, split_dir: Path, counts: dict[str, int]) -> str:
    """The one node type with labels and a split."""
    with_split = sorted(p.name for p in split_dir.iterdir() if p.is_dir())
    for t in with_split:
        if t not in counts:
            raise _problem(
                root,
                f"split/{split_dir.name}/{t}",
                f"{t!r} is not a node type of num-node-dict.csv.gz ({sorted(counts)})",
                "name the split folder after the labeled node type",
            )
        if not (root / "raw/node-label" / t / "node-label.csv.gz").is_file():
            raise _problem(
                root,
                f"split/{split_dir.name}/{t}",
                f"a split on type {t!r}, which has no labels (raw/node-label/{t}/node-label.csv.gz is missing)",
                "add that type's labels, or remove its split folder",
            )
    if len(with_split) != 1:
        raise _problem(
            root,
            f"split/{split_dir.name}",
            f"expected one node type with a split, found {with_split}",
            "keep the split of the node type to classify (one target type per store)",
        )
    return with_split[0]


def _split_dir(root: Path, info: OgbInfo | None) -> Path:
    base = root / "split"
    if info is not None and (base / info.split).is_dir():
        return base / info.split
    subs = sorted(p for p in base.iterdir() if p.is_dir()) if base.is_dir() else []
    if len(subs) != 1:
        raise folder_problem(root, f"expected exactly one folder under split/, found {[p.name for p in subs]}")
    return subs[0]


def _features(root: Path, node_type: str, n: int) -> tuple[int, Path | None]:
    path = root / "raw/node-feat" / node_type / "node-feat.csv.gz"
    return (count_columns(path), path) if path.is_file() else (0, None)


def feature_blocks_of(root: Path, node_type: str, path: Path, dim: int, n: int) -> Iterator[np.ndarray]:
    rows = 0
    for block in iter_numeric_blocks(path, dim, "float32"):
        rows += len(block)
        yield block
    if rows != n:
        raise _problem(
            root,
            f"raw/node-feat/{node_type}/node-feat.csv.gz",
            f"has {rows} rows but num-node-dict says {n} nodes of type {node_type!r} (mismatched counts)",
            "one feature row per node",
        )


def with_reverse(relations: list[Relation]) -> list[Relation]:
    """Every relation and its reverse ``rev_<name>`` (src and dst swapped), as PyG's ToUndirected."""
    names = {r.key for r in relations}
    out = list(relations)
    for r in relations:
        rev = Relation(r.dst, f"rev_{r.name}", r.src, r.dst_ids, r.src_ids, reverse_of=r.key)
        if rev.key in names:
            raise StoreError(
                f"--add-reverse: relation {rev.key} already exists. Fix: drop --add-reverse (the "
                "dataset already lists reverse relations) or rename the relation"
            )
        out.append(rev)
    return out


def ogb_hetero_source(root: Path, name: str, info: OgbInfo | None, add_reverse: bool = False) -> GraphSource:
    """A GraphSource over an OGB heterogeneous folder: the union graph in global ids, plus its HeteroParts."""
    root = Path(root)
    counts = read_node_counts(root)
    triplets = read_triplets(root, counts)
    split_dir = _split_dir(root, info)
    target = _target_type(root, split_dir, counts)
    _check_target_files(root, split_dir, target)
    relations = [Relation(s, r, d, *read_relation(root, (s, r, d), counts)) for s, r, d in triplets]
    if add_reverse:
        relations = with_reverse(relations)
    types = list(counts)
    offsets = dict(zip(types, np.cumsum([0] + [counts[t] for t in types]).tolist()))
    n = sum(counts.values())
    dims = {t: _features(root, t, counts[t]) for t in types}

    def edge_blocks() -> Iterator[EdgeBlock]:
        for r in relations:
            yield r.src_ids + offsets[r.src], r.dst_ids + offsets[r.dst], None

    parts = HeteroParts(
        node_types=types,
        counts=counts,
        target=target,
        relations=relations,
        feature_dims={t: d for t, (d, _) in dims.items()},
        feature_blocks={
            t: (lambda t=t, p=p, d=d: feature_blocks_of(root, t, p, d, counts[t]))
            for t, (d, p) in dims.items()
            if p is not None
        },
    )
    return GraphSource(
        name=name,
        num_nodes=n,
        feature_dim=0,
        edge_blocks=edge_blocks,
        feature_blocks=lambda: iter([np.zeros((n, 0), np.float32)]),
        labels=lambda: _labels(root, target, counts, offsets[target], n),
        splits=lambda: _splits(root, split_dir, target, counts[target], offsets[target]),
        task_type="multiclass",
        metric="acc",
        num_classes=info.num_classes if info is not None else 0,
        ogb_name=info.name if info is not None else None,
        expected_edges=sum(len(r.src_ids) for r in relations),
        info={
            "kind": "ogb" if info else "ogb-hetero-layout",
            "dataset": name,
            "path": str(root),
            "release": info.version if info else None,
            "split": split_dir.name,
            "add_reverse": add_reverse,
        },
        hetero=parts,
    )


def _check_target_files(root: Path, split_dir: Path, target: str) -> None:
    """The target type's split id files and its label file (one column) exist, before anything is read."""
    for part in SPLIT_PARTS:
        if not (split_dir / target / f"{part}.csv.gz").is_file():
            raise _problem(
                root,
                f"split/{split_dir.name}/{target}/{part}.csv.gz",
                "is missing",
                "give train, valid and test id files",
            )
    label_cols = count_columns(root / "raw/node-label" / target / "node-label.csv.gz")
    if label_cols != 1:
        raise _problem(
            root,
            f"raw/node-label/{target}/node-label.csv.gz",
            f"has {label_cols} columns",
            "one class id per line (-1 = unlabeled); multi-task heterogeneous labels are not supported",
        )


def _labels(root: Path, target: str, counts: dict[str, int], first: int, n: int) -> np.ndarray:
    """The target type's labels at its global ids (from ``first``), -1 for every other vertex and the unlabelled."""
    y = read_numeric(root / "raw/node-label" / target / "node-label.csv.gz", "float64").ravel()
    if len(y) != counts[target]:
        raise _problem(
            root,
            f"raw/node-label/{target}/node-label.csv.gz",
            f"has {len(y)} rows but num-node-dict says {counts[target]} nodes of type {target!r} (mismatched counts)",
            "one label per node",
        )
    out = np.full(n, -1.0)
    out[first : first + len(y)] = np.where(np.isnan(y), -1, y)
    return out


def _splits(root: Path, split_dir: Path, target: str, count: int, first: int) -> dict[str, np.ndarray]:
    """The split's ids of the target type (local, from 0), as global ids (from ``first``)."""
    out = {}
    for part in SPLIT_PARTS:
        ids = read_numeric(split_dir / target / f"{part}.csv.gz", "int64").ravel()
        if len(ids) and (ids.min() < 0 or ids.max() >= count):
            raise _problem(
                root,
                f"split/{split_dir.name}/{target}/{part}.csv.gz",
                f"ids range over [{ids.min()}, {ids.max()}] but type {target!r} has {count} nodes",
                "split ids are local to the labeled type, from 0",
            )
        out[part] = ids + first
    return out
