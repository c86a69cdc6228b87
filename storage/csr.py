"""Streaming CSR construction over in-edges with bounded memory.

Pass 1 (`add`): validate and preprocess each edge block, count in-degrees, spill the block to disk.
Pass 2 (`finish`): scatter the spilled blocks into their rows (stable; reverse copies for
symmetrisation and added self-loops follow as extra sweeps), then sort every row by source id
block by block, dropping duplicates when asked. Peak memory is the final CSR plus a few
O(num_nodes) arrays and one edge block; the spill needs (4 or 8) x 2 bytes per edge of disk.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

from storage.schema import StoreError

BLOCK_EDGES = 1 << 22


@dataclass(frozen=True)
class Preprocessing:
    """Graph preprocessing applied while building.

    symmetrize: add the reverse of every edge (implies dedup, so the result is A | A^T).
    self_loops: every vertex gets exactly one self-loop (existing ones are replaced).
    dedup: keep one copy of repeated (src, dst) pairs (the first one's weight).
    drop_self_loops: remove all self-loops.
    """

    symmetrize: bool = False
    self_loops: bool = False
    dedup: bool = False
    drop_self_loops: bool = False

    def __post_init__(self) -> None:
        if self.self_loops and self.drop_self_loops:
            raise ValueError("self_loops and drop_self_loops contradict each other: choose one")

    def effective(self) -> "Preprocessing":
        """The options as actually applied (symmetrize implies dedup)."""
        return Preprocessing(self.symmetrize, self.self_loops, self.dedup or self.symmetrize, self.drop_self_loops)

    def to_dict(self) -> dict[str, bool]:
        e = self.effective()
        return {
            "symmetrized": e.symmetrize,
            "self_loops": e.self_loops,
            "deduplicated": e.dedup,
            "dropped_self_loops": e.drop_self_loops,
        }


@dataclass
class CsrArrays:
    """In-edge CSR: row v holds the sources u of edges u -> v, sorted by u."""

    indptr: np.ndarray
    indices: np.ndarray
    weights: np.ndarray | None


class _Spill:
    """Append-only binary files holding the preprocessed edge blocks between the passes."""

    def __init__(self, workdir: Path, index_dtype: np.dtype, weighted: bool) -> None:
        self.paths = {k: workdir / f"spill-{k}.bin" for k in ("src", "dst", "w")}
        self.dtypes = {"src": index_dtype, "dst": index_dtype, "w": np.dtype(np.float32)}
        self.keys = ("src", "dst", "w") if weighted else ("src", "dst")
        self.files = {k: open(self.paths[k], "wb") for k in self.keys}

    def write(self, **arrays: np.ndarray) -> None:
        for k in self.keys:
            arrays[k].astype(self.dtypes[k], copy=False).tofile(self.files[k])

    def blocks(self, total: int, size: int) -> Iterator[dict[str, np.ndarray]]:
        """Read the spilled edges back in blocks (may be called repeatedly)."""
        for f in self.files.values():
            f.close()
        readers = {k: open(self.paths[k], "rb") for k in self.keys}
        try:
            for start in range(0, total, size):
                n = min(size, total - start)
                yield {k: np.fromfile(readers[k], dtype=self.dtypes[k], count=n) for k in self.keys}
        finally:
            for f in readers.values():
                f.close()

    def remove(self) -> None:
        for f in self.files.values():
            f.close()
        for p in self.paths.values():
            p.unlink(missing_ok=True)


class CsrBuilder:
    """Build a CSR from streamed (src, dst[, weight]) blocks; see the module docstring."""

    def __init__(
        self,
        num_nodes: int,
        index_dtype: str,
        workdir: Path,
        weighted: bool,
        prep: Preprocessing,
        progress: Callable[[str], None],
    ) -> None:
        self.n = num_nodes
        self.dtype = np.dtype(index_dtype)
        self.weighted = weighted
        self.prep = prep.effective()
        self.progress = progress
        self.in_counts = np.zeros(num_nodes, dtype=np.int64)
        self.spilled = 0
        self.raw_edges = 0
        self.spill = _Spill(workdir, self.dtype, weighted)

    def add(self, src: np.ndarray, dst: np.ndarray, weight: np.ndarray | None = None) -> None:
        """Pass 1 over one block of raw edges."""
        src, dst = np.asarray(src), np.asarray(dst)
        if src.shape != dst.shape or src.ndim != 1:
            raise StoreError(f"edge block has mismatched shapes src {src.shape} dst {dst.shape}")
        if self.weighted:
            if weight is None or np.shape(weight) != src.shape:
                raise StoreError("a weighted graph needs one weight per edge in every block")
            weight = np.asarray(weight, dtype=np.float32)
        self._check_range(src, "source")
        self._check_range(dst, "destination")
        self.raw_edges += len(src)
        p = self.prep
        if p.drop_self_loops or p.self_loops:
            keep = src != dst
            src, dst = src[keep], dst[keep]
            weight = weight[keep] if self.weighted else None
        self.in_counts += np.bincount(dst, minlength=self.n)
        if p.symmetrize:  # the reverse copies are scattered after all original edges (pass 2)
            self.in_counts += np.bincount(src, minlength=self.n)
        self.spill.write(src=src, dst=dst, w=weight)
        self.spilled += len(src)

    def _check_range(self, ids: np.ndarray, what: str) -> None:
        if ids.size and (ids.min() < 0 or ids.max() >= self.n):
            bad = ids[(ids < 0) | (ids >= self.n)][0]
            raise StoreError(
                f"edge {what} id {int(bad)} is outside [0, {self.n}); check the edge list against the number of nodes"
            )

    def finish(self) -> CsrArrays:
        """Pass 2: scatter, sort rows, deduplicate. Returns the final CSR.

        Row order before sorting is: original edges, then reverse copies, then added self-loops,
        each in input order, so "the first copy" does not depend on block sizes.
        """
        if self.prep.self_loops:
            self.in_counts += 1
        indptr = np.zeros(self.n + 1, dtype=np.int64)
        np.cumsum(self.in_counts, out=indptr[1:])
        del self.in_counts
        total = int(indptr[-1])
        indices = np.empty(total, dtype=self.dtype)
        weights = np.empty(total, dtype=np.float32) if self.weighted else None
        self.progress(f"scattering {total:,} edges into {self.n:,} rows")
        cursor = indptr[:-1].copy()
        for block in self.spill.blocks(self.spilled, BLOCK_EDGES):
            _scatter(block, cursor, indices, weights)
        if self.prep.symmetrize:
            for block in self.spill.blocks(self.spilled, BLOCK_EDGES):
                block["src"], block["dst"] = block["dst"], block["src"]
                _scatter(block, cursor, indices, weights)
        if self.prep.self_loops:
            for start in range(0, self.n, BLOCK_EDGES):
                ids = np.arange(start, min(self.n, start + BLOCK_EDGES), dtype=np.int64)
                _scatter({"src": ids, "dst": ids, "w": np.ones(len(ids), np.float32)}, cursor, indices, weights)
        del cursor
        self.spill.remove()
        self.progress("sorting rows" + (" and removing duplicates" if self.prep.dedup else ""))
        return _sort_rows(indptr, indices, weights, self.prep.dedup)


def _scatter(block: dict[str, np.ndarray], cursor: np.ndarray, indices: np.ndarray, weights: np.ndarray | None) -> None:
    dst = block["dst"]
    if not len(dst):
        return
    order = np.argsort(dst, kind="stable")
    d = dst[order]
    starts = np.flatnonzero(np.r_[True, d[1:] != d[:-1]])
    sizes = np.diff(np.r_[starts, len(d)])
    within = np.arange(len(d), dtype=np.int64) - np.repeat(starts, sizes)
    pos = cursor[d] + within
    indices[pos] = block["src"][order]
    if weights is not None:
        weights[pos] = block["w"][order]
    cursor[d[starts]] += sizes


def _row_blocks(indptr: np.ndarray, size: int) -> Iterator[tuple[int, int]]:
    """Row ranges holding about `size` edges each (at least one row)."""
    n = len(indptr) - 1
    r0 = 0
    while r0 < n:
        r1 = int(np.searchsorted(indptr, indptr[r0] + size, side="right")) - 1
        r1 = min(n, max(r1, r0 + 1))
        yield r0, r1
        r0 = r1


def _sort_rows(indptr: np.ndarray, indices: np.ndarray, weights: np.ndarray | None, dedup: bool) -> CsrArrays:
    n = len(indptr) - 1
    new_counts = np.diff(indptr) if not dedup else np.zeros(n, dtype=np.int64)
    write = 0
    for r0, r1 in _row_blocks(indptr, BLOCK_EDGES):
        a, b = int(indptr[r0]), int(indptr[r1])
        if a == b:
            continue
        rows = np.repeat(np.arange(r1 - r0, dtype=np.int64), np.diff(indptr[r0 : r1 + 1]))
        seg = indices[a:b]
        if n < 3 * 10**9:
            key = rows * n + seg
            order = np.argsort(key, kind="stable") if weights is not None else None
            key = key[order] if order is not None else np.sort(key)
            seg_sorted = (key % n).astype(indices.dtype)
        else:
            order = np.lexsort((seg, rows))
            key = None
            seg_sorted = seg[order]
        w = weights[a:b][order] if weights is not None else None
        if dedup:
            same = (seg_sorted[1:] == seg_sorted[:-1]) & (rows[1:] == rows[:-1]) if key is None else key[1:] == key[:-1]
            keep = np.r_[True, ~same]
            seg_sorted, rows_kept = seg_sorted[keep], rows[keep]
            w = w[keep] if w is not None else None
            new_counts[r0:r1] = np.bincount(rows_kept, minlength=r1 - r0)
        k = len(seg_sorted)
        indices[write : write + k] = seg_sorted
        if weights is not None:
            weights[write : write + k] = w
        write += k
    out_indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(new_counts, out=out_indptr[1:])
    return CsrArrays(out_indptr, indices[:write], weights[:write] if weights is not None else None)


def transpose_order(indices: np.ndarray, num_nodes: int) -> tuple[np.ndarray, np.ndarray]:
    """Row pointers of the CSR of ``A^T`` (from the CSR column ids ``indices`` of ``A``) and the edge order that sorts
    ``A``'s edges by column, stably: every row of ``A^T`` then lists its columns in increasing order."""
    import torch  # its stable sort of integers is a radix sort, several times numpy's

    t_indptr = np.zeros(num_nodes + 1, np.int64)
    np.cumsum(np.bincount(indices, minlength=num_nodes), out=t_indptr[1:])
    order = torch.argsort(torch.from_numpy(indices), stable=True).numpy()
    return t_indptr, order


def transpose_indices(indptr: np.ndarray, indices: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """The column ids of the CSR of ``A^T`` (its row pointers are the cumulative column counts of ``A``)."""
    n = len(indptr) - 1
    rows = np.repeat(np.arange(n, dtype=indices.dtype), np.diff(indptr))
    _, order = transpose_order(indices, n)
    return np.take(rows, order, out=out)
