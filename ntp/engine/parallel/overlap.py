"""Inter-chunk pipelining for tensor parallelism (../shared/design/tensor-parallel.md, "Inter-chunk pipelining").

Unpipelined, propagation is ``gather(A^K split(Z))``: one all-to-all moves all of ``Z`` before any aggregation
starts, and the gather starts after the last aggregation ends. Pipelined, the first propagation step is fused with
the split and the last with the gather, chunk by chunk (the chunks of ntp.engine.memory.chunks):

- :func:`split_propagate`: for chunk ``j`` only the source rows that no earlier chunk needed are sent (each row
  once, with the receiver's column slice); the all-to-all of chunk ``j+1`` is in flight while chunk ``j``
  aggregates. Rows no chunk needs arrive last (APPNP's teleport term still needs every row of ``Z``).
- :func:`propagate_gather`: chunk ``j``'s output rows are sent to their owners as soon as they are computed, while
  chunk ``j+1`` aggregates.
- :func:`split_propagate_gather`: both in one loop, for a single propagation step (a coupled layer, or K = 1);
  rows no chunk needs are never sent.

The first two are each other's backward with ``A^T`` in place of ``A``: the backward of ``split_propagate``
aggregates ``A^T g`` chunk by chunk and gathers it; the backward of ``propagate_gather`` splits ``g`` with the
source schedule of ``A^T``. The backward of ``split_propagate_gather`` is itself over ``A^T``. Collectives are
``all_to_all_single(..., async_op=True)`` with exact (unpadded) split sizes; bytes are counted as sent under the
kinds ``split`` and ``gather``. Results equal the unpipelined path: every output row is
the same row-by-row product over the same values.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ntp.engine.device.measure import OverlapClock, PhaseMemory, in_phase, now
from ntp.engine.device.transfer import moved
from ntp.engine.distributed.collectives import Comm
from ntp.engine.distributed.traffic import GATHER, SPLIT
from ntp.engine.graph.aggregate import ScaledBlocks, SparseOperator
from ntp.engine.memory.chunks import ChunkPlan, SourceSchedule, source_schedule


@dataclass
class _Exchange:
    """Per chunk of a split schedule: the new sources, how many each rank owns, and this rank's share (local ids)."""

    sources: torch.Tensor  # sorted global ids (so grouped by owner), on the rank's device
    counts: list[int]  # rows owned by each rank
    mine: torch.Tensor  # local row ids of this rank's share, on the communication device


def _exchanges(schedule: SourceSchedule, comm: Comm) -> list[_Exchange]:
    lay = comm.part
    inner = torch.tensor(lay.row_bounds[1:-1], dtype=torch.int64)
    r0, r1 = lay.rows()
    out = []
    for src in schedule.new_sources:
        counts = torch.bincount(torch.bucketize(src, inner, right=True), minlength=comm.world).tolist()
        mine = src[(src >= r0) & (src < r1)] - r0
        out.append(_Exchange(src.to(comm.device), counts, mine.to(comm.device)))
    return out


class OverlappedOperator:
    """A :class:`SparseOperator` with the per-chunk exchanges of its pipelined split (for ``A``) and of the split in
    its backward (for ``A^T``), computed once from the topology, identical in shape on every rank."""

    def __init__(
        self,
        op: SparseOperator,
        comm: Comm,
        clock: OverlapClock,
        phases: PhaseMemory | None = None,
        send_once: bool = True,
        home: torch.device | None = None,
    ) -> None:
        self.op, self.comm, self.clock, self.phases = op, comm, clock, phases
        #: where the column layout lives between products (host memory with offloaded embeddings); the loops below
        #: build it on the rank's device and move it there at the end
        self.home = home or comm.device
        plan = ChunkPlan(op.bounds)
        fwd, bwd = (
            source_schedule(b.indptr, b.indices, plan, send_once, own_rows=op.has_diagonal)
            for b in (op.forward_blocks, op.backward_blocks)
        )
        self.forward_exchanges = _exchanges(fwd, comm)
        self.backward_exchanges = _exchanges(bwd, comm)
        # rows of each chunk owned by each rank (the gather side)
        self.chunk_owner_rows = [_intersections(a, b, comm.part.row_bounds) for a, b in plan.ranges()]


