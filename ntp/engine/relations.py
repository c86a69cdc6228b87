"""Relation-wise aggregation for heterogeneous graphs, and the per-rank context R-GCN runs in.

Each relation ``r: s -> t`` is a sparse ``n_t x n_s`` matrix ``A_r`` (row v lists v's in-neighbours of relation r).
Aggregation ``A_r @ H_s`` works column by column, so in the column layout (every row of a type, this rank's column
slice) every rank aggregates its slice with no communication, as for homogeneous graphs. Normalisation (``norm``):

- ``mean``: row v scaled by 1 / |N_r(v)| (R-GCN's c_{v,r}; PyG ``RGCNConv(aggr="mean")``);
- ``total``: row v scaled by 1 / sum_r' |N_r'(v)| over every relation into v's type (R-GCN's alternative c_v);
- ``sum``: no scaling (PyG ``aggr="add"``).

The backward of ``A_r @ H`` is ``A_r^T @ G`` (a precomputed transposed CSR: relations are directed), and both run
row block by row block (``chunk_rows`` destination rows with all their in-edges per chunk), so one product's working
memory is bounded; every rank uses the same blocks.
"""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import torch

from ntp.engine.aggregate import csr_matmul, uniform_bounds
from ntp.engine.chunking import OverlapClock, PhaseMemory
from ntp.engine.collectives import Comm
from ntp.engine.hetero_data import HeteroGraphData, RelationData
from ntp.engine.partition import Partition

NORMS = ("mean", "total", "sum")


def _blocks(indptr: np.ndarray, indices: np.ndarray, values: np.ndarray, num_cols: int, chunk_rows: int,
            device: torch.device) -> list[torch.Tensor]:
    """Row blocks of a CSR as torch sparse CSR tensors on ``device``."""
    out = []
    bounds = uniform_bounds(len(indptr) - 1, chunk_rows)
    for r0, r1 in zip(bounds[:-1], bounds[1:]):
        e0, e1 = int(indptr[r0]), int(indptr[r1])
        out.append(torch.sparse_csr_tensor(torch.from_numpy(indptr[r0:r1 + 1] - e0),
                                           torch.from_numpy(indices[e0:e1].astype(np.int64)),
                                           torch.from_numpy(values[e0:e1]), size=(r1 - r0, num_cols)).to(device))
    return out


class RelationOperator:
    """``A_r`` with its normalisation, applied in row blocks; ``transpose`` blocks serve the backward."""

    def __init__(self, rel: RelationData, num_src: int, row_scale: np.ndarray, chunk_rows: int,
                 device: torch.device) -> None:
        self.key, self.src, self.dst = rel.key, rel.src, rel.dst
        indptr, indices = np.asarray(rel.indptr, np.int64), np.asarray(rel.indices, np.int64)
        deg = np.diff(indptr)
        values = np.repeat(row_scale, deg).astype(np.float32)
        num_dst = len(indptr) - 1
        self.num_edges = len(indices)
        self.forward_blocks = _blocks(indptr, indices, values, num_src, chunk_rows, device)
        order = np.argsort(indices, kind="stable")
        t_indptr = np.zeros(num_src + 1, np.int64)
        np.cumsum(np.bincount(indices, minlength=num_src), out=t_indptr[1:])
        dst = np.repeat(np.arange(num_dst, dtype=np.int64), deg)
        self.backward_blocks = _blocks(t_indptr, dst[order], values[order], num_dst, chunk_rows, device)

    @staticmethod
    def _product(blocks: list[torch.Tensor], h: torch.Tensor) -> torch.Tensor:
        parts = [csr_matmul(b if b.dtype == h.dtype else b.to(h.dtype), h) for b in blocks]
        return parts[0] if len(parts) == 1 else torch.cat(parts)

    def __call__(self, h: torch.Tensor) -> torch.Tensor:
        return _RelationSpMM.apply(h, self)

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for b in self.forward_blocks + self.backward_blocks
                   for t in (b.crow_indices(), b.col_indices(), b.values()))


class _RelationSpMM(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h: torch.Tensor, op: RelationOperator) -> torch.Tensor:
        ctx.op = op
        return op._product(op.forward_blocks, h)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return ctx.op._product(ctx.op.backward_blocks, grad.contiguous()), None


def row_scales(data: HeteroGraphData, norm: str) -> list[np.ndarray]:
    """Per relation, the scaling of each destination row (see the module's docstring)."""
    if norm not in NORMS:
        raise ValueError(f"relation normalisation {norm!r}: choose one of {NORMS}")
    degrees = [np.diff(np.asarray(r.indptr, np.int64)) for r in data.relations]
    total = {t: np.zeros(n, np.int64) for t, n in data.counts.items()}
    for r, deg in zip(data.relations, degrees):
        total[r.dst] += deg
    scale = []
    for r, deg in zip(data.relations, degrees):
        if norm == "sum":
            scale.append(np.ones(len(deg)))
        else:
            by = deg if norm == "mean" else total[r.dst]
            scale.append(np.divide(1.0, by, out=np.zeros(len(by)), where=by > 0))
    return scale


class HeteroContext:
    """One rank's state for heterogeneous models: a communicator per node type (rows of that type split over the
    ranks, one traffic account), the relation operators, the dropout step. It carries the fields the loop's
    per-worker records read (as ``GraphContext`` does)."""

    def __init__(self, data: HeteroGraphData, comm: Comm, *, norm: str, chunk_rows: int, seed: int) -> None:
        self.comm, self.seed, self.step = comm, seed, 0
        self.types = list(data.counts)
        self.counts = dict(data.counts)
        self.comms = {}
        for t, n in data.counts.items():
            c = Comm(Partition(n, comm.world, comm.rank), comm.device, comm.group)
            c.stats = comm.stats
            self.comms[t] = c
        scales = row_scales(data, norm)
        self.ops = [RelationOperator(r, data.counts[r.src], s, chunk_rows, comm.device)
                    for r, s in zip(data.relations, scales)]
        #: destination type -> indices of the relations into it
        self.into = {t: [i for i, op in enumerate(self.ops) if op.dst == t] for t in self.types}
        chunks = max((len(op.forward_blocks) for op in self.ops), default=1)
        self.plan = SimpleNamespace(num_chunks=chunks)
        self.memory, self.clock = PhaseMemory(comm.device), OverlapClock()
        self.overlapped, self.offload, self.nn_device = False, "none", comm.device
        self.topology = SimpleNamespace(nbytes=lambda: sum(op.nbytes() for op in self.ops))

    @property
    def device(self) -> torch.device:
        return self.comm.device

    def row_offset(self, node_type: str) -> int:
        return self.comms[node_type].part.rows()[0]

    def device_topology_bytes(self) -> int:
        return self.topology.nbytes() if self.device.type == "cuda" else 0

    def reset_stats(self) -> None:
        self.memory.reset()
        self.clock.reset()
