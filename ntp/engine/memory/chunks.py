"""Chunk plans: memory-bounded aggregation over contiguous destination-row ranges (../shared/design/tensor-parallel.md,
"Chunk-based scheduling").

A chunk is a contiguous range of destination vertices with ALL their in-edges: a row block of the CSR of ``A``.
Every rank derives the same plan from the same topology and options, so no rank waits for another. The chunk size
comes either from ``chunk_rows`` (uniform ranges) or from a memory budget: the largest chunks whose working set fits,

    working set of rows [a, b) = edges * (index + value + kernel scratch) + row pointers
                                 (+ output rows * w * 4 where the chunk makes its own)
                                 (+ received source rows * w * 4 when pipelined),

where ``w`` is the (padded) column-slice width; the device decides the bytes of an edge and whether a chunk makes its
own output rows (:func:`edge_bytes`, :func:`copies_output_rows`). The sparse kernels read their input where it lies,
so only the pipelined loops (ntp.engine.parallel.overlap), which receive each chunk's new source rows, hold rows per
edge; those are bounded by the chunk's edge count.
The same boundaries cut ``A^T`` (source ranges) for the backward, so a row's cost is the larger of its in- and
out-edge costs: the plan bounds the forward and the backward.

Per chunk, :class:`ChunkPlan` also knows the *new* source vertices of the chunk: sources of its in-edges that no
earlier chunk needed. Inter-chunk pipelining (ntp.engine.parallel.overlap) sends exactly those, so a vertex already received for
an earlier chunk is never sent again.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ntp.engine.device.measure import budget_text, format_bytes, free_device_bytes
from ntp.engine.graph.aggregate import scales_rows
from ntp.engine.memory.phases import beside_chunks, peak_bytes
from ntp.errors import MemoryPlanError

#: Bytes per edge of a GPU chunk's working set: its int32 index (streamed when offloaded), its fp32 value (cuSPARSE
#: reads one per edge: gathered, or ones) and the kernel's scratch (not measured on a GPU yet: a bound).
EDGE_BYTES = 4 + 4 + 8
#: Bytes per edge of a CPU chunk's, at most: a float32 value gathered per edge and the bag's index of it
#: (``embedding_bag`` with per-sample weights); the bag sum reads the topology's own indices. The 8 B/edge of scratch
#: once counted here were MKL's CSR product's, which the bag sum replaced.
CPU_EDGE_BYTES = 4 + 4
#: Bytes per edge of a CPU chunk whose product scales its input's rows once, a bound: the bag sum then reads one
#: value for all the edges and no index of them (ntp.engine.graph.aggregate._bag_sum); a step held 0.2-0.25 B an
#: edge beyond its rows (tests/ntp/test_chunking.py, tests/ntp/test_memory_estimate.py, 2026-12-02).
CPU_SCALED_EDGE_BYTES = 1
#: Bytes per row of a chunk besides its values: the row pointer.
ROW_BYTES = 8
#: Bytes a chunk holds besides its rows' costs, a bound: its row pointers number one more than its rows, its edges'
#: one value where they share it (a CPU's bag sum over rows scaled once, :func:`edge_bytes`), and a few scalars (a
#: streamed CPU step held 36 bytes beyond its rows' costs: tests/ntp/test_memory_estimate.py).
CHUNK_BYTES = 64
#: Share of free device memory the default CUDA budget may use.
DEVICE_MARGIN = 0.8
#: How else an impossible budget can be met (homogeneous models).
DEFAULT_WAYS_OUT = (
    "keep less resident (--offload topology, --offload all, --nn-device cpu), or use more ranks "
    "(narrower column slices)"
)
#: The chunks' working set on CPU when no budget is given.
CPU_CHUNK_BYTES = 256 << 20
#: Chunks at least, where products stream their topology from host memory (:func:`streams_topology`): the copy of
#: each chunk overlaps the compute of the one before, so only the first chunk's copy is not hidden (with one chunk,
#: an H200 epoch waited for all of it: 1.8-2.0x the in-device epoch at 120M edges).
STREAMED_CHUNKS = 8


@dataclass
class ChunkPlan:
    """Row boundaries ``bounds`` (``bounds[0] = 0``, ``bounds[-1] = n``) shared by every rank."""

    bounds: list[int]
    reason: str = "unchunked"  #: how the boundaries were chosen (recorded in the results)

    @property
    def num_nodes(self) -> int:
        return self.bounds[-1]

    @property
    def num_chunks(self) -> int:
        return len(self.bounds) - 1

    def ranges(self) -> list[tuple[int, int]]:
        return list(zip(self.bounds[:-1], self.bounds[1:]))


def uniform_plan(num_nodes: int, chunk_rows: int) -> ChunkPlan:
    """Chunks of ``chunk_rows`` rows (the last may be shorter); ``chunk_rows = 0`` means one chunk."""
    if chunk_rows <= 0 or chunk_rows >= num_nodes:
        return ChunkPlan([0, num_nodes])
    return ChunkPlan(list(range(0, num_nodes, chunk_rows)) + [num_nodes], f"chunk_rows={chunk_rows}")


def edge_bytes(device_type: str | None, scaled: bool = False) -> int:
    """Bytes per edge of a chunk's working set on a ``device_type`` device (None: any, a GPU's bound); ``scaled``:
    its product scales the input's rows once (ntp.engine.graph.aggregate.scales_rows), so a CPU's bag sum reads the
    topology's indices and one value for all the edges, about nothing an edge (a GPU's kernel still reads one per
    edge)."""
    if device_type != "cpu":
        return EDGE_BYTES
    return CPU_SCALED_EDGE_BYTES if scaled else CPU_EDGE_BYTES


def copies_output_rows(device_type: str | None, element_bytes: int = 4, pipelined: bool = False) -> bool:
    """Whether a chunk makes its output rows in a block of its own: a CPU's bag sum and a GPU's bfloat16 product copy
    them into the product's output, and the pipelined loops send them (ntp.engine.parallel.overlap), where a GPU's
    float32 product writes into the output's rows (ntp.engine.graph.aggregate.csr_matmul). A product in one chunk
    on a CPU but not pipelined makes the output itself, which the embeddings count (:func:`make_plan`).
    ``device_type`` None: a kernel that may (R-GCN's typed operators concatenate their chunks' rows)."""
    return device_type != "cuda" or element_bytes < 4 or pipelined


def chunk_row_bytes(width: int, element_bytes: int, device_type: str | None, pipelined: bool = False) -> int:
    """Bytes a chunk holds per row besides its edges: the row pointer, and the output row where it makes its own
    (:func:`copies_output_rows`; none where it writes in place)."""
    output = element_bytes * width if copies_output_rows(device_type, element_bytes, pipelined) else 0
    return output + ROW_BYTES


def working_set_bytes(num_nodes: int, num_edges: int, width: int, element_bytes: int, device_type: str = "cuda") -> int:
    """Every chunk's working set of a product over ``width`` columns summed, from the graph's size alone (its edges
    and a self-loop a row, each row's pointer and output row where the chunk makes its own): what ``--offload all``
    shares among its chunks (ntp.engine.memory.offload.chunk_bytes) and bench/plan.py divides by a GPU's room."""
    edges = (num_edges + num_nodes) * edge_bytes(device_type)
    return edges + num_nodes * chunk_row_bytes(width, element_bytes, device_type)


def row_costs(
    indptr: torch.Tensor,
    indices: torch.Tensor,
    num_nodes: int,
    width: int,
    extra_edges_per_row: int = 1,
    pipelined: bool = False,
) -> np.ndarray:
    """Working-set bytes of every destination row (the max of its forward and backward share).

    ``extra_edges_per_row`` covers the self-loops that operators add to the pattern (GCN, mean_self, GIN);
    ``pipelined``: a chunk receives up to one source row per edge."""
    in_deg = (indptr[1:] - indptr[:-1]).numpy()
    out_deg = np.bincount(indices.numpy(), minlength=num_nodes)
    return degree_costs(in_deg, out_deg, width, extra_edges_per_row, pipelined=pipelined)


def degree_costs(
    in_deg: np.ndarray,
    out_deg: np.ndarray,
    width: int,
    extra_edges_per_row: int = 1,
    element_bytes: int = 4,
    pipelined: bool = False,
    device_type: str | None = None,
) -> np.ndarray:
    """:func:`row_costs` from the degrees alone (what a store keeps beside its topology) for a chunk of the
    homogeneous product on a ``device_type`` device (None: any kernel, bounded); ``element_bytes``: of one activation
    element (ntp.engine.device.precision)."""
    deg = np.maximum(in_deg.astype(np.int64), out_deg.astype(np.int64)) + extra_edges_per_row
    scaled = device_type == "cpu" and not pipelined and scales_rows(int(in_deg.sum()), len(in_deg) * width)
    per_edge = edge_bytes(device_type, scaled) + (element_bytes * width if pipelined else 0)  # a source row an edge
    return deg * per_edge + chunk_row_bytes(width, element_bytes, device_type, pipelined)


def budget_plan(indptr: torch.Tensor, indices: torch.Tensor, num_nodes: int, width: int, budget: int) -> ChunkPlan:
    """The largest contiguous chunks (greedy, front to back) whose working set fits ``budget`` bytes."""
    return plan_for_costs(row_costs(indptr, indices, num_nodes, width), width, budget)


def plan_for_costs(costs: np.ndarray, width: int, budget: int, alone: int | None = None) -> ChunkPlan:
    """Greedy chunks over per-row working-set ``costs``, or one chunk where ``alone`` (the product's working set in
    one chunk; default: the costs' sum) fits ``budget``; :class:`MemoryPlanError` when neither that nor one row
    alone does. Each chunk holds :data:`CHUNK_BYTES` besides its rows' costs."""
    num_nodes, rows = len(costs), budget - CHUNK_BYTES  # what a chunk's rows get
    if num_nodes and budget > 0 and (int(costs.sum()) if alone is None else alone) <= rows:
        return ChunkPlan([0, num_nodes], f"budget {format_bytes(budget)}: fits in one chunk")
    worst = int(costs.argmax()) if num_nodes else 0
    if num_nodes and costs[worst] > rows or rows <= 0:
        least = int(costs[worst]) + CHUNK_BYTES if num_nodes else CHUNK_BYTES
        raise MemoryPlanError(
            f"memory budget {format_bytes(budget)} cannot hold the aggregation of vertex {worst} alone "
            f"({format_bytes(least)} for its edges and {width}-wide rows); raise --memory-budget "
            f"to at least {budget_text(least)} or use more ranks (narrower column slices)"
        )
    cum = np.zeros(num_nodes + 1, dtype=np.int64)
    np.cumsum(costs, out=cum[1:])
    bounds = [0]
    while bounds[-1] < num_nodes:
        a = bounds[-1]
        b = int(np.searchsorted(cum, cum[a] + rows, side="right")) - 1
        bounds.append(min(max(b, a + 1), num_nodes))
    return ChunkPlan(bounds, f"budget {format_bytes(budget)}")


def default_device_budget(device: torch.device, resident_bytes: int) -> int:
    """The chunks' budget when none is given: free device memory minus what stays resident, with a margin; on CPU
    :data:`CPU_CHUNK_BYTES` (the kernel's transient working set then stays small whatever the graph, so the ranks
    of a machine add little beside the topology they share)."""
    free = free_device_bytes(device)
    if device.type == "cpu":
        return CPU_CHUNK_BYTES
    return max(int((free - resident_bytes) * DEVICE_MARGIN), 1) if free else 0


def make_plan(
    in_deg: np.ndarray,
    out_deg: np.ndarray,
    *,
    chunk_rows: int = 0,
    memory_budget: int = 0,
    width: int = 1,
    device: torch.device | None = None,
    resident: dict[str, int] | None = None,
    element_bytes: int = 4,
    ways_out: str = "",
    pipelined: bool = False,
    streamed: bool = False,
) -> ChunkPlan:
    """The chunk plan of a run: explicit ``chunk_rows`` wins, then ``memory_budget``, then the device default.

    ``resident``: what stays in the rank's memory besides the chunks (topology, embeddings, NN stage), by name. A
    budget bounds all of it: the chunks get what a product's parts leave (ntp.engine.memory.phases: a streamed NN
    block is not alive then, though it must fit beside a segment's), and a budget they do not leave room in is a
    :class:`MemoryPlanError` that names every part. ``element_bytes``: of one activation element; ``ways_out``:
    the error's remedies besides a larger budget (default: the homogeneous models' offload options, more ranks);
    ``pipelined``: chunks receive their new source rows (ntp.engine.parallel.overlap); ``streamed``: the topology streams
    from host memory, in :data:`STREAMED_CHUNKS` chunks at least; ``device``: where the homogeneous product's
    chunks run, which decides their bytes per edge and whether they make their own output rows (None: unknown, or
    another kernel: bounded; its default budget is a CPU's)."""
    num_nodes = len(in_deg)
    if chunk_rows:
        return uniform_plan(num_nodes, chunk_rows)
    resident, device_type = resident or {}, device.type if device else None
    kept = beside_chunks(resident)
    costs = degree_costs(
        in_deg, out_deg, width, element_bytes=element_bytes, pipelined=pipelined, device_type=device_type
    )
    alone = one_chunk_bytes(costs, width, element_bytes, device_type, pipelined)
    least = STREAMED_CHUNKS if streamed else 1
    if not memory_budget:
        budget = default_device_budget(device or torch.device("cpu"), kept)
        plan = (
            plan_for_costs(costs, width, max(budget, int(costs.max(initial=0)) + CHUNK_BYTES), alone)
            if budget
            else ChunkPlan([0, num_nodes])
        )
        return _at_least(plan, costs, width, least)
    smallest = min(int(costs.max(initial=0)), alone) + CHUNK_BYTES  # a chunk of one vertex, or of all of them
    if peak_bytes(resident, smallest) > memory_budget or memory_budget <= kept:
        parts = ", ".join(f"{name} {format_bytes(b)}" for name, b in resident.items() if b)
        raise MemoryPlanError(
            f"memory budget {format_bytes(memory_budget)} cannot hold this rank: {parts or 'nothing'} stay resident "
            f"and the smallest chunk needs {format_bytes(smallest)} more; raise --memory-budget "
            f"to at least {budget_text(peak_bytes(resident, smallest))}, or {ways_out or DEFAULT_WAYS_OUT}"
        )
    plan = _at_least(plan_for_costs(costs, width, memory_budget - kept, alone), costs, width, least)
    return ChunkPlan(plan.bounds, f"{plan.reason} ({format_bytes(kept)} resident besides)" if kept else plan.reason)


def one_chunk_bytes(costs: np.ndarray, width: int, element_bytes: int, device_type: str | None, pipelined: bool) -> int:
    """The working set of a product in one chunk: its rows' costs, less the output rows where these are the
    product's own output: on a CPU, not pipelined (the bag sum's result is returned; a GPU's bfloat16 chunk copies
    into an output given it, as ``--offload all``'s blocks do, and its float32 chunk makes no rows of its own)."""
    total = int(costs.sum())
    if device_type != "cpu" or pipelined:
        return total
    return total - len(costs) * element_bytes * width


def _at_least(plan: ChunkPlan, costs: np.ndarray, width: int, chunks: int) -> ChunkPlan:
    """``plan``, or where it has fewer than ``chunks`` chunks, chunks of about an equal share of the working set
    (no fewer than asked unless the rows are fewer; one costly row may make one more)."""
    if plan.num_chunks >= chunks or len(costs) <= plan.num_chunks:
        return plan
    share = max(int(costs.sum()) // chunks, int(costs.max(initial=0)), 1) + CHUNK_BYTES
    return ChunkPlan(
        plan_for_costs(costs, width, share).bounds, f"{plan.reason}; {chunks} chunks: the topology streams"
    )


# -- deduplicated sources per chunk (what pipelining sends) -----------------------------------------------------------
@dataclass
class SourceSchedule:
    """For each chunk of a plan over a pattern, the sources first needed by that chunk (sorted global ids), then a
    last entry with the vertices no chunk needs (they still belong to the column layout). Without ``send_once`` every
    chunk lists all its sources (a vertex is sent again for every chunk that needs it)."""

    new_sources: list[torch.Tensor]
    send_once: bool = True

    @property
    def total(self) -> int:
        return sum(int(s.numel()) for s in self.new_sources)


def source_schedule(
    indptr: torch.Tensor, indices: torch.Tensor, plan: ChunkPlan, send_once: bool = True, own_rows: bool = False
) -> SourceSchedule:
    """The sources each chunk needs; ``own_rows``: a chunk also needs its own rows (an operator with a diagonal)."""
    n = plan.num_nodes
    first = torch.full((n,), plan.num_chunks, dtype=torch.int64)  # chunk that first needs each vertex
    per_chunk = []
    for j, (a, b) in enumerate(plan.ranges()):
        src = indices[int(indptr[a]) : int(indptr[b])].long()
        src = torch.unique(torch.cat([src, torch.arange(a, b)]) if own_rows else src)
        if send_once:
            fresh = src[first[src] == plan.num_chunks]
            first[fresh] = j
            per_chunk.append(fresh)
        else:
            first[src] = torch.minimum(first[src], torch.tensor(j))
            per_chunk.append(src)
    per_chunk.append(torch.nonzero(first == plan.num_chunks).flatten())
    return SourceSchedule(per_chunk, send_once)