def _intersections(a: int, b: int, row_bounds: list[int]) -> list[tuple[int, int]]:
    return [
        (max(a, lo), min(b, hi)) if max(a, lo) < min(b, hi) else (0, 0)
        for lo, hi in zip(row_bounds[:-1], row_bounds[1:])
    ]


# -- asynchronous all-to-alls, timed and counted ----------------------------------------------------------------------
class _InFlight:
    def __init__(
        self,
        comm: Comm,
        clock: OverlapClock,
        kind: str,
        recv: torch.Tensor,
        send: torch.Tensor,
        out_splits: list[int],
        in_splits: list[int],
    ) -> None:
        self.comm, self.clock, self.kind, self.recv = comm, clock, kind, recv
        rank, size = comm.rank, recv.element_size()
        self.sent = (sum(in_splits) - in_splits[rank]) * size  # the block kept locally is not sent
        self.received = (sum(out_splits) - out_splits[rank]) * size
        self.done_at: list[float] = []
        t0 = now()
        self.work = comm.all_to_all_uneven(recv, send, out_splits, in_splits, async_op=True)
        self.issued = now()
        self.issue_s = self.issued - t0
        try:  # completion time, where the backend reports it
            self.work.get_future().then(lambda _f: self.done_at.append(now()))
        except (RuntimeError, AttributeError):
            pass

    def wait(self) -> torch.Tensor:
        t0 = now()
        self.work.wait()
        t1 = now()
        finished = min(self.done_at[0], t0) if self.done_at else t0
        self.clock.overlap_s += max(0.0, finished - self.issued)  # in flight while this rank computed
        self.clock.async_calls += 1
        self.comm.stats.add(self.kind, self.issue_s + (t1 - t0), self.sent, self.received)  # exposed time only
        return self.recv


def _start_split(
    comm: Comm, clock: OverlapClock, x_rows: torch.Tensor, ex: _Exchange, col_b: list[int], kind: str
) -> _InFlight | None:
    if ex.sources.numel() == 0:  # every rank knows: nothing to exchange for this chunk
        return None
    m, r = comm.world, comm.rank
    widths = [col_b[q + 1] - col_b[q] for q in range(m)]
    in_splits = [ex.counts[r] * widths[q] for q in range(m)]
    send = x_rows.new_empty(sum(in_splits))
    for q, block in enumerate(send.split(in_splits)):  # one copy: this rank's new rows, rank q's columns
        torch.index_select(x_rows[:, col_b[q] : col_b[q + 1]], 0, ex.mine, out=block.view(ex.counts[r], widths[q]))
    out_splits = [ex.counts[q] * widths[r] for q in range(m)]
    recv = x_rows.new_empty(sum(out_splits))
    return _InFlight(comm, clock, kind, recv, send, out_splits, in_splits)


def _place_split(zc: torch.Tensor, ex: _Exchange, flight: _InFlight | None) -> None:
    if flight is not None:  # sources sorted: rank order = id order
        zc[ex.sources] = flight.wait().view(-1, zc.shape[1])


def _column_buffer(pop: OverlappedOperator, x_rows: torch.Tensor) -> tuple[list[int], torch.Tensor]:
    """The column bounds of ``x_rows``' width and a zeroed column-layout buffer on the rank's device that the split
    fills chunk by chunk."""
    lay = pop.comm.part
    c0, c1 = lay.cols(x_rows.shape[1])
    return lay.col_bounds(x_rows.shape[1]), x_rows.new_zeros(lay.num_nodes, c1 - c0, device=pop.comm.device)


