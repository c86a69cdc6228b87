"""All collectives of the engine, in three layers (as in Megatron-LM's mappings.py):

1. :class:`Comm` primitives: one call each, timed, bytes counted, short-circuited when the world size is 1;
2. autograd Functions whose backward is the named opposite of their forward
   (split <-> gather, all-gather rows <-> reduce-scatter rows, all-reduce <-> all-reduce);
3. thin public wrappers.

Layouts (see ../shared/design/tensor-parallel.md): the row layout holds this rank's vertex rows with all columns;
the column layout holds every vertex row with this rank's column slice. Blocks are padded to equal sizes so that every
rank sends and receives exactly the same number of bytes; the padding never reaches results. Rows kept in host
memory (``--nn-device stream``) are exchanged in passes of a block of rows, so the device holds a pass's buffers,
not the matrix.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.distributed as dist

from ntp.engine.device.transfer import Downloads, layout_empty, put_rows, rows_on
from ntp.engine.distributed.partition import Partition
from ntp.engine.distributed.release import run_released
from ntp.engine.distributed.traffic import ALLREDUCE, GATHER, SPLIT, CommStats

#: ``put(dst, first_row, rows)``: writes rows into a matrix wherever it lies (ntp.engine.device.transfer.put_rows)
Put = Callable[[torch.Tensor, int, torch.Tensor], None]

# torch 2.13 renamed these two (the old names warn); older torch (2.11 on the lent GPU machines) has only the old.
_all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter_single = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor

#: Several CUDA ranks on one GPU, for tests only (ntp.engine.distributed.dist.SHARED_GPU_ENV): NCCL refuses two ranks
#: on one device, so their collectives run on gloo through host copies. Never chosen by default.
_host_staged = False


def stage_on_host(on: bool) -> None:
    """Run collectives of CUDA tensors through host copies (the shared-GPU test mode), or not."""
    global _host_staged
    _host_staged = on


class _Done:
    """The handle of a collective that already finished (a staged one runs synchronously)."""

    def wait(self) -> bool:
        return True


def _collective(op, out: torch.Tensor, *inputs: torch.Tensor, **kwargs):
    """``op(out, *inputs, **kwargs)`` (``out`` written in place); in the shared-GPU test mode, on host copies of
    CUDA tensors, copied back. An asynchronous call then runs at once and returns a finished handle. Host tensors are
    held by the caller alone once the call (or its handle's ``wait``) returns (ntp.engine.distributed.release)."""
    if not (_host_staged and out.is_cuda):
        return run_released(op, out, *inputs, **kwargs)
    host = out.cpu()
    asynchronous = kwargs.pop("async_op", False)
    run_released(op, host, *(t.cpu() for t in inputs), **kwargs)
    out.copy_(host)
    return _Done() if asynchronous else None


class Comm:
    """Collective primitives bound to one process group, with their time and bytes recorded in ``stats``."""

    def __init__(self, part: Partition, device: torch.device, group: dist.ProcessGroup | None = None) -> None:
        self.part = part
        self.device = device
        self.group = group
        self.stats = CommStats()

    @property
    def world(self) -> int:
        return self.part.world

    @property
    def rank(self) -> int:
        return self.part.rank

    # -- row layout <-> column layout -------------------------------------------------------------------------
    def rows_to_cols(self, x: torch.Tensor, kind: str = SPLIT) -> torch.Tensor:
        """[rows of this rank, width] -> [all rows, this rank's column slice]."""
        lay, m = self.part, self.world
        width = x.shape[1]
        if m == 1:
            return x
        self._check_rows(x)
        col_b = lay.col_bounds(width)
        rows_pad, cols_pad = lay.padded_rows, lay.padded_cols(width)
        send = x.new_zeros(m, rows_pad, cols_pad)
        for q in range(m):
            send[q, : x.shape[0], : col_b[q + 1] - col_b[q]] = x[:, col_b[q] : col_b[q + 1]]
        recv = self._all_to_all(send, kind)
        del send  # sent: not held beside the output
        c0, c1 = lay.cols(width)
        return torch.cat([recv[r, : lay.num_rows(r), : c1 - c0] for r in range(m)], dim=0)

    def cols_to_rows(self, y: torch.Tensor, width: int, kind: str = GATHER) -> torch.Tensor:
        """[all rows, this rank's column slice of ``width``] -> [rows of this rank, width]."""
        lay, m = self.part, self.world
        if m == 1:
            return y
        c0, c1 = lay.cols(width)
        self._check_cols(y, width)
        rows_pad, cols_pad = lay.padded_rows, lay.padded_cols(width)
        send = y.new_zeros(m, rows_pad, cols_pad)
        for r in range(m):
            r0, r1 = lay.rows(r)
            send[r, : r1 - r0, : c1 - c0] = y[r0:r1]
        recv = self._all_to_all(send, kind)
        del send  # sent: not held beside the output
        col_b = lay.col_bounds(width)
        n_own = lay.num_rows()
        return torch.cat([recv[q, :n_own, : col_b[q + 1] - col_b[q]] for q in range(m)], dim=1)

    # -- the same exchanges in passes of rows, for rows kept in host memory ----------------------------------------
    def passes(self, block_rows: int) -> list[tuple[int, int]]:
        """The ranges of padded rows that the passes of an exchange in blocks of ``block_rows`` rows move, the same on
        every rank (each pass moves rows ``a:b`` of every rank's row block)."""
        padded = self.part.padded_rows
        return [(a, min(a + block_rows, padded)) for a in range(0, padded, max(1, block_rows))]

    def rows_to_cols_in_passes(
        self, x: torch.Tensor, block_rows: int, to: torch.device, kind: str = SPLIT
    ) -> torch.Tensor:
        """:meth:`rows_to_cols` in passes of ``block_rows`` rows of every rank's row block (:meth:`passes`): ``x`` is
        read where it lies a pass at a time, each pass's buffers are on the communication device, and the column
        slice is written on ``to`` (in a GPU rank's host memory, column by column, as products take it). The same
        values and bytes as one pass; on one rank, a copy a block at a time."""
        self._check_rows(x)
        out = self.slice_empty(x.shape[1], x.dtype, to)
        with Downloads(self.device) as downloads:
            for a, b in self.passes(block_rows):
                self.split_pass(rows_on(x, a, min(b, x.shape[0]), self.device), a, b, out, kind, downloads.put_rows)
        return out

    def cols_to_rows_in_passes(
        self, y: torch.Tensor, width: int, block_rows: int, to: torch.device, kind: str = GATHER
    ) -> torch.Tensor:
        """:meth:`cols_to_rows` in passes of ``block_rows`` rows of every rank's row block, as
        :meth:`rows_to_cols_in_passes`: ``y`` read where it lies, the rows written on ``to``."""
        self._check_cols(y, width)
        out = layout_empty(self.part.num_rows(), width, y.dtype, to, self.device, columns=False)
        for a, b in self.passes(block_rows):
            put_rows(out, a, self.gather_pass(y, a, b, width, kind))
        return out

    def slice_empty(self, width: int, dtype: torch.dtype, to: torch.device) -> torch.Tensor:
        """An uninitialised column slice of a ``width``-column matrix on ``to``, as :meth:`split_pass` fills it."""
        c0, c1 = self.part.cols(width)
        return layout_empty(self.part.num_nodes, c1 - c0, dtype, to, self.device)

    def split_pass(
        self, block: torch.Tensor, a: int, b: int, out: torch.Tensor, kind: str = SPLIT, put: Put = put_rows
    ) -> None:
        """One pass of :meth:`rows_to_cols_in_passes` (``(a, b)`` one of :meth:`passes`): ``block`` holds this rank's
        rows ``a:a + len(block)`` (on the communication device; fewer than ``b - a`` at the end of its rows), and the
        column slice ``out`` receives every rank's rows of the pass, each written by ``put`` (a
        ntp.engine.device.transfer.Downloads's, so that none waits for its copy to host memory)."""
        lay, m = self.part, self.world
        if m == 1:
            put(out, a, block)
            return
        width = block.shape[1]
        col_b, (c0, c1) = lay.col_bounds(width), lay.cols(width)
        send = block.new_zeros(m, b - a, lay.padded_cols(width))
        for q in range(m):
            send[q, : block.shape[0], : col_b[q + 1] - col_b[q]] = block[:, col_b[q] : col_b[q + 1]]
        recv = self._all_to_all(send, kind)
        del send
        for r in range(m):
            r0, r1 = lay.rows(r)
            rows = min(b, r1 - r0) - a
            if rows > 0:
                put(out, r0 + a, recv[r, :rows, : c1 - c0])

    def gather_pass(self, y: torch.Tensor, a: int, b: int, width: int, kind: str = GATHER) -> torch.Tensor:
        """One pass of :meth:`cols_to_rows_in_passes`: this rank's rows ``a:b`` (fewer at the end of its rows) with
        all ``width`` columns, on the communication device, from every rank's column slice ``y`` (where it lies)."""
        lay, m = self.part, self.world
        n_own = lay.num_rows()
        if m == 1:
            return rows_on(y, a, min(b, n_own), self.device)
        c0, c1 = lay.cols(width)
        col_b = lay.col_bounds(width)
        send = torch.zeros(m, b - a, lay.padded_cols(width), dtype=y.dtype, device=self.device)
        for r in range(m):
            r0, r1 = lay.rows(r)
            rows = min(b, r1 - r0) - a
            if rows > 0:
                send[r, :rows, : c1 - c0] = rows_on(y, r0 + a, r0 + a + rows, self.device)
        recv = self._all_to_all(send, kind)
        del send
        rows = max(0, min(b, n_own) - a)
        return torch.cat([recv[q, :rows, : col_b[q + 1] - col_b[q]] for q in range(m)], dim=1)

    def _all_to_all(self, send: torch.Tensor, kind: str) -> torch.Tensor:
        recv = torch.empty_like(send)
        nbytes = send[0].numel() * send.element_size() * (self.world - 1)  # the block kept locally is not sent
        with self.stats.timed(kind, nbytes, nbytes, self.device):
            _collective(dist.all_to_all_single, recv, send.contiguous(), group=self.group)
        return recv

    # -- replicated small tensors ------------------------------------------------------------------------------
    def all_gather_rows(self, x: torch.Tensor, kind: str) -> torch.Tensor:
        """[rows of this rank, k] -> [all rows, k] on every rank."""
        lay, m = self.part, self.world
        if m == 1:
            return x
        self._check_rows(x)
        send = x.new_zeros(lay.padded_rows, *x.shape[1:])
        send[: x.shape[0]] = x
        recv = x.new_empty(m * lay.padded_rows, *x.shape[1:])
        nbytes = send.numel() * send.element_size() * (m - 1)
        with self.stats.timed(kind, nbytes, nbytes, self.device):
            _collective(_all_gather_single, recv, send, group=self.group)
        recv = recv.view(m, lay.padded_rows, *x.shape[1:])
        return torch.cat([recv[r, : lay.num_rows(r)] for r in range(m)], dim=0)

    def reduce_scatter_rows(self, g: torch.Tensor, kind: str) -> torch.Tensor:
        """[all rows, k] partial sums on every rank -> [rows of this rank, k] summed over ranks."""
        lay, m = self.part, self.world
        if m == 1:
            return g
        send = g.new_zeros(m, lay.padded_rows, *g.shape[1:])
        for r in range(m):
            r0, r1 = lay.rows(r)
            send[r, : r1 - r0] = g[r0:r1]
        recv = g.new_empty(lay.padded_rows, *g.shape[1:])
        nbytes = recv.numel() * recv.element_size() * (m - 1)
        with self.stats.timed(kind, nbytes, nbytes, self.device):
            _collective(_reduce_scatter_single, recv, send.view(m * lay.padded_rows, *g.shape[1:]), group=self.group)
        return recv[: lay.num_rows()]

    def all_reduce(self, x: torch.Tensor, kind: str = ALLREDUCE) -> torch.Tensor:
        """In-place sum over ranks (bytes counted as a ring all-reduce: 2 (m-1)/m of the buffer each way).

        ``x`` may live off the communication device (an NN stage on the CPU beside NCCL): it is staged there."""
        if self.world == 1:
            return x
        nbytes = 2 * (self.world - 1) * x.numel() * x.element_size() // self.world
        staged = x.to(self.device)
        with self.stats.timed(kind, nbytes, nbytes, self.device):
            _collective(dist.all_reduce, staged, group=self.group)
        if staged is not x:
            x.copy_(staged)
        return x

    def all_to_all_uneven(
        self,
        recv: torch.Tensor,
        send: torch.Tensor,
        out_splits: list[int],
        in_splits: list[int],
        *,
        async_op: bool = False,
    ) -> dist.Work | None:
        """All-to-all of flat blocks of different sizes (``in_splits[q]`` elements to rank ``q``). Untimed: callers
        time it, since with ``async_op`` only they know when it is waited for."""
        return _collective(
            dist.all_to_all_single,
            recv,
            send,
            output_split_sizes=out_splits,
            input_split_sizes=in_splits,
            group=self.group,
            async_op=async_op,
        )

    def _check_rows(self, x: torch.Tensor) -> None:
        if x.shape[0] != self.part.num_rows():
            raise RuntimeError(f"rank {self.rank}: row block has {x.shape[0]} rows, expected {self.part.num_rows()}")

    def _check_cols(self, y: torch.Tensor, width: int) -> None:
        c0, c1 = self.part.cols(width)
        if y.shape != (self.part.num_nodes, c1 - c0):
            raise RuntimeError(
                f"rank {self.rank}: column block has shape {tuple(y.shape)}, expected {(self.part.num_nodes, c1 - c0)}"
            )


# -- small Python objects and synchronisation (no autograd, no byte counting) -----------------------------------
def all_gather_objects(obj: object) -> list:
    """A small picklable object from every rank (records, signatures), in rank order; ``[obj]`` without a group."""
    if not dist.is_initialized():
        return [obj]
    out: list = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def check_same_on_all_ranks(what: str, value: object) -> None:
    """Fail fast, before any shape-dependent collective, if ranks disagree (e.g. different stores or configs)."""
    values = all_gather_objects(value)
    if any(v != values[0] for v in values):
        raise RuntimeError(f"ranks disagree on {what}: {values}; every rank must use the same store and options")


def barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


# -- autograd Functions: each backward is the named opposite of its forward ---------------------------------------
class _SplitRowsToCols(torch.autograd.Function):
    """``block_rows``: in passes (:meth:`Comm.rows_to_cols_in_passes`), the slice on ``to``, the gradient back where
    ``x`` lies."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, comm: Comm, kind: str, block_rows: int, to: torch.device) -> torch.Tensor:
        ctx.comm, ctx.width, ctx.kind, ctx.block_rows, ctx.source = comm, x.shape[1], kind, block_rows, x.device
        return comm.rows_to_cols_in_passes(x, block_rows, to, kind) if block_rows else comm.rows_to_cols(x, kind)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        comm, kind = ctx.comm, GATHER if ctx.kind == SPLIT else ctx.kind
        if ctx.block_rows:
            return (
                comm.cols_to_rows_in_passes(grad, ctx.width, ctx.block_rows, ctx.source, kind),
                None,
                None,
                None,
                None,
            )
        return comm.cols_to_rows(grad.contiguous(), ctx.width, kind), None, None, None, None


class _GatherColsToRows(torch.autograd.Function):
    """``block_rows``: in passes (:meth:`Comm.cols_to_rows_in_passes`), the rows on ``to``, the gradient back where
    ``y`` lies."""

    @staticmethod
    def forward(ctx, y: torch.Tensor, comm: Comm, width: int, kind: str, block_rows: int, to: torch.device):
        ctx.comm, ctx.kind, ctx.block_rows, ctx.source = comm, kind, block_rows, y.device
        if block_rows:
            return comm.cols_to_rows_in_passes(y, width, block_rows, to, kind)
        return comm.cols_to_rows(y, width, kind)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        comm, kind = ctx.comm, SPLIT if ctx.kind == GATHER else ctx.kind
        if ctx.block_rows:
            return comm.rows_to_cols_in_passes(grad, ctx.block_rows, ctx.source, kind), None, None, None, None, None
        return comm.rows_to_cols(grad.contiguous(), kind), None, None, None, None, None


class _AllGatherRows(torch.autograd.Function):
    """Forward: every rank gets all rows. Backward: gradients from all ranks are summed, each rank keeps its rows."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, comm: Comm, kind: str) -> torch.Tensor:
        ctx.comm, ctx.kind = comm, kind
        return comm.all_gather_rows(x, kind)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return ctx.comm.reduce_scatter_rows(grad.contiguous(), ctx.kind), None, None


class _ReduceScatterRows(torch.autograd.Function):
    """Forward: partial sums of all rows from every rank -> this rank's rows, summed. Backward: all-gather."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, comm: Comm, kind: str) -> torch.Tensor:
        ctx.comm, ctx.kind = comm, kind
        return comm.reduce_scatter_rows(x, kind)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return ctx.comm.all_gather_rows(grad.contiguous(), ctx.kind), None, None


class _AllReduceSum(torch.autograd.Function):
    """Sum over ranks; since every rank's loss depends on the sum, the backward is a sum too."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, comm: Comm, kind: str) -> torch.Tensor:
        ctx.comm, ctx.kind = comm, kind
        return comm.all_reduce(x.clone(), kind)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return ctx.comm.all_reduce(grad.contiguous().clone(), ctx.kind), None, None


# -- public wrappers ----------------------------------------------------------------------------------------------
def split(
    x: torch.Tensor, comm: Comm, kind: str = SPLIT, block_rows: int = 0, to: torch.device | None = None
) -> torch.Tensor:
    """Row layout -> column layout (one all-to-all; its backward is :func:`gather`). ``block_rows``: in passes of
    that many rows, ``x`` read where it lies and the slice written on ``to`` (default: ``x``'s device), on one rank
    too (a copy to ``to``)."""
    if comm.world == 1 and not block_rows:
        return x
    return _SplitRowsToCols.apply(x, comm, kind, block_rows, to or x.device)


def gather(
    y: torch.Tensor,
    comm: Comm,
    width: int,
    kind: str = GATHER,
    block_rows: int = 0,
    to: torch.device | None = None,
) -> torch.Tensor:
    """Column layout -> row layout (one all-to-all; its backward is :func:`split`). ``block_rows``: in passes of
    that many rows, ``y`` read where it lies and the rows written on ``to`` (default: ``y``'s device), on one rank
    too."""
    if comm.world == 1 and not block_rows:
        return y
    return _GatherColsToRows.apply(y, comm, width, kind, block_rows, to or y.device)


def all_gather_rows(x: torch.Tensor, comm: Comm, kind: str) -> torch.Tensor:
    return x if comm.world == 1 else _AllGatherRows.apply(x, comm, kind)


def reduce_scatter_rows(x: torch.Tensor, comm: Comm, kind: str) -> torch.Tensor:
    """Every rank's partial sums of all rows -> this rank's rows of the sum (its backward is :func:`all_gather_rows`)."""
    return x if comm.world == 1 else _ReduceScatterRows.apply(x, comm, kind)


def all_reduce_sum(x: torch.Tensor, comm: Comm, kind: str = ALLREDUCE) -> torch.Tensor:
    return x if comm.world == 1 else _AllReduceSum.apply(x.to(comm.device), comm, kind).to(x.device)


def all_reduce_gradients(params: list[torch.nn.Parameter], comm: Comm) -> None:
    """Sum replicated parameters' gradients over ranks in one flat buffer (the loss is already a global mean)."""
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    if comm.world == 1 or not grads:
        return
    # gradients on two devices (a link job's encoder on the host, its decoder on the GPU) meet on the comm's
    home = grads[0].device if len({g.device for g in grads}) == 1 else comm.device
    flat = torch.cat([g.reshape(-1).to(home) for g in grads])
    comm.all_reduce(flat)
    offset = 0
    for p, g in zip(params, grads):
        n = g.numel()
        p.grad = flat[offset : offset + n].view_as(p).to(p.device, copy=True)
        offset += n
