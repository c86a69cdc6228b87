"""Graph kernels: CSR sparse-dense products with exact, transpose-based backward passes.

All graph aggregation of the engine goes through this module, so a faster kernel (a custom CPU kernel, Triton on
GPU) can replace :func:`csr_matmul` and :func:`edge_dot` without touching the models.

Conventions: ``A`` is stored as CSR over in-edges; row ``v`` lists the sources ``u`` of edges ``u -> v`` and
``(A @ H)[v] = sum_u A[v, u] H[u]``. The backward of ``A @ H`` is ``A^T @ G`` (never ``A @ G``: graphs may be
directed), computed with a precomputed CSR of ``A^T``. Gradients never flow into fixed sparse values.
Products run row block by row block (the chunks of ntp.engine.memory.chunks), so the memory of one product can be bounded.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ntp.engine.device.measure import in_phase
from ntp.engine.device.page_lock import pin_read_only
from ntp.engine.device.precision import LOW_PRECISION, accumulation_dtype
from ntp.engine.device.transfer import (
    Downloads,
    even_blocks,
    host_columns,
    host_empty,
    is_column_major,
    stream_columns,
    stream_depth,
    streamed,
    streams_topology,
)
from ntp.engine.graph.attention import edge_attention
from ntp.engine.graph.operators import CSR, Scaling, transpose

# torch flags every CSR tensor as "beta" and notes that invariant checks are off; both are expected here.
warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta state")
warnings.filterwarnings("ignore", message="Sparse invariant checks are implicitly disabled")


# -- the kernel interface -----------------------------------------------------------------------------------------
def csr_matmul(block: torch.Tensor, h: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """``block @ h`` for a torch sparse CSR ``block`` and a dense ``h``, in ``h``'s dtype; written into ``out`` (rows
    of a larger output on ``h``'s device) when given. A bfloat16 ``h`` is summed in float32: cuSPARSE does so itself;
    on a CPU the product multiplies a float32 copy."""
    if not h.shape[1]:
        return h.new_zeros(block.shape[0], 0) if out is None else out
    with torch.autocast(h.device.type, enabled=False):  # autocast would recast the float32 copy to bfloat16
        if not h.is_cuda:
            y = _bag_sum(block, h.to(accumulation_dtype(h.dtype))).to(h.dtype)  # copies only a bfloat16 h
        elif h.dtype not in LOW_PRECISION:
            if out is None:
                return torch.sparse.mm(block, h)
            return torch.addmm(out, block, h, beta=0.0, out=out)  # beta 0: out's old contents are ignored
        else:
            y = torch.sparse.mm(_with_dtype(block, h.dtype), h)
        return y if out is None else out.copy_(y)


def _bag_sum(block: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    """``block @ h`` on a CPU as a weighted embedding-bag sum: row ``v`` of the CSR is the bag of ``h``'s rows it
    lists, weighted by its values. torch runs it with FBGEMM's kernel, 4-7x faster than MKL's CSR product that
    ``torch.sparse.mm`` calls (bench/kernel.py)."""
    if not torch.is_grad_enabled():  # inside an autograd Function: else torch keeps a bag id per edge for a backward
        h = h.detach()
    values = block.values()
    scalar = values.numel() > 0 and values.stride(0) == 0  # one value for every edge: plain sums, scaled once
    y = F.embedding_bag(
        block.col_indices(),
        h,
        block.crow_indices(),
        mode="sum",
        per_sample_weights=None if scalar else values.to(h.dtype),
        include_last_offset=True,
    )
    scale = float(values[0]) if scalar else 1.0
    return y if scale == 1.0 else y.mul_(scale)


#: a CPU product scales its input's rows by ``pre`` once, instead of gathering ``pre`` for every edge, when its
#: pattern has at least this many edges per input element: scaling an element costs about as much as gathering four
#: edges' values (``_bag_sum`` on 18k-100k rows of width 64: slower at 5-10 edges per row, faster from about 20)
PRESCALE_EDGES_PER_ELEMENT = 0.25


def prescaled(h: torch.Tensor, scaling: Scaling, num_edges: int) -> torch.Tensor | None:
    """``h`` with row ``u`` scaled by ``pre[u]``, in the products' accumulation dtype, where a product over
    ``num_edges`` edges gains by it (:func:`scales_rows`); None where the chunks gather ``pre`` per edge instead."""
    precision = "bf16" if h.dtype in LOW_PRECISION else "fp32"
    if scaling.pre is None or not scales_rows(num_edges, h.numel(), h.device.type, precision):
        return None
    return torch.mul(h, scaling.pre[:, None].to(accumulation_dtype(h.dtype)))


def scales_rows(num_edges: int, elements: int, device_type: str = "cpu", precision: str = "fp32") -> bool:
    """Whether a product over ``num_edges`` edges scales its ``elements`` input elements once (a float32 copy, which
    the plan counts) and sums unit values instead of gathering ``pre`` per edge: on a GPU for float32 inputs (the
    gather took 0.84 of 10.5 ms at 120M edges on an H200), on a CPU for a pattern dense enough."""
    if device_type == "cuda":
        return precision == "fp32"
    return num_edges >= PRESCALE_EDGES_PER_ELEMENT * elements


def value_dtype(h: torch.Tensor) -> torch.dtype:
    """The dtype :func:`csr_matmul` multiplies edge values in for an input ``h``: on a GPU ``h``'s own (cuSPARSE takes
    values in its input's dtype and sums in float32), on a CPU the accumulation dtype (it multiplies a float32 copy of
    a bfloat16 ``h``). Made in float32 and cast, a bfloat16 GPU product's values took 6 bytes per edge, not 2."""
    return h.dtype if h.is_cuda else accumulation_dtype(h.dtype)