def split_then_apply(
    pop: OverlappedOperator, x_rows: torch.Tensor, blocks: ScaledBlocks, exchanges: list[_Exchange], kind: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(M @ split(x), split(x))`` with the split issued chunk by chunk, one chunk ahead of the aggregation."""
    comm, clock = pop.comm, pop.clock
    x_rows = x_rows.contiguous()
    col_b, zc = _column_buffer(pop, x_rows)
    out = torch.empty_like(zc)
    with in_phase(pop.phases):  # one phase for the whole loop: switching phases resets memory counters (slow)
        pending = _start_split(comm, clock, x_rows, exchanges[0], col_b, kind)
        for j, (r0, r1, apply) in enumerate(blocks):
            ahead = _start_split(comm, clock, x_rows, exchanges[j + 1], col_b, kind)  # j + 1 may be the remainder
            _place_split(zc, exchanges[j], pending)
            apply(zc, out[r0:r1])
            pending = ahead
        _place_split(zc, exchanges[-1], pending)
    return moved(out, pop.home), moved(zc, pop.home)


class _Gathers:
    """Chunk outputs sent to their owners (the row layout): chunk ``j``'s all-to-all is in flight while the next chunk
    computes, and is placed into ``out_rows`` when the next one is sent (or at :meth:`finish`)."""

    def __init__(self, pop: OverlappedOperator, width: int, kind: str, dtype: torch.dtype) -> None:
        self.pop, self.kind = pop, kind
        comm = pop.comm
        self.col_b = comm.part.col_bounds(width)
        self.widths = [self.col_b[q + 1] - self.col_b[q] for q in range(comm.world)]
        self.own0 = comm.part.rows()[0]
        self.out_rows = torch.empty(comm.part.num_rows(), width, dtype=dtype, device=comm.device)
        self.pending: tuple[int, _InFlight] | None = None

    def send(self, j: int, y: torch.Tensor) -> None:
        comm, r = self.pop.comm, self.pop.comm.rank
        owners = self.pop.chunk_owner_rows[j]
        send = y.contiguous().view(-1).to(comm.device)  # owners' row ranges tile the chunk in rank order
        in_splits = [(b - a) * self.widths[r] for a, b in owners]
        a_r, b_r = owners[r]
        out_splits = [(b_r - a_r) * w for w in self.widths]
        flight = _InFlight(
            comm, self.pop.clock, self.kind, send.new_empty(sum(out_splits)), send, out_splits, in_splits
        )
        self._place_pending()
        self.pending = (j, flight)

    def finish(self) -> torch.Tensor:
        self._place_pending()
        return self.out_rows

    def _place_pending(self) -> None:
        if self.pending is None:
            return
        j, flight = self.pending
        self.pending = None
        a, b = self.pop.chunk_owner_rows[j][self.pop.comm.rank]
        parts = flight.wait().split([(b - a) * w for w in self.widths])
        if b > a:
            for q, part in enumerate(parts):
                self.out_rows[a - self.own0 : b - self.own0, self.col_b[q] : self.col_b[q + 1]] = part.view(b - a, -1)


def apply_then_gather(
    pop: OverlappedOperator,
    h_cols: torch.Tensor,
    blocks: ScaledBlocks,
    width: int,
    extra: torch.Tensor | None,
    kind: str,
) -> torch.Tensor:
    """``gather(M @ h + extra)`` with each chunk's rows sent to their owners while the next chunk aggregates."""
    gathers = _Gathers(pop, width, kind, h_cols.dtype)
    h_cols = h_cols.contiguous().to(pop.comm.device)  # offloaded embeddings: one copy of the slice for the loop
    extra = None if extra is None else extra.to(pop.comm.device)
    with in_phase(pop.phases):  # one phase for the whole loop (see split_then_apply)
        for j, (r0, r1, apply) in enumerate(blocks):
            y = apply(h_cols)
            gathers.send(j, y if extra is None else y.add_(extra[r0:r1]))  # y is this chunk's fresh product
    return gathers.finish()


def split_apply_gather(
    pop: OverlappedOperator, x_rows: torch.Tensor, blocks: ScaledBlocks, exchanges: list[_Exchange], width: int
) -> torch.Tensor:
    """``gather(M @ split(x))``: per chunk, its new source rows arrive (issued one chunk ahead), it aggregates, and
    its output rows leave while the next chunk aggregates. Rows no chunk needs are never sent."""
    comm = pop.comm
    x_rows = x_rows.contiguous()
    col_b, zc = _column_buffer(pop, x_rows)
    gathers = _Gathers(pop, width, GATHER, x_rows.dtype)
    last = len(blocks) - 1
    with in_phase(pop.phases):
        pending = _start_split(comm, pop.clock, x_rows, exchanges[0], col_b, SPLIT)
        for j, (r0, r1, apply) in enumerate(blocks):
            ahead = _start_split(comm, pop.clock, x_rows, exchanges[j + 1], col_b, SPLIT) if j < last else None
            _place_split(zc, exchanges[j], pending)
            gathers.send(j, apply(zc))
            pending = ahead
    return gathers.finish()


# -- autograd: each backward is the other's forward over A^T ------------------------------------------------------------
class _SplitPropagate(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x_rows: torch.Tensor, pop: OverlappedOperator):
        ctx.pop, ctx.width = pop, x_rows.shape[1]
        ctx.set_materialize_grads(False)
        return split_then_apply(pop, x_rows, pop.op.forward, pop.forward_exchanges, SPLIT)

    @staticmethod
    def backward(ctx, g_out: torch.Tensor | None, g_zc: torch.Tensor | None):
        pop = ctx.pop
        if g_out is None:
            g_out = torch.zeros_like(g_zc)
        extra = None if g_zc is None else g_zc.contiguous()
        return apply_then_gather(pop, g_out.contiguous(), pop.op.backward, ctx.width, extra, GATHER), None


class _PropagateGather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h_cols: torch.Tensor, pop: OverlappedOperator, width: int):
        ctx.pop = pop
        return apply_then_gather(pop, h_cols, pop.op.forward, width, None, GATHER)

    @staticmethod
    def backward(ctx, g_rows: torch.Tensor):
        pop = ctx.pop
        out, _ = split_then_apply(pop, g_rows.contiguous(), pop.op.backward, pop.backward_exchanges, SPLIT)
        return out, None, None


