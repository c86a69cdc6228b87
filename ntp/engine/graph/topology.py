"""The graph's structure as every rank holds it, in as few bytes per edge as it takes.

A :class:`Topology` is the in-edge CSR of ``A``, the CSR of ``A^T`` (the backward of every propagation), and the
count of existing self-loops per vertex. Indices are 32-bit whenever the vertex count allows (row pointers stay
64-bit: offsets pass 2^31 long before vertex ids do). Edge values are never stored: every operator is ``A`` with
unit weights scaled per row and column (ntp.engine.graph.operators), and self-loops are a diagonal term, so the topology is
8 bytes per edge, or 4 when ``A`` is symmetric (then ``A^T`` is ``A``, the same arrays).

The arrays come from an allocator, so the ranks of one node can build them once into shared memory
(ntp.engine.graph.node_shared) instead of each holding a copy.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from storage.csr import transpose_order

#: (name, shape, dtype) -> a writable array; plain ``np.empty`` by default, shared memory for the ranks of a node
Allocator = Callable[[str, tuple[int, ...], np.dtype], np.ndarray]
#: alloc -> a topology's named arrays (what :func:`build` returns)
Builder = Callable[[Allocator], dict[str, np.ndarray]]


def empty(name: str, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    return np.empty(shape, dtype)


def index_dtype(num_nodes: int) -> np.dtype:
    """The narrowest index type for vertex ids: int32 below 2^31 vertices."""
    return np.dtype(np.int32 if num_nodes < 2**31 else np.int64)


@dataclass
class Topology:
    """In-edge CSR ``(indptr, indices)`` of ``A``, ``(t_indptr, t_indices)`` of ``A^T`` (the same tensors when ``A``
    is symmetric), and ``self_loops[v]``, the number of edges ``v -> v`` (None: there are none)."""

    indptr: torch.Tensor
    indices: torch.Tensor
    t_indptr: torch.Tensor
    t_indices: torch.Tensor
    self_loops: torch.Tensor | None = None

    @property
    def num_nodes(self) -> int:
        return int(self.indptr.shape[0]) - 1

    @property
    def num_edges(self) -> int:
        return int(self.indices.shape[0])

    @property
    def symmetric(self) -> bool:
        return self.t_indices is self.indices

    def in_degrees(self) -> torch.Tensor:
        return self.indptr[1:] - self.indptr[:-1]

    def out_degrees(self) -> torch.Tensor:
        return self.t_indptr[1:] - self.t_indptr[:-1]

    def nbytes(self) -> int:
        """Bytes of the arrays (each counted once)."""
        tensors = {
            id(t): t
            for t in (self.indptr, self.indices, self.t_indptr, self.t_indices, self.self_loops)
            if t is not None
        }
        return sum(t.numel() * t.element_size() for t in tensors.values())

    @staticmethod
    def from_arrays(arrays: dict[str, np.ndarray]) -> "Topology":
        """The topology of :func:`build` (or of shared arrays with the same names)."""
        with warnings.catch_warnings():  # arrays a machine's ranks share are mapped read-only: nothing writes them
            warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
            t = {k: torch.from_numpy(v) for k, v in arrays.items()}
        symmetric = "t_indices" not in t
        return Topology(
            t["indptr"],
            t["indices"],
            t["indptr"] if symmetric else t["t_indptr"],
            t["indices"] if symmetric else t["t_indices"],
            t.get("self_loops"),
        )


#: fills ``(indptr, indices)`` (int64 [n+1], ``index_dtype(n)`` [E]) with the in-edge CSR, e.g. from a store
Filler = Callable[[np.ndarray, np.ndarray], None]


def build(
    num_nodes: int,
    num_edges: int,
    fill: Filler,
    alloc: Allocator = empty,
    symmetric: bool | None = None,
    fill_transpose: Filler | None = None,
) -> dict[str, np.ndarray]:
    """The arrays of a :class:`Topology`: ``fill`` writes the CSR of ``A`` straight into ``alloc``'s arrays, the
    rest is derived from it.

    ``symmetric``: True when the caller knows ``A = A^T`` (a symmetrised store), so no transpose is built;
    None: find out (the transpose is compared, and dropped when equal). ``fill_transpose``: writes the CSR of ``A^T``
    (a store that keeps it), instead of sorting ``A``'s edges here."""
    n, e = num_nodes, num_edges
    out = {"indptr": alloc("indptr", (n + 1,), np.dtype(np.int64)), "indices": alloc("indices", (e,), index_dtype(n))}
    fill(out["indptr"], out["indices"])
    rows = np.repeat(np.arange(n, dtype=out["indices"].dtype), np.diff(out["indptr"]))
    loops = np.bincount(rows[rows == out["indices"]], minlength=n)
    if loops.any():
        out["self_loops"] = alloc("self_loops", (n,), np.dtype(np.int32))
        out["self_loops"][:] = loops
    if symmetric:
        return out
    t = {"t_indptr": alloc("t_indptr", (n + 1,), np.dtype(np.int64)), "t_indices": alloc("t_indices", (e,), rows.dtype)}
    if fill_transpose is not None:
        del rows
        fill_transpose(t["t_indptr"], t["t_indices"])
    else:
        t_indptr, order = transpose_order(out["indices"], n)
        t["t_indptr"][:] = t_indptr
        np.take(rows, order, out=t["t_indices"])
        del order, rows
    if (
        symmetric is None
        and np.array_equal(t["t_indptr"], out["indptr"])
        and np.array_equal(t["t_indices"], out["indices"])
    ):
        return out  # A^T is A: the same arrays serve both directions
    out.update(t)
    return out


def from_csr(indptr: np.ndarray, indices: np.ndarray, alloc: Allocator = empty) -> Topology:
    """The topology of an in-memory in-edge CSR."""

    def fill(p: np.ndarray, i: np.ndarray) -> None:
        p[:], i[:] = indptr, indices

    return Topology.from_arrays(build(len(indptr) - 1, len(indices), fill, alloc))
