"""Relation-wise aggregation for heterogeneous graphs, and the per-rank context R-GCN runs in.

Each relation ``r: s -> t`` is a sparse ``n_t x n_s`` matrix ``A_r`` (row v lists v's in-neighbours of relation r);
all relations into a type form one typed CSR (TypedOperator). Aggregation ``A_r @ H_s`` works column by column, so in the column layout (every row of a type, this rank's column
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

from ntp.engine.device.measure import OverlapClock, PhaseMemory
from ntp.engine.distributed.collectives import Comm
from ntp.engine.distributed.partition import Partition
from ntp.engine.graph.aggregate import csr_matmul
from ntp.engine.memory.chunks import uniform_plan
from ntp.engine.tasks.hetero.data import HeteroGraphData, RelationData

NORMS = ("mean", "total", "sum")


def _blocks(
    indptr: np.ndarray,
    indices: np.ndarray,
    values: np.ndarray,
    num_cols: int,
    chunk_rows: int,
    device: torch.device,
    bounds: list[int] | None = None,
) -> list[torch.Tensor]:
    """Row blocks of a CSR as torch sparse CSR tensors on ``device``: ``bounds`` (a memory plan's), else uniform
    blocks of ``chunk_rows``."""
    out = []
    bounds = bounds or uniform_plan(len(indptr) - 1, chunk_rows).bounds
    for r0, r1 in zip(bounds[:-1], bounds[1:]):
        e0, e1 = int(indptr[r0]), int(indptr[r1])
        out.append(
            torch.sparse_csr_tensor(
                torch.from_numpy(indptr[r0 : r1 + 1] - e0),
                torch.from_numpy(indices[e0:e1].astype(np.int64)),
                torch.from_numpy(values[e0:e1]),
                size=(r1 - r0, num_cols),
            ).to(device)
        )
    return out


class TypedOperator:
    """Every relation into one node type as ONE sparse matrix over (destination, relation) pairs (a typed CSR).

    Row p is a pair (v, r) with at least one in-edge of relation r at v (pairs sorted by v, then r); its columns are
    the sources in the global id space (every type's rows stacked in the store's order), its values the
    normalisation. ``op(h)`` with ``h`` [all nodes, slice] gives every pair's aggregated message [pairs, slice]: only
    the pairs that exist, so a type with many relations costs its edges, not rows x relations. The backward
    multiplies by the transpose (precomputed; relations are directed); both run in blocks of ``chunk_rows`` rows.
    """

    def __init__(
        self,
        rels: list[tuple[int, RelationData, np.ndarray]],
        num_dst: int,
        offsets: dict[str, int],
        num_nodes: int,
        chunk_rows: int,
        device: torch.device,
        stride: int = 0,
        bounds: tuple[list[int], list[int]] | None = None,
    ) -> None:
        """``stride`` > 0: relation i's sources are rows ``i * stride + global id`` of a stack of per-relation tables
        (``num_nodes`` columns in all); ``bounds``: the row blocks of the forward and the backward (a memory plan,
        ntp.engine.tasks.hetero.memory), instead of uniform blocks of ``chunk_rows``."""
        fwd_bounds, bwd_bounds = bounds or (None, None)
        k = max(len(rels), 1)
        keys, cols, vals = [], [], []
        for j, (_, r, scale) in enumerate(rels):
            deg = np.diff(np.asarray(r.indptr, np.int64))
            keys.append(np.repeat(np.arange(num_dst, dtype=np.int64), deg) * k + j)
            cols.append(np.asarray(r.indices, np.int64) + offsets[r.src] + rels[j][0] * stride)
            vals.append(np.repeat(scale, deg).astype(np.float32))
        key = np.concatenate(keys) if keys else np.zeros(0, np.int64)
        order = np.argsort(key, kind="stable")
        key, col = key[order], (np.concatenate(cols) if cols else key)[order]
        val = (np.concatenate(vals) if vals else np.zeros(0, np.float32))[order]
        pair_key, start = np.unique(key, return_index=True)
        indptr = np.append(start, len(key)).astype(np.int64)
        self.num_pairs, self.num_edges = len(pair_key), len(key)
        self.pair_dst = torch.from_numpy(pair_key // k)  #: destination row (local to the type) of each pair
        rel_ids = np.array([i for i, _, _ in rels] or [0], np.int64)
        self.pair_rel = torch.from_numpy(rel_ids[pair_key % k])  #: relation index of each pair
        self.forward_blocks = _blocks(indptr, col, val, num_nodes, chunk_rows, device, fwd_bounds)
        t_order = np.argsort(col, kind="stable")
        t_indptr = np.zeros(num_nodes + 1, np.int64)
        np.cumsum(np.bincount(col, minlength=num_nodes), out=t_indptr[1:])
        rows = np.repeat(np.arange(self.num_pairs, dtype=np.int64), np.diff(indptr))
        self.backward_blocks = _blocks(
            t_indptr, rows[t_order], val[t_order], self.num_pairs, chunk_rows, device, bwd_bounds
        )
        self.pair_dst, self.pair_rel = self.pair_dst.to(device), self.pair_rel.to(device)

    @staticmethod
    def _product(blocks: list[torch.Tensor], h: torch.Tensor) -> torch.Tensor:
        parts = [csr_matmul(b if b.dtype == h.dtype else b.to(h.dtype), h) for b in blocks]
        return parts[0] if len(parts) == 1 else torch.cat(parts)

    def __call__(self, h: torch.Tensor) -> torch.Tensor:
        return _TypedSpMM.apply(h, self)

    def pair_bounds(self, row_bounds: list[int]) -> list[int]:
        """Pairs owned by each rank: those whose destination row it owns."""
        return torch.searchsorted(self.pair_dst.cpu(), torch.tensor(row_bounds)).tolist()

    def nbytes(self) -> int:
        return sum(
            t.numel() * t.element_size()
            for b in self.forward_blocks + self.backward_blocks
            for t in (b.crow_indices(), b.col_indices(), b.values())
        )


class _TypedSpMM(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h: torch.Tensor, op: TypedOperator) -> torch.Tensor:
        ctx.op = op
        return op._product(op.forward_blocks, h)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return ctx.op._product(ctx.op.backward_blocks, grad.contiguous()), None


class RangePartition(Partition):
    """A partition of rows into given contiguous ranges (a type's pairs, by who owns their destination)."""

    def __init__(self, bounds: list[int], world: int, rank: int) -> None:
        super().__init__(bounds[-1], world, rank)
        self.row_bounds = list(bounds)
        self.padded_rows = max(max(b - a for a, b in zip(bounds[:-1], bounds[1:])), 1)


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

    def __init__(
        self,
        data: HeteroGraphData,
        comm: Comm,
        *,
        norm: str,
        chunk_rows: int,
        seed: int,
        plans: dict | None = None,
        precision: str = "fp32",
    ) -> None:
        """``plans``: every typed operator's row blocks (ntp.engine.tasks.hetero.memory.plan_operators), else uniform
        blocks of ``chunk_rows``; ``precision``: of the activations (ntp.engine.device.precision)."""
        self.comm, self.seed, self.step, self.precision = comm, seed, 0, precision
        self._plans = plans or {}
        self.types = list(data.counts)
        self.counts = dict(data.counts)
        self.comms = {}
        for t, n in data.counts.items():
            c = Comm(Partition(n, comm.world, comm.rank), comm.device, comm.group)
            c.stats = comm.stats
            self.comms[t] = c
        self.num_relations = len(data.relations)
        self.relations = [(r.src, r.dst) for r in data.relations]
        #: destination type -> indices of the relations into it
        self.into = {t: [i for i, r in enumerate(data.relations) if r.dst == t] for t in self.types}
        self.offsets = dict(zip(self.types, np.cumsum([0] + [data.counts[t] for t in self.types]).tolist()))
        scales = row_scales(data, norm)
        self._rels = {t: [(i, data.relations[i], scales[i]) for i in self.into[t]] for t in self.types}
        self._chunk_rows, self._relation_ops = chunk_rows, None
        self.ops = {
            t: TypedOperator(
                self._rels[t],
                data.counts[t],
                self.offsets,
                data.num_nodes,
                chunk_rows,
                comm.device,
                bounds=self._bounds("", t),
            )
            for t in self.types
        }
        self.pair_comms = {}
        for t, op in self.ops.items():
            c = Comm(
                RangePartition(op.pair_bounds(self.comms[t].part.row_bounds), comm.world, comm.rank),
                comm.device,
                comm.group,
            )
            c.stats = comm.stats
            self.pair_comms[t] = c
        chunks = max((len(op.forward_blocks) for op in self.ops.values()), default=1)
        chunks = max([chunks] + [p.num_chunks for p in self._plans.values()])
        self.plan = SimpleNamespace(num_chunks=chunks)
        self.memory, self.clock = PhaseMemory(comm.device), OverlapClock()
        self.overlapped, self.offload, self.nn_device = False, "none", comm.device
        self.topology = SimpleNamespace(nbytes=lambda: sum(op.nbytes() for op in self.ops.values()))

    @property
    def device(self) -> torch.device:
        return self.comm.device

    def relation_ops(self) -> dict[str, TypedOperator]:
        """Per type, the typed CSR over a stack of one table per relation (R-GCN's one-hot input layer)."""
        if self._relation_ops is None:
            n = sum(self.counts.values())
            self._relation_ops = {
                t: TypedOperator(
                    self._rels[t],
                    self.counts[t],
                    self.offsets,
                    n * self.num_relations,
                    self._chunk_rows,
                    self.device,
                    stride=n,
                    bounds=self._bounds("one-hot ", t),
                )
                for t in self.types
            }
        return self._relation_ops

    def _bounds(self, prefix: str, node_type: str) -> tuple[list[int], list[int]] | None:
        key = (prefix + "forward", node_type)
        if key not in self._plans:
            return None
        return self._plans[key].bounds, self._plans[prefix + "backward", node_type].bounds

    def own_pairs(self, node_type: str) -> tuple[torch.Tensor, torch.Tensor]:
        """(destination row local to this rank's rows, relation) of the pairs this rank owns."""
        op, (p0, p1) = self.ops[node_type], self.pair_comms[node_type].part.rows()
        return op.pair_dst[p0:p1] - self.row_offset(node_type), op.pair_rel[p0:p1]

    def row_offset(self, node_type: str) -> int:
        return self.comms[node_type].part.rows()[0]

    def device_topology_bytes(self) -> int:
        return self.topology.nbytes() if self.device.type == "cuda" else 0

    def reset_stats(self) -> None:
        self.memory.reset()
        self.clock.reset()
