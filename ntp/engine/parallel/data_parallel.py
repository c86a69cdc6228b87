"""Data parallelism (vertex partition): the paper's baseline, behind the same GraphContext as tensor parallelism.

Each rank owns a contiguous range of vertex rows (the row layout of ntp.engine.distributed.partition) with all columns, so the graph
layout *is* the row layout: ``to_graph`` / ``from_graph`` are identities. To aggregate its own destination rows a
rank needs the rows of their in-neighbours that other ranks own (the *halo*): every ``propagate`` first fetches them
with one ``all_to_all_single`` of uneven split sizes, then multiplies its own row block of the operator, whose columns
are a local index space ``[own rows | halo rows]``. The backward sends the halo gradients back to their owners, who
add them into their rows. Halo bytes are counted under the comm kind ``halo``; they depend on the partition and grow
with the number of ranks (unlike tensor parallelism's balanced all-to-alls).

Every rank holds the whole topology, so the halo plan (who sends which rows to whom) is computed locally, without
communication, once per context.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import torch

from ntp.engine.device.transfer import moved
from ntp.engine.distributed.collectives import Comm
from ntp.engine.distributed.traffic import HALO
from ntp.engine.graph.aggregate import csr_matmul, weighted_matmul
from ntp.engine.graph.attention import edge_attention
from ntp.engine.graph.operators import CSR, operator_pattern, with_self_loops
from ntp.engine.memory.chunks import ChunkPlan
from ntp.engine.parallel.context import GraphContext


# -- the halo plan and its exchange ----------------------------------------------------------------------------------
@dataclass
class HaloPlan:
    """Which of this rank's rows go to which rank, and which rows arrive from which rank (in rank order)."""

    send_index: torch.Tensor  # local row ids to send, grouped by destination rank
    send_counts: list[int]  # rows sent to each rank
    halo_ids: torch.Tensor  # global ids of the received rows, sorted (so grouped by owner)
    recv_counts: list[int]  # rows received from each rank

    @property
    def num_halo(self) -> int:
        return int(self.halo_ids.shape[0])