def _with_dtype(block: torch.Tensor, dt: torch.dtype) -> torch.Tensor:
    if block.dtype == dt:
        return block
    return torch.sparse_csr_tensor(block.crow_indices(), block.col_indices(), block.values().to(dt), size=block.shape)


def edge_dot(
    indptr: torch.Tensor, indices: torch.Tensor, g: torch.Tensor, h: torch.Tensor, bounds: list[int] | None = None
) -> torch.Tensor:
    """``out[e] = <g[row(e)], h[indices[e]]>`` for every edge ``e`` of a CSR (an SDDMM), row block by row block.

    This is the gradient of ``A(values) @ h`` with respect to the edge values (float32 for bfloat16 inputs)."""
    acc = accumulation_dtype(g.dtype)
    g, h = g.to(acc), h.to(acc)
    out = g.new_empty(indices.shape[0])
    if g.shape[1] == 0:
        return out.zero_()
    b = bounds or [0, indptr.shape[0] - 1]
    for r0, r1 in zip(b[:-1], b[1:]):
        e0, e1 = int(indptr[r0]), int(indptr[r1])
        pattern = torch.sparse_csr_tensor(
            indptr[r0 : r1 + 1] - e0, indices[e0:e1], g.new_zeros(e1 - e0), size=(r1 - r0, h.shape[0])
        )
        with torch.autocast(g.device.type, enabled=False):
            out[e0:e1] = torch.sparse.sampled_addmm(pattern, g[r0:r1], h.t(), beta=0.0).values()
    return out


