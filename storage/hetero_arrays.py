"""A heterogeneous store's extra arrays and metadata: one CSR per relation, per-type features.

Next to the union graph (the store's ordinary CSR over global ids, types as contiguous ranges), each relation
``src___rel___dst`` gets ``hetero/<key>/indptr`` [n_dst + 1] and ``hetero/<key>/indices`` [E_r] (source ids local to
the source type, rows local to the destination type, each row's sources sorted), and every type with features gets
``hetero/feat/<type>`` [n_type, d_type], chunked by columns as the homogeneous features are (a rank reads only its
column slice). The metadata's ``hetero`` entry lists the types (count, global offset, feature width), the target type
and the relations (with the relation each added reverse reverses).
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import zarr

from storage.layout import Layout
from storage.schema import StoreError
from storage.sources.base import HeteroParts

PREFIX = "hetero/"


def relation_arrays(key: str) -> tuple[str, str]:
    return f"{PREFIX}{key}/indptr", f"{PREFIX}{key}/indices"


def feature_array(node_type: str) -> str:
    return f"{PREFIX}feat/{node_type}"


def relation_csr(src: np.ndarray, dst: np.ndarray, num_dst: int) -> tuple[np.ndarray, np.ndarray]:
    """In-edge CSR over destination rows: (indptr int64 [num_dst + 1], sources sorted within each row)."""
    order = np.lexsort((src, dst))
    indptr = np.zeros(num_dst + 1, np.int64)
    np.cumsum(np.bincount(dst, minlength=num_dst), out=indptr[1:])
    return indptr, src[order]


def hetero_meta(parts: HeteroParts) -> dict[str, Any]:
    offsets = np.cumsum([0] + [parts.counts[t] for t in parts.node_types]).tolist()
    return {
        "node_types": [
            {"name": t, "count": parts.counts[t], "offset": int(o), "feature_dim": parts.feature_dims[t]}
            for t, o in zip(parts.node_types, offsets)
        ],
        "target": parts.target,
        "relations": [
            {
                "key": r.key,
                "src": r.src,
                "name": r.name,
                "dst": r.dst,
                "num_edges": int(len(r.src_ids)),
                "reverse_of": r.reverse_of,
            }
            for r in parts.relations
        ],
    }


def write_hetero(
    group: zarr.Group,
    parts: HeteroParts,
    layout: Layout,
    index_dtype: str,
    write_array: Callable[..., str],
    feature_writer: Callable[..., str],
    progress: Callable[[str], None],
) -> dict[str, str]:
    """Write the relations' CSRs and the per-type features; returns their content hashes."""
    sums: dict[str, str] = {}
    progress(f"writing {len(parts.relations)} relation CSRs")
    for r in parts.relations:
        indptr, indices = relation_csr(r.src_ids, r.dst_ids, parts.counts[r.dst])
        ptr_name, idx_name = relation_arrays(r.key)
        sums[ptr_name] = write_array(group, ptr_name, indptr, (layout.row_chunk,))
        sums[idx_name] = write_array(group, idx_name, indices.astype(index_dtype), (layout.edge_chunk,))
    for t, blocks in parts.feature_blocks.items():
        progress(f"writing features of {t} ({parts.counts[t]:,} x {parts.feature_dims[t]})")
        sums[feature_array(t)] = feature_writer(group, feature_array(t), parts.counts[t], parts.feature_dims[t], blocks)
    return sums


def expected_arrays(
    hetero: dict[str, Any], index_dtype: str, feature_dtype: str
) -> dict[str, tuple[tuple[int, ...], str]]:
    """Shapes and dtypes of the hetero arrays the metadata promises (storage.reader checks them)."""
    counts = {t["name"]: t["count"] for t in hetero["node_types"]}
    out: dict[str, tuple[tuple[int, ...], str]] = {}
    for r in hetero["relations"]:
        ptr_name, idx_name = relation_arrays(r["key"])
        out[ptr_name] = ((counts[r["dst"]] + 1,), "int64")
        out[idx_name] = ((r["num_edges"],), index_dtype)
    for t in hetero["node_types"]:
        if t["feature_dim"]:
            out[feature_array(t["name"])] = ((t["count"], t["feature_dim"]), feature_dtype)
    return out


def relation_index(hetero: dict[str, Any], key: str) -> dict[str, Any]:
    """A relation's metadata by key (``src___rel___dst``) or its name alone when that is unambiguous."""
    found = [r for r in hetero["relations"] if key in (r["key"], r["name"])]
    if len(found) != 1:
        known = ", ".join(r["key"] for r in hetero["relations"])
        raise StoreError(f"unknown relation {key!r} (or ambiguous). Fix: use one of: {known}")
    return found[0]
