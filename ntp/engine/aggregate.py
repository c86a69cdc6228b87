"""Graph kernels: CSR sparse-dense products with exact, transpose-based backward passes.

All graph aggregation of the engine goes through this module, so a faster kernel (a custom CPU kernel, Triton on
GPU) can replace :func:`csr_matmul` and :func:`edge_dot` without touching the models.

Conventions: ``A`` is stored as CSR over in-edges; row ``v`` lists the sources ``u`` of edges ``u -> v`` and
``(A @ H)[v] = sum_u A[v, u] H[u]``. The backward of ``A @ H`` is ``A^T @ G`` (never ``A @ G``: graphs may be
directed), computed with a precomputed CSR of ``A^T``. Gradients never flow into fixed sparse values.
Products run row block by row block (the chunks of ntp.engine.chunking), so the memory of one product can be bounded.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
import torch

from ntp.engine.chunking import in_phase

# torch flags every CSR tensor as "beta" and notes that invariant checks are off; both are expected here.
warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta state")
warnings.filterwarnings("ignore", message="Sparse invariant checks are implicitly disabled")


# -- the kernel interface -----------------------------------------------------------------------------------------
def csr_matmul(block: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    """``block @ h`` for a torch sparse CSR ``block`` and a dense ``h``."""
    return torch.sparse.mm(block, h) if h.shape[1] else h.new_zeros(block.shape[0], 0)


def edge_dot(indptr: torch.Tensor, indices: torch.Tensor, g: torch.Tensor, h: torch.Tensor,
             bounds: list[int] | None = None) -> torch.Tensor:
    """``out[e] = <g[row(e)], h[indices[e]]>`` for every edge ``e`` of a CSR (an SDDMM), row block by row block.

    This is the gradient of ``A(values) @ h`` with respect to the edge values."""
    out = g.new_empty(indices.shape[0])
    if g.shape[1] == 0:
        return out.zero_()
    b = bounds or [0, indptr.shape[0] - 1]
    for r0, r1 in zip(b[:-1], b[1:]):
        e0, e1 = int(indptr[r0]), int(indptr[r1])
        pattern = torch.sparse_csr_tensor(indptr[r0 : r1 + 1] - e0, indices[e0:e1], g.new_zeros(e1 - e0),
                                          size=(r1 - r0, h.shape[0]))
        out[e0:e1] = torch.sparse.sampled_addmm(pattern, g[r0:r1], h.t(), beta=0.0).values()
    return out


def edge_softmax(logits: torch.Tensor, dst: torch.Tensor, num_rows: int) -> torch.Tensor:
    """Softmax of per-edge ``logits`` [E, heads] over the edges of each destination row ``dst[e]``."""
    heads = logits.shape[1]
    index = dst.unsqueeze(1).expand(-1, heads)
    peak = torch.full((num_rows, heads), float("-inf"), dtype=logits.dtype, device=logits.device)
    peak = peak.scatter_reduce(0, index, logits.detach(), reduce="amax", include_self=True)
    ex = (logits - peak[dst]).exp()  # shifting by a constant leaves softmax and its gradient unchanged
    denom = torch.zeros((num_rows, heads), dtype=logits.dtype, device=logits.device).index_add(0, dst, ex)
    return ex / denom[dst]


# -- topology -------------------------------------------------------------------------------------------------------
@dataclass
class CSR:
    """A square CSR matrix over in-edges (int64 index tensors), optionally with the CSR of its transpose."""

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
        return CSR(torch.from_numpy(np.asarray(indptr, dtype=np.int64)),
                   torch.from_numpy(np.asarray(indices, dtype=np.int64)), len(indptr) - 1)


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
    all_cols = torch.cat([csr.indices[keep], torch.arange(n)])
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


# -- operators ------------------------------------------------------------------------------------------------------
def uniform_bounds(n: int, chunk_rows: int) -> list[int]:
    """Row boundaries of chunks of ``chunk_rows`` rows (0: one chunk)."""
    if chunk_rows <= 0 or chunk_rows >= n:
        return [0, n]
    return list(range(0, n, chunk_rows)) + [n]


class RowBlocks:
    """The row blocks of one CSR matrix cut at ``bounds``, applied chunk by chunk on ``device``.

    ``offload`` says what stays in host memory (pinned on CUDA):

    - ``"none"``: every block lives on the device;
    - ``"topology"``: blocks are copied to the device when needed; on CUDA the next block's copy runs on a separate
      stream while the current block computes;
    - ``"all"``: as ``"topology"``, and the dense input ``h`` stays in host memory too: each chunk's columns are
      renumbered to the chunk's own sources, only those rows of ``h`` are copied to the device, and the output rows
      come back to ``h``'s memory (on CUDA the next chunk's rows are copied on the side stream too, when ``h`` is
      complete before the loop). The device then holds one chunk's working set (edges, gathered source rows,
      output rows): what ntp.engine.chunking's memory budget counts.

    On CPU the three forms compute the same products with the same kernel; only where the inputs come from differs.
    """

    def __init__(self, indptr: torch.Tensor, indices: torch.Tensor, values: torch.Tensor, num_cols: int,
                 bounds: list[int], device: torch.device, offload: str = "none") -> None:
        self.bounds, self.num_cols, self.device, self.offload = list(bounds), num_cols, device, offload
        self.num_rows = bounds[-1]
        self.gathers_rows = offload == "all"
        self.sources: list[torch.Tensor] = []  # per chunk (offload "all"): the chunk's source ids, sorted
        parts = []
        for r0, r1 in self.ranges():
            e0, e1 = int(indptr[r0]), int(indptr[r1])
            cols = indices[e0:e1]
            if self.gathers_rows:
                src, cols = torch.unique(cols, return_inverse=True)
                self.sources.append(src)
            parts.append((indptr[r0 : r1 + 1] - e0, cols, values[e0:e1]))
        if offload == "none":
            self._parts = [tuple(t.to(device) for t in p) for p in parts]
        elif device.type == "cuda":
            self._parts = [tuple(t.contiguous().pin_memory() for t in p) for p in parts]
        else:
            self._parts = parts

    def ranges(self) -> list[tuple[int, int]]:
        return list(zip(self.bounds[:-1], self.bounds[1:]))

    def __len__(self) -> int:
        return len(self.bounds) - 1

    def __iter__(self):
        return self.chunks()

    def chunks(self, rows_from: torch.Tensor | None = None):
        """``(r0, r1, apply)`` for every chunk, in order; ``apply(h)`` is the chunk's rows of ``M @ h``, returned
        in ``h``'s memory. The chunk's topology is on the device when it is yielded (streamed when offloaded).

        ``rows_from``: the input, when it is complete before the loop starts (pipelining fills it during the loop):
        on CUDA with ``offload="all"`` the next chunk's source rows are then copied on the side stream too."""
        streamed = self.offload != "none" and self.device.type == "cuda"
        parts = self._stream_cuda(rows_from if self.gathers_rows else None) if streamed else iter(self._parts)
        for j, ((r0, r1), part) in enumerate(zip(self.ranges(), parts)):
            yield r0, r1, lambda h, part=part, j=j, rows=r1 - r0: self._apply(part, j, rows, h)

    def _apply(self, part: tuple[torch.Tensor, ...], j: int, rows: int, h: torch.Tensor) -> torch.Tensor:
        crow, col, val, *prefetched = part
        if prefetched:
            x = prefetched[0]
        elif self.gathers_rows:
            src = self.sources[j]
            x = h.index_select(0, src if src.device == h.device else src.to(h.device))
            if x.device != self.device:
                x = (x.pin_memory() if self.device.type == "cuda" else x).to(self.device, non_blocking=True)
        else:
            x = h
        y = csr_matmul(torch.sparse_csr_tensor(crow, col, val, size=(rows, x.shape[0])), x)
        return y if y.device == h.device else y.to(h.device)

    def _stream_cuda(self, rows_from: torch.Tensor | None):  # its loop is tested with no-op streams; overlap needs a GPU
        copy_stream = torch.cuda.Stream(self.device)
        compute_stream = torch.cuda.current_stream(self.device)

        def prefetch(j: int):
            host = self._parts[j]
            if rows_from is not None:  # this chunk's source rows, gathered (into pinned memory when on the host)
                rows = rows_from.index_select(0, self.sources[j].to(rows_from.device))
                host = host + (rows.pin_memory() if rows.device.type == "cpu" else rows,)
            copy_stream.wait_stream(compute_stream)  # never overwrite memory the compute stream still reads
            with torch.cuda.stream(copy_stream):
                tensors = tuple(t.to(self.device, non_blocking=True) for t in host)
                done = torch.cuda.Event()
                done.record(copy_stream)
            return tensors, done

        pending = prefetch(0) if len(self) else None
        for j in range(len(self)):
            tensors, done = pending
            compute_stream.wait_event(done)
            for t in tensors:
                t.record_stream(compute_stream)  # allocated on the copy stream, used on the compute stream
            pending = prefetch(j + 1) if j + 1 < len(self) else None
            yield tensors

    def matmul(self, h: torch.Tensor) -> torch.Tensor:
        """``M @ h``, chunk by chunk, into one preallocated output in ``h``'s memory (never a concatenation)."""
        if len(self) == 1:
            (_, _, apply), = self.chunks(rows_from=h)
            return apply(h)
        out = h.new_empty(self.num_rows, h.shape[1])
        for r0, r1, apply in self.chunks(rows_from=h):
            out[r0:r1] = apply(h)
        return out


