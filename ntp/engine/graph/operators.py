"""Propagation operators by name, in the two forms the engine uses.

- The compact form (what tensor parallelism runs): :func:`scaling` gives each operator as a :class:`Scaling` of the
  unit-weight adjacency ``A`` of a :class:`~ntp.engine.graph.topology.Topology`: ``diag(post) A diag(pre) + diag(diag)``.
  Self-loops are the diagonal term (existing self-loops are taken out of it where the operator replaces them), so
  neither a self-loop pattern nor edge values are ever materialised.
- The explicit form (:func:`operator_pattern`): the same matrix as a CSR pattern with self-loops added and per-edge
  values. Data-parallel mode runs it, and tests hold the compact form to it.

Operators: "gcn": D^-1/2 (A+I) D^-1/2; "mean": D^-1 A (SAGE); "mean_self": D^-1 (A+I); "sum_root": A + I (GIN
with eps = 0, existing self-loops kept as in PyG). "+I" replaces existing self-loops (PyG's "remaining" self-loops).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

OPERATORS = ("gcn", "mean", "mean_self", "sum_root")


@dataclass
class Scaling:
    """``M = diag(post) A diag(pre) + diag(diag)`` for the unit-weight adjacency ``A`` (None: no such term).

    Every propagation operator has this form (ntp.engine.graph.operators), so no edge value is ever stored: a chunk's
    values are ``pre[sources]``, gathered when the chunk runs. The transpose swaps ``pre`` and ``post``."""

    pre: torch.Tensor | None = None
    post: torch.Tensor | None = None
    diag: torch.Tensor | None = None

    def transposed(self) -> "Scaling":
        return Scaling(self.post, self.pre, self.diag)

    def to(self, device: torch.device) -> "Scaling":
        return Scaling(*(None if v is None else v.to(device) for v in (self.pre, self.post, self.diag)))


# -- topology -------------------------------------------------------------------------------------------------------
@dataclass
class CSR:
    """A square CSR matrix over in-edges: int64 row pointers, int64 or int32 column ids."""

    indptr: torch.Tensor
    indices: torch.Tensor
    num_nodes: int

    @property
    def num_edges(self) -> int:
        return int(self.indices.shape[0])

    def in_degrees(self) -> torch.Tensor:
        return self.indptr[1:] - self.indptr[:-1]

    def edge_rows(self) -> torch.Tensor:
        """Destination vertex of every edge, in CSR order."""
        return torch.repeat_interleave(torch.arange(self.num_nodes), self.in_degrees())

    @staticmethod
    def from_numpy(indptr: np.ndarray, indices: np.ndarray) -> "CSR":
        return CSR(
            torch.from_numpy(np.asarray(indptr, dtype=np.int64)),
            torch.from_numpy(np.asarray(indices, dtype=np.int64)),
            len(indptr) - 1,
        )


def transpose(csr: CSR) -> tuple[CSR, torch.Tensor]:
    """The CSR of ``A^T`` and ``perm`` such that edge ``e`` of ``A^T`` is edge ``perm[e]`` of ``A``."""
    perm = torch.argsort(csr.indices, stable=True)
    indices_t = csr.edge_rows()[perm]
    counts = torch.bincount(csr.indices, minlength=csr.num_nodes)
    indptr_t = torch.zeros(csr.num_nodes + 1, dtype=torch.int64)
    torch.cumsum(counts, 0, out=indptr_t[1:])
    return CSR(indptr_t, indices_t, csr.num_nodes), perm


def with_self_loops(csr: CSR, keep_existing: bool = False) -> CSR:
    """``A + I`` as a pattern: one self-loop added per vertex (last in its row).

    By default existing self-loops are removed first (PyG's "remaining" self-loops for unweighted graphs);
    ``keep_existing`` keeps them (the sum of GIN counts them on top of the root term)."""
    rows = csr.edge_rows()
    keep = torch.ones_like(rows, dtype=torch.bool) if keep_existing else csr.indices != rows
    n = csr.num_nodes
    all_rows = torch.cat([rows[keep], torch.arange(n)])
    all_cols = torch.cat([csr.indices[keep], torch.arange(n, dtype=csr.indices.dtype)])
    order = torch.argsort(all_rows, stable=True)
    counts = torch.bincount(all_rows, minlength=n)
    indptr = torch.zeros(n + 1, dtype=torch.int64)
    torch.cumsum(counts, 0, out=indptr[1:])
    return CSR(indptr, all_cols[order], n)


# -- normalisations (pure functions: edge values for a pattern) -------------------------------------------------------
def gcn_values(pattern: CSR) -> torch.Tensor:
    """``D^-1/2 A D^-1/2`` with ``D`` the in-degrees of the pattern (pass it ``with_self_loops`` for GCN)."""
    deg = pattern.in_degrees().to(torch.float64)
    dinv = torch.where(deg > 0, deg.rsqrt(), torch.zeros_like(deg))
    return (dinv[pattern.edge_rows()] * dinv[pattern.indices]).to(torch.float32)


def mean_values(pattern: CSR) -> torch.Tensor:
    """``D^-1 A``: the mean over in-neighbours (vertices without in-edges aggregate to zero)."""
    deg = pattern.in_degrees().to(torch.float32).clamp(min=1)
    return (1.0 / deg)[pattern.edge_rows()]


def sum_values(pattern: CSR) -> torch.Tensor:
    return torch.ones(pattern.num_edges, dtype=torch.float32)


# -- the compact form -------------------------------------------------------------------------------------------------
def scaling(topology, name: str) -> Scaling:
    """Operator ``name`` over ``topology`` (a :class:`~ntp.engine.graph.topology.Topology`) as a :class:`Scaling`."""
    in_deg = topology.in_degrees().to(torch.float64)
    loops = topology.self_loops.to(torch.float64) if topology.self_loops is not None else torch.zeros_like(in_deg)
    if name == "gcn":
        dinv = (in_deg - loops + 1).rsqrt()
        return Scaling(pre=dinv.float(), post=dinv.float(), diag=((1 - loops) * dinv * dinv).float())
    if name == "mean":
        return Scaling(post=(1.0 / in_deg.clamp(min=1)).float())
    if name == "mean_self":
        inv = 1.0 / (in_deg - loops + 1)
        return Scaling(post=inv.float(), diag=((1 - loops) * inv).float())
    if name == "sum_root":
        return Scaling(diag=torch.ones(topology.num_nodes))
    raise ValueError(f"unknown operator {name!r}; known: {OPERATORS}")


# -- the explicit form ------------------------------------------------------------------------------------------------
def operator_pattern(csr: CSR, name: str) -> tuple[CSR, torch.Tensor]:
    """The sparsity pattern and edge values of propagation operator ``name`` over the whole graph."""
    if name == "gcn":
        pattern = with_self_loops(csr)
        return pattern, gcn_values(pattern)
    if name == "mean":
        return csr, mean_values(csr)
    if name == "mean_self":
        pattern = with_self_loops(csr)
        return pattern, mean_values(pattern)
    if name == "sum_root":
        pattern = with_self_loops(csr, keep_existing=True)
        return pattern, sum_values(pattern)
    raise ValueError(f"unknown operator {name!r}; known: {OPERATORS}")