# -- operators ------------------------------------------------------------------------------------------------------
class RowBlocks:
    """The row blocks of one unit-weight CSR matrix cut at ``bounds``, applied chunk by chunk on ``device``.

    ``offload`` says where the topology stays:

    - ``"none"``: the indices are copied to the device once; chunks are views of them;
    - ``"topology"`` or ``"all"``: each chunk's indices are copied to the device when it runs, on CUDA on a side
      stream while the previous chunk computes, from the host topology's pages locked read-only once (or, where the
      driver refuses, through two pinned staging buffers: ntp.engine.device.transfer.streamed).

    An input in host memory (``--offload all``; pinned on CUDA) passes through the device ``column_block`` columns
    at a time (all unless the plan asked for fewer), over the topology wherever it stays. The device holds one
    block's input and output only while it runs. On CPU every form computes the same products with the same kernel.
    """

    def __init__(
        self,
        indptr: torch.Tensor,
        indices: torch.Tensor,
        bounds: list[int],
        device: torch.device,
        offload: str = "none",
        column_block: int = 0,
    ) -> None:
        self.bounds, self.device, self.offload = list(bounds), device, offload
        self.column_block = column_block  #: columns of a host input on the device at once (0: all)
        self.indptr, self.indices = indptr, indices  #: host topology (for schedules: which sources a chunk needs)
        self.num_rows = bounds[-1]
        if offload == "none":
            indices = indices.to(device)
        self._parts: list[tuple[torch.Tensor, torch.Tensor]] = []  # per chunk: row pointers and columns
        for r0, r1 in self.ranges():
            e0, e1 = int(indptr[r0]), int(indptr[r1])
            cols = indices[e0:e1]
            crow = indptr[r0 : r1 + 1] - e0
            if cols.dtype == torch.int32 and e1 - e0 >= 2**31:  # torch wants one index type per CSR
                cols = cols.long()
            self._parts.append((crow.to(cols.dtype).to(device if offload == "none" else crow.device), cols))
        self._streams = streams_topology(offload, device.type)
        self._pinned = self._streams and pin_read_only(indices, device)  # then copied without staging
        if self._pinned:
            self._parts = [(crow.pin_memory(), cols) for crow, cols in self._parts]

    def ranges(self) -> list[tuple[int, int]]:
        return list(zip(self.bounds[:-1], self.bounds[1:]))

    def __len__(self) -> int:
        return len(self.bounds) - 1

    def device_bytes(self) -> int:
        """Bytes this pattern keeps on a CUDA device between products (0 when offloaded or on the CPU)."""
        if self.offload != "none" or self.device.type != "cuda":
            return 0
        return self.indices.numel() * self.indices.element_size() + sum(
            c.numel() * c.element_size() for c, _ in self._parts
        )

    def chunks(self, scaling: Scaling):
        """``(r0, r1, apply)`` for every chunk, in order; ``apply(h, out=None)`` is the chunk's rows of ``M @ h``
        (``M``: this pattern under ``scaling``, whose vectors live on the device; ``h`` on the device) in ``h``'s
        memory, written into ``out`` when given. The chunk's topology is on the device when it is yielded (streamed
        when offloaded)."""
        for (r0, r1), part in zip(self.ranges(), self._device_parts()):
            yield r0, r1, self._chunk_apply(part, r0, r1, scaling)

    def _device_parts(self):
        """Each chunk's row pointers and columns on the device, in order (streamed when offloaded)."""
        return streamed(self._parts, self.device, self._pinned) if self._streams else iter(self._parts)

    def _chunk_apply(self, part: tuple[torch.Tensor, torch.Tensor], r0: int, r1: int, scaling: Scaling):
        return lambda h, out=None: self._apply(part, r0, r1, h, scaling, out)

    def _apply(
        self,
        part: tuple[torch.Tensor, torch.Tensor],
        r0: int,
        r1: int,
        h: torch.Tensor,
        scaling: Scaling,
        out: torch.Tensor | None = None,
        scaled: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The chunk's rows of ``M @ h``, in ``h``'s memory: written into ``out`` when given (no chunk-sized block
        allocated and copied). ``scaled``: ``h`` already scaled by ``pre`` (:func:`prescaled`), summed with unit
        values instead of gathering ``pre`` for every edge."""
        crow, col = part
        col_d = col if col.device == self.device else col.to(self.device)
        vdt = value_dtype(h)
        pre = scaling.pre if scaled is None else None
        if pre is not None:
            values = pre.to(vdt).index_select(0, col_d)
        elif h.is_cuda:  # cuSPARSE reads a value per edge
            values = torch.ones(col_d.shape[0], dtype=vdt, device=h.device)
        else:  # one value for every edge: the bags read it once
            values = h.new_ones(1, dtype=vdt).expand(col_d.shape[0])
        block = torch.sparse_csr_tensor(crow.to(self.device), col_d, values, size=(r1 - r0, h.shape[0]))
        y = csr_matmul(block, h if scaled is None else scaled, out).to(h.dtype)
        if scaling.post is not None:
            y.mul_(scaling.post[r0:r1, None].to(y.dtype))
        if scaling.diag is not None:
            y.addcmul_(scaling.diag[r0:r1, None].to(y.dtype), h[r0:r1])
        return y

    def matmul(self, h: torch.Tensor, scaling: Scaling) -> torch.Tensor:
        """``M @ h``, chunk by chunk, into one preallocated output in ``h``'s memory (never a concatenation)."""
        if h.device != self.device:  # offload "all": the embeddings pass through the device for this product
            return self._matmul_through_device(h, scaling)
        h = h.contiguous()
        scaled = prescaled(h, scaling, self.indices.numel())
        out = None if len(self) == 1 else h.new_empty(self.num_rows, h.shape[1])
        for (r0, r1), part in zip(self.ranges(), self._device_parts()):
            y = self._apply(part, r0, r1, h, scaling, None if out is None else out[r0:r1], scaled)
        return y if out is None else out

    def _matmul_through_device(self, h: torch.Tensor, scaling: Scaling) -> torch.Tensor:
        """``M @ h`` for ``h`` in host memory. Whole, its rows go in one copy and each chunk's output rows return
        while the next chunk computes. In blocks of columns, ``h`` lies column by column (ntp.engine.device.transfer:
        ``to_graph`` leaves it so), so a block comes and goes in contiguous slabs; its output returns while the next
        block computes, and where the topology stays on the device (no chunk copies for the bus) the next block's
        input arrives meanwhile (ntp.engine.memory.parts.streamed_bytes counts both)."""
        pinned, width = self.device.type == "cuda", h.shape[1]
        step = self.column_block or width
        if step >= width and not is_column_major(h):
            out = host_empty(self.num_rows, width, dtype=h.dtype, pinned=pinned)
            x = h.to(self.device, non_blocking=True)
            y = x.new_empty(self.num_rows, width)
            with Downloads(self.device) as downloads:
                for r0, r1, apply in self.chunks(scaling):
                    downloads.copy(out[r0:r1], apply(x, y[r0:r1]))
            return out
        h = h if is_column_major(h) else host_columns(h, pinned)
        out = host_empty(width, self.num_rows, dtype=h.dtype, pinned=pinned).t()  # column-major
        blocks = even_blocks(width, step)
        stream_columns(
            h, out, self.device, blocks, stream_depth(self._streams), lambda x, y: self._chunks_into(x, y, scaling)
        )
        return out

    def _chunks_into(self, h: torch.Tensor, out: torch.Tensor, scaling: Scaling) -> None:
        for r0, r1, apply in self.chunks(scaling):
            apply(h, out[r0:r1])


@dataclass
class ScaledBlocks:
    """Row blocks under one scaling: what a chunk loop iterates (``(r0, r1, apply)`` per chunk)."""

    blocks: RowBlocks
    scaling: Scaling

    def __len__(self) -> int:
        return len(self.blocks)

    def __iter__(self):
        return self.blocks.chunks(self.scaling)

    def matmul(self, h: torch.Tensor) -> torch.Tensor:
        return self.blocks.matmul(h, self.scaling)


class SparseOperator:
    """A fixed sparse matrix ``M`` (a :class:`Scaling` of a unit-weight pattern); :meth:`__call__` is ``M @ h`` with
    backward ``M^T @ g``, both over the chunks of the blocks' ``bounds``.

    ``forward_blocks`` / ``backward_blocks`` are the row blocks of ``A`` and ``A^T`` (shared between operators over
    the same topology, and the same object when ``A`` is symmetric)."""

    def __init__(self, forward_blocks: RowBlocks, backward_blocks: RowBlocks, scaling: Scaling) -> None:
        self.forward_blocks, self.backward_blocks = forward_blocks, backward_blocks
        self.bounds = forward_blocks.bounds
        self.scaling = scaling.to(forward_blocks.device)
        self.forward = ScaledBlocks(forward_blocks, self.scaling)  #: ``M``, chunk by chunk
        self.backward = ScaledBlocks(backward_blocks, self.scaling.transposed())  #: ``M^T``, chunk by chunk
        self.phases = (
            None  #: a ntp.engine.device.measure.PhaseMemory, set by the context that records peak memory per phase
        )

    @property
    def num_chunks(self) -> int:
        return len(self.bounds) - 1

    @property
    def has_diagonal(self) -> bool:
        """Whether a row's own input is part of its output (each chunk then needs its own rows)."""
        return self.scaling.diag is not None

    def __call__(self, h: torch.Tensor) -> torch.Tensor:
        return _FixedSpMM.apply(h, self)


class _FixedSpMM(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h: torch.Tensor, op: SparseOperator) -> torch.Tensor:
        ctx.op = op
        with in_phase(op.phases):
            return op.forward.matmul(h)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        with in_phase(ctx.op.phases):
            return ctx.op.backward.matmul(grad), None


class EdgeWeightedTopology:
    """A pattern whose edge values are computed (attention): ``A(values) @ h`` with gradients for both.

    What :func:`weighted_matmul` reads: the CSR ``indptr``/``cols`` of ``A``, the CSR ``t_indptr``/``t_cols`` of
    ``A^T`` with ``perm`` mapping its edges to ``A``'s, and the row-block ``bounds`` / ``t_bounds`` of each; what
    :meth:`attention` reads: the sources ``src`` and the rows' edge segments ``row_offsets`` (int64)."""

    def __init__(self, pattern: CSR, device: torch.device | None = None, bounds: list[int] | None = None) -> None:
        self.device = device or torch.device("cpu")
        self.bounds = list(bounds) if bounds is not None else [0, pattern.num_nodes]
        self.t_bounds = self.bounds  # square: the same boundaries cut A^T
        self.phases = None  #: a ntp.engine.device.measure.PhaseMemory (peak memory per phase), set by the context
        self.num_nodes = pattern.num_nodes
        t, perm = transpose(pattern)
        # one index type for every array (a torch CSR wants one), 32-bit where the edges allow: 16 bytes per edge
        idx = pattern.indices.dtype if pattern.num_edges < 2**31 else torch.int64
        self.indptr = pattern.indptr.to(self.device, idx)
        self.src = self.cols = pattern.indices.to(self.device, idx)
        self.row_offsets = pattern.indptr.to(self.device, torch.int64)  # the segments of the attention's softmax
        self.t_indptr, self.t_cols, self.perm = (a.to(self.device, idx) for a in (t.indptr, t.indices, perm))

    def matmul(self, values: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        return weighted_matmul(values, h, self)

    def attention(self, src_scores: torch.Tensor, dst_scores: torch.Tensor, slope: float) -> torch.Tensor:
        """GAT's edge weights [E, heads] from per-vertex scores [N, heads] (ntp.engine.graph.attention)."""
        return edge_attention(src_scores, dst_scores, self.src, self.row_offsets, slope)


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


def _chunked_matmul(
    indptr: torch.Tensor, indices: torch.Tensor, values: torch.Tensor, bounds: list[int], h: torch.Tensor
) -> torch.Tensor:
    """``M @ h`` for CSR ``(indptr, indices, values)``, row block by row block (blocks built from views)."""
    n = indptr.shape[0] - 1
    if len(bounds) == 2:
        return csr_matmul(torch.sparse_csr_tensor(indptr, indices, values, size=(n, h.shape[0])), h)
    out = h.new_empty(n, h.shape[1])
    for r0, r1 in zip(bounds[:-1], bounds[1:]):
        e0, e1 = int(indptr[r0]), int(indptr[r1])
        block = torch.sparse_csr_tensor(
            indptr[r0 : r1 + 1] - e0, indices[e0:e1], values[e0:e1], size=(r1 - r0, h.shape[0])
        )
        out[r0:r1] = csr_matmul(block, h)
    return out