class SparseOperator:
    """A fixed sparse matrix ``A`` (values carry no gradient); :meth:`__call__` is ``A @ h`` with backward ``A^T @ g``.

    Both products run over the chunks of ``bounds`` (destination rows of ``A``; source rows of ``A^T``): one chunk
    by default, ``chunk_rows`` rows each, or any boundaries from a chunk plan (ntp.engine.chunking)."""

    def __init__(self, pattern: CSR, values: torch.Tensor, chunk_rows: int = 0, device: torch.device | None = None,
                 *, bounds: list[int] | None = None, offload: str = "none") -> None:
        device = device or torch.device("cpu")
        self.num_nodes = pattern.num_nodes
        self.nnz = pattern.num_edges
        self.bounds = list(bounds) if bounds is not None else uniform_bounds(pattern.num_nodes, chunk_rows)
        self.chunk_rows = chunk_rows
        t, perm = transpose(pattern)
        n = pattern.num_nodes
        #: kept for schedules that need the pattern (ntp.engine.overlap: which sources each chunk needs)
        self.pattern, self.transposed = pattern, t
        self.phases = None  #: a ntp.engine.chunking.PhaseMemory, set by the context that records peak memory per phase
        self.forward_blocks = RowBlocks(pattern.indptr, pattern.indices, values, n, self.bounds, device, offload)
        self.backward_blocks = RowBlocks(t.indptr, t.indices, values[perm], n, self.bounds, device, offload)

    @property
    def num_chunks(self) -> int:
        return len(self.bounds) - 1

    def __call__(self, h: torch.Tensor) -> torch.Tensor:
        return _FixedSpMM.apply(h, self)