class _SplitPropagateGather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x_rows: torch.Tensor, pop: OverlappedOperator):
        ctx.pop, ctx.width = pop, x_rows.shape[1]
        return split_apply_gather(pop, x_rows, pop.op.forward, pop.forward_exchanges, ctx.width)

    @staticmethod
    def backward(ctx, g_rows: torch.Tensor):
        pop = ctx.pop
        return split_apply_gather(pop, g_rows.contiguous(), pop.op.backward, pop.backward_exchanges, ctx.width), None


def split_propagate_gather(x_rows: torch.Tensor, pop: OverlappedOperator) -> torch.Tensor:
    """``gather(A @ split(x))``: one propagation step with both collectives pipelined (a coupled layer, K = 1)."""
    return _SplitPropagateGather.apply(x_rows, pop)


def split_propagate(x_rows: torch.Tensor, pop: OverlappedOperator) -> tuple[torch.Tensor, torch.Tensor]:
    """``(A @ split(x), split(x))``: the split pipelined with the first propagation step."""
    return _SplitPropagate.apply(x_rows, pop)


def propagate_gather(h_cols: torch.Tensor, pop: OverlappedOperator, width: int) -> torch.Tensor:
    """``gather(A @ h)``: the last propagation step pipelined with the gather."""
    return _PropagateGather.apply(h_cols, pop, width)