def halo_plan(csr: CSR, bounds: list[int], rank: int) -> HaloPlan:
    """The halo plan of ``rank`` for in-neighbour aggregation over ``csr`` with row ranges ``bounds``."""
    world = len(bounds) - 1
    r0, r1 = bounds[rank], bounds[rank + 1]
    bounds_t = torch.tensor(bounds[1:-1], dtype=torch.int64)
    # receive: sources of own rows' in-edges that other ranks own
    src = csr.indices[int(csr.indptr[r0]) : int(csr.indptr[r1])]
    halo_ids = torch.unique(src[(src < r0) | (src >= r1)])
    recv_counts = torch.bincount(torch.bucketize(halo_ids, bounds_t, right=True), minlength=world).tolist()
    # send: own rows that are sources of other ranks' rows' in-edges (every rank can compute this from the topology)
    own_src = (csr.indices >= r0) & (csr.indices < r1)
    dst_owner = torch.bucketize(csr.edge_rows()[own_src], bounds_t, right=True)
    src_sel = csr.indices[own_src]
    other = dst_owner != rank
    keys = torch.unique(dst_owner[other] * csr.num_nodes + src_sel[other])  # sorted by (rank, source)
    send_counts = torch.bincount(keys // max(csr.num_nodes, 1), minlength=world).tolist()
    return HaloPlan(
        send_index=keys % max(csr.num_nodes, 1) - r0,
        send_counts=send_counts,
        halo_ids=halo_ids,
        recv_counts=recv_counts,
    )


def _exchange(comm: Comm, send: torch.Tensor, send_counts: list[int], recv_counts: list[int]) -> torch.Tensor:
    width = send.shape[1]
    recv = send.new_empty(sum(recv_counts), width)
    per_row = width * send.element_size()
    with comm.stats.timed(HALO, send.shape[0] * per_row, recv.shape[0] * per_row, comm.device):
        comm.all_to_all_uneven(recv, send.contiguous(), recv_counts, send_counts)
    return recv


class _HaloExchange(torch.autograd.Function):
    """Forward: own rows -> ``[own rows | halo rows]``. Backward: halo gradients go back and are added to their rows."""

    @staticmethod
    def forward(ctx, h: torch.Tensor, plan: HaloPlan, comm: Comm) -> torch.Tensor:
        ctx.plan, ctx.comm = plan, comm
        halo = _exchange(comm, h[plan.send_index], plan.send_counts, plan.recv_counts)
        return torch.cat([h, halo], dim=0)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        plan = ctx.plan
        n_own = grad.shape[0] - plan.num_halo
        back = _exchange(ctx.comm, grad[n_own:], plan.recv_counts, plan.send_counts)
        return grad[:n_own].clone().index_add_(0, plan.send_index, back), None, None


def with_halo(h: torch.Tensor, plan: HaloPlan, comm: Comm) -> torch.Tensor:
    return h if comm.world == 1 else _HaloExchange.apply(h.contiguous(), plan, comm)


# -- local operators: own destination rows x [own rows | halo rows] ----------------------------------------------------
def _local_block(pattern: CSR, r0: int, r1: int, plan: HaloPlan) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(indptr, local column ids, edge slice start) of the own-rows block of ``pattern``."""
    e0, e1 = int(pattern.indptr[r0]), int(pattern.indptr[r1])
    src = pattern.indices[e0:e1]
    own = (src >= r0) & (src < r1)
    cols = torch.where(own, src - r0, (r1 - r0) + torch.searchsorted(plan.halo_ids, src))
    return pattern.indptr[r0 : r1 + 1] - e0, cols, torch.tensor([e0, e1])


def _transpose_local(
    indptr: torch.Tensor, cols: torch.Tensor, n_cols: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    rows = torch.repeat_interleave(torch.arange(indptr.shape[0] - 1), indptr[1:] - indptr[:-1])
    perm = torch.argsort(cols, stable=True)
    t_indptr = torch.zeros(n_cols + 1, dtype=torch.int64)
    torch.cumsum(torch.bincount(cols, minlength=n_cols), 0, out=t_indptr[1:])
    return t_indptr, rows[perm], perm


class LocalOperator:
    """Own rows of a fixed sparse operator: ``A[own, own|halo] @ with_halo(h)``, backward through ``A^T``."""

    def __init__(self, pattern: CSR, values: torch.Tensor, plan: HaloPlan, comm: Comm) -> None:
        self.plan, self.comm = plan, comm
        r0, r1 = comm.part.rows()
        n_own, n_ext = r1 - r0, r1 - r0 + plan.num_halo
        indptr, cols, (e0, e1) = _local_block(pattern, r0, r1, plan)
        vals = values[int(e0) : int(e1)]
        t_indptr, t_cols, perm = _transpose_local(indptr, cols, n_ext)
        dev = comm.device
        self.forward_block = torch.sparse_csr_tensor(indptr.to(dev), cols.to(dev), vals.to(dev), size=(n_own, n_ext))
        self.backward_block = torch.sparse_csr_tensor(
            t_indptr.to(dev), t_cols.to(dev), vals[perm].to(dev), size=(n_ext, n_own)
        )
        self.nnz = int(e1 - e0)

    def __call__(self, h: torch.Tensor) -> torch.Tensor:
        return _LocalSpMM.apply(with_halo(h, self.plan, self.comm), self)


class _LocalSpMM(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h_ext: torch.Tensor, op: LocalOperator) -> torch.Tensor:
        ctx.op = op
        return csr_matmul(op.forward_block, h_ext)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return csr_matmul(ctx.op.backward_block, grad.contiguous()), None


class LocalAttentionTopology:
    """In-edges (plus self-loops) of own destination rows, for attention.

    ``src`` are GLOBAL vertex ids (the model's all-gathered per-vertex scores are looked up with them);
    :meth:`attention` normalises over own destination rows; :meth:`matmul` fetches the halo and multiplies locally."""

    def __init__(self, pattern: CSR, plan: HaloPlan, comm: Comm) -> None:
        self.plan, self.comm = plan, comm
        dev = comm.device
        r0, r1 = comm.part.rows()
        self.num_rows, self.num_ext = r1 - r0, r1 - r0 + plan.num_halo
        indptr, cols, (e0, e1) = _local_block(pattern, r0, r1, plan)
        self.src = pattern.indices[int(e0) : int(e1)].to(dev)
        self.own_rows = slice(r0, r1)
        self.indptr, self.cols = indptr.to(dev), cols.to(dev)
        self.row_offsets = indptr.to(dev, torch.int64)
        t_indptr, t_cols, perm = _transpose_local(indptr, cols, self.num_ext)
        self.t_indptr, self.t_cols, self.perm = t_indptr.to(dev), t_cols.to(dev), perm.to(dev)
        self.bounds, self.t_bounds = [0, self.num_rows], [0, self.num_ext]  # one block each (no chunking here)
        self.phases = None

    def attention(self, src_scores: torch.Tensor, dst_scores: torch.Tensor, slope: float) -> torch.Tensor:
        """GAT's weights [E_own, heads] of own rows' in-edges, from every vertex's scores [N, heads]."""
        return edge_attention(src_scores, dst_scores[self.own_rows], self.src, self.row_offsets, slope)

    def matmul(self, values: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        return weighted_matmul(values, with_halo(h, self.plan, self.comm), self)


# -- the context ------------------------------------------------------------------------------------------------------
class DataParallelContext(GraphContext):
    """GraphContext of ``--mode data``: the graph layout is the row layout; propagation exchanges halo rows."""

    supports_overlap = False

    @cached_property
    def plan(self) -> ChunkPlan:  # type: ignore[override]
        """One block of the rank's own rows: data parallelism never chunks its aggregation (its records say 1)."""
        return ChunkPlan([0, self.topology.num_nodes], "data parallel: one block per rank")

    def to_graph(self, z: torch.Tensor) -> torch.Tensor:
        return moved(z, self.device)

    def from_graph(self, h: torch.Tensor, width: int) -> torch.Tensor:
        return moved(h, self.nn_device)

    def graph_cols(self, width: int) -> tuple[int, int]:
        return 0, width

    @cached_property
    def halo(self) -> HaloPlan:
        # Self-loops added or removed by the operators only touch own rows, so one plan serves every operator.
        return halo_plan(self.csr, self.comm.part.row_bounds, self.comm.rank)

    def operator(self, name: str) -> LocalOperator:  # type: ignore[override]
        if name not in self._operators:
            self._operators[name] = LocalOperator(*operator_pattern(self.csr, name), self.halo, self.comm)
        return self._operators[name]

    @cached_property
    def attention_topology(self) -> LocalAttentionTopology:  # type: ignore[override]
        return LocalAttentionTopology(with_self_loops(self.csr), self.halo, self.comm)