class _FixedSpMM(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h: torch.Tensor, op: SparseOperator) -> torch.Tensor:
        ctx.op = op
        with in_phase(op.phases):
            return op.forward_blocks.matmul(h)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        with in_phase(ctx.op.phases):
            return ctx.op.backward_blocks.matmul(grad.contiguous()), None


class EdgeWeightedTopology:
    """A pattern whose edge values are computed (attention): ``A(values) @ h`` with gradients for both.

    What :func:`weighted_matmul` reads: the CSR ``indptr``/``cols`` of ``A``, the CSR ``t_indptr``/``t_cols`` of
    ``A^T`` with ``perm`` mapping its edges to ``A``'s, and the row-block ``bounds`` / ``t_bounds`` of each."""

    def __init__(self, pattern: CSR, device: torch.device | None = None, bounds: list[int] | None = None) -> None:
        self.device = device or torch.device("cpu")
        self.bounds = list(bounds) if bounds is not None else [0, pattern.num_nodes]
        self.t_bounds = self.bounds  # square: the same boundaries cut A^T
        self.phases = None  #: a ntp.engine.chunking.PhaseMemory (peak memory per phase), set by the context
        self.pattern = pattern
        self.num_nodes = pattern.num_nodes
        t, perm = transpose(pattern)
        self.indptr = pattern.indptr.to(self.device)
        self.src = self.cols = pattern.indices.to(self.device)
        self.dst = pattern.edge_rows().to(self.device)
        self.t_indptr, self.t_cols, self.perm = t.indptr.to(self.device), t.indices.to(self.device), perm.to(self.device)

    def matmul(self, values: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        return weighted_matmul(values, h, self)

    def softmax(self, logits: torch.Tensor) -> torch.Tensor:
        """Softmax of per-edge ``logits`` [E, heads] over the in-edges of each destination vertex."""
        return edge_softmax(logits, self.dst, self.num_nodes)


def weighted_matmul(values: torch.Tensor, h: torch.Tensor, topo) -> torch.Tensor:
    """``A(values) @ h`` over ``topo``'s pattern (see :class:`EdgeWeightedTopology` for what it provides), with
    gradients for the edge values (an SDDMM) and for ``h`` (``A^T @ g``)."""
    return _EdgeWeightedSpMM.apply(values, h, topo)


class _EdgeWeightedSpMM(torch.autograd.Function):
    @staticmethod
    def forward(ctx, values: torch.Tensor, h: torch.Tensor, topo) -> torch.Tensor:
        ctx.topo = topo
        ctx.save_for_backward(values, h)
        with in_phase(topo.phases):
            return _chunked_matmul(topo.indptr, topo.cols, values, topo.bounds, h)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        values, h = ctx.saved_tensors
        topo = ctx.topo
        grad = grad.contiguous()
        grad_values = grad_h = None
        with in_phase(topo.phases):
            if ctx.needs_input_grad[1]:
                grad_h = _chunked_matmul(topo.t_indptr, topo.t_cols, values[topo.perm], topo.t_bounds, grad)
            if ctx.needs_input_grad[0]:
                grad_values = edge_dot(topo.indptr, topo.cols, grad, h, topo.bounds)
        return grad_values, grad_h, None


def _chunked_matmul(indptr: torch.Tensor, indices: torch.Tensor, values: torch.Tensor, bounds: list[int],
                    h: torch.Tensor) -> torch.Tensor:
    """``M @ h`` for CSR ``(indptr, indices, values)``, row block by row block (blocks built from views)."""
    n = indptr.shape[0] - 1
    if len(bounds) == 2:
        return csr_matmul(torch.sparse_csr_tensor(indptr, indices, values, size=(n, h.shape[0])), h)
    out = h.new_empty(n, h.shape[1])
    for r0, r1 in zip(bounds[:-1], bounds[1:]):
        e0, e1 = int(indptr[r0]), int(indptr[r1])
        block = torch.sparse_csr_tensor(indptr[r0 : r1 + 1] - e0, indices[e0:e1], values[e0:e1], size=(r1 - r0, h.shape[0]))
        out[r0:r1] = csr_matmul(block, h)
    return out
