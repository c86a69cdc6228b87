"""What a model needs to run on one rank: the graph operators, the collectives and the dropout stream."""

from __future__ import annotations

from functools import cached_property

import torch

from ntp.engine.device.measure import OverlapClock, PhaseMemory, in_phase
from ntp.engine.device.precision import element_bytes
from ntp.engine.device.transfer import moved, streams_topology
from ntp.engine.distributed.collectives import Comm, gather, split
from ntp.engine.distributed.partition import ceil_div
from ntp.engine.graph.aggregate import EdgeWeightedTopology, RowBlocks, SparseOperator
from ntp.engine.graph.operators import CSR, scaling, with_self_loops
from ntp.engine.graph.topology import Topology
from ntp.engine.memory.chunks import ChunkPlan, default_device_budget, make_plan
from ntp.engine.memory.offload import offload_layout
from ntp.engine.memory.parts import graph_resident_parts, slice_is_rows
from ntp.engine.memory.phases import beside_chunks, segment_only
from ntp.engine.memory.placement import ways_out
from ntp.engine.parallel.overlap import OverlappedOperator, propagate_gather, split_propagate, split_propagate_gather
from ntp.engine.parallel.row_stream import Exchange, Graphed, Tail, stream_rows, with_tail


class GraphContext:
    """Per-rank state shared by all layers: the whole topology, the communicator, and the current step.

    Models talk to the graph only through four methods, so the execution mode lives here, not in the models:
    ``to_graph`` / ``from_graph`` move a row-layout matrix into and out of the *graph layout* (tensor parallel: the
    column layout, via split and gather), ``propagate`` / ``propagate_weighted`` apply an operator in the graph
    layout, and ``graph_cols`` says which columns of a matrix the graph layout holds here.
    """

    #: Overlap (inter-chunk pipelining) fuses the split and gather of the column layout with propagation (tensor parallel only).
    supports_overlap = True

    def __init__(
        self,
        topology: Topology,
        comm: Comm,
        *,
        chunk_rows: int = 0,
        seed: int = 0,
        memory_budget: int = 0,
        width: int = 0,
        overlap: bool = False,
        offload: str = "none",
        send_once: bool = True,
        nn_device: torch.device | None = None,
        reserved: dict[str, int] | None = None,
        precision: str = "fp32",
        row_block: int = 0,
    ) -> None:
        """``chunk_rows`` / ``memory_budget`` (bytes) choose the chunk plan (ntp.engine.memory.chunks; ``width``: the widest
        matrix propagated, for the budget); ``overlap``: propagation with per-chunk asynchronous split and gather
        (ntp.engine.parallel.overlap), ``send_once`` sends every source row once; ``offload``: what aggregation streams from
        host memory (ntp.engine.memory.placement); ``nn_device``: where the row layout lives (default: the rank's device);
        ``reserved``: device memory the model keeps besides aggregation's, by part (the NN stage; GAT's pattern and
        edge tensors), which the chunks' budget leaves to it; ``precision``: of the activations
        (ntp.engine.device.precision); ``row_block``: the NN stage streams through the device in blocks of this many rows,
        its rows kept in host memory (``nn_device``; ntp.engine.parallel.row_stream), 0: it runs where its rows are."""
        self.topology = topology
        self.comm = comm
        self.chunk_rows = chunk_rows
        self.memory_budget = memory_budget
        self.width = width
        self.overlap = overlap
        self.offload = offload
        self.send_once = send_once
        self.nn_device = nn_device or comm.device
        self.reserved = reserved or {}
        self.precision = precision
        self.row_block = row_block
        self.seed = seed
        self.step = 0  #: training step (epoch): part of the dropout key, so masks are reproducible on resume
        self._operators: dict[str, SparseOperator] = {}
        self._overlapped: dict = {}
        self.memory = PhaseMemory(comm.device)  #: peak memory per phase ("nn", "propagate")
        self.clock = OverlapClock()  #: time collectives were in flight while this rank computed

    # -- chunks and instrumentation ----------------------------------------------------------------------------------
    @cached_property
    def plan(self) -> ChunkPlan:
        """Chunk boundaries over destination rows, the same on every rank (they depend on shared inputs only)."""
        topo, block = self.topology, self.column_block
        resident = {
            **graph_resident_parts(
                topo.num_nodes,
                topo.num_edges,
                self.slice_width,
                self.offload,
                self.precision,
                self.device.type,
                column_block=block,
                topology_kept=self._offloaded[1],
                symmetric=topo.symmetric,
                rows_counted=self.slice_is_rows,
                rows_streamed=self.streams_rows,
            ),
            **self.reserved,
        }  # the model's parts win: GAT's topology is its attention pattern
        return make_plan(
            topo.in_degrees().numpy(),
            topo.out_degrees().numpy(),
            chunk_rows=self.chunk_rows,
            memory_budget=self.memory_budget,
            width=block or self.slice_width,
            device=self.device,
            resident=resident,
            element_bytes=element_bytes(self.precision),
            ways_out=ways_out(resident),
            pipelined=self.pipelined,
            streamed=streams_topology(self.topology_offload, self.device.type),
        )

    @property
    def pipelined(self) -> bool:
        """Whether propagation runs the pipelined loops (ntp.engine.parallel.overlap): ``overlap`` asked, with ranks to
        exchange with."""
        return self.overlap and self.supports_overlap and self.comm.world > 1

    @property
    def slice_width(self) -> int:
        """Columns of the widest propagated matrix that this rank's column slice holds."""
        return ceil_div(max(self.width, 1), self.comm.world)

    @property
    def slice_is_rows(self) -> bool:
        """Whether the column slice is the NN stage's rows, counted in ``reserved``
        (ntp.engine.memory.parts.slice_is_rows)."""
        return slice_is_rows(self.comm.world, self.reserved.get("NN stage", 0))

    @property
    def column_block(self) -> int:
        """With ``offload="all"`` on a GPU, the columns of the column slice a product holds on the device at once,
        its embeddings kept in host memory between products; 0: they stay on the device (as when the budget holds
        them, or on a CPU). The pipelined loops (``overlap``) hold the whole slice."""
        return self._offloaded[0]

    @property
    def topology_offload(self) -> str:
        """Where the row blocks keep the topology: ``offload``, but "none" (on the device) when ``offload="all"``
        keeps it there beside the streamed column blocks."""
        return "none" if self._offloaded[1] else self.offload

    @cached_property
    def _offloaded(self) -> tuple[int, bool]:
        """``--offload all`` on a GPU: the column block and whether the topology stays on the device, from the room
        the model leaves (ntp.engine.memory.offload.offload_layout)."""
        if self.offload != "all" or self.device.type != "cuda" or self.slice_is_rows:
            return 0, False
        reserved = beside_chunks(self.reserved)  # a streamed NN block is not alive in a product
        room = (
            self.memory_budget - reserved if self.memory_budget else default_device_budget(self.device, reserved)
        )  # what the model leaves a product
        segment = segment_only(self.reserved)  # what stays on the device must leave it room
        block, kept = offload_layout(self.topology, self.slice_width, self.precision, room, segment)
        return (self.slice_width if block and self.pipelined else block), kept

    @property
    def home(self) -> torch.device:
        """Where the graph layout lives between products: host memory when its embeddings are offloaded."""
        return torch.device("cpu") if self.column_block else self.device

    @cached_property
    def csr(self) -> CSR:
        """The in-edge CSR with 64-bit indices, for the explicit operator form (attention, data-parallel mode)."""
        return CSR(self.topology.indptr, self.topology.indices.long(), self.topology.num_nodes)

    def reset_stats(self) -> None:
        """Start an epoch's instrumentation (peak memory per phase, overlap)."""
        self.memory.reset()
        self.clock.reset()

    @property
    def overlapped(self) -> bool:
        """Whether propagation ran with overlapped split/gather (some operator was used that way)."""
        return bool(self._overlapped)

    @property
    def device(self) -> torch.device:
        return self.comm.device

    @property
    def row_offset(self) -> int:
        return self.comm.part.rows()[0]

    # -- the row layout --------------------------------------------------------------------------------------------
    @property
    def streams_rows(self) -> bool:
        """Whether row-wise segments stream through the device in row blocks (``--nn-device stream``)."""
        return self.row_block > 0

    def rows(self, fn, *inputs, params=(), to_graph: bool = False, tail: Tail | None = None):  # noqa: ANN001
        """``fn(self, *inputs)`` for a row-wise segment ``fn`` (whole rows in, whole rows out; ``params``: the
        parameters it reads): where the rows are, or, when :attr:`streams_rows`, a block of rows at a time on the
        rank's device, recomputed in the backward (ntp.engine.parallel.row_stream). A first input in the graph layout
        (a :class:`Graphed`) reaches ``fn`` gathered into rows; ``to_graph``: ``fn``'s last output is returned in the
        graph layout (split), a :class:`Graphed`. Where the exchanges run in passes (:attr:`exchanges_in_passes`)
        they run in the segment's own passes, so those rows never cross to host memory. ``tail``: a value a row (a
        loss) of ``fn``'s float32 output, whose sum over the rows is returned (streamed, its gradients are taken in
        the forward: ntp.engine.parallel.row_stream, summed)."""
        fn, summed = with_tail(fn, tail), tail is not None
        graphed = inputs[0] if inputs and isinstance(inputs[0], Graphed) else None
        ps = [p for p in params if p.requires_grad]
        if self.exchanges_in_passes:
            exchange = Exchange(self.comm, self.home, graphed.width if graphed else 0, to_graph)
            tensors = (graphed.cols, *inputs[1:]) if graphed else inputs
            return stream_rows(fn, self, tensors, ps, **self._stream_options, exchange=exchange, summed=summed)
        if graphed is not None:
            inputs = (self.from_graph(*graphed), *inputs[1:])
        if not self.streams_rows:
            out = fn(self, *inputs)
            out = out.sum() if summed else out
        else:
            out = stream_rows(fn, self, inputs, ps, **self._stream_options, summed=summed)
        if not to_graph:
            return out
        last = out[-1] if isinstance(out, tuple) else out
        leaving = Graphed(self.to_graph(last), last.shape[1])
        return (*out[:-1], leaving) if isinstance(out, tuple) else leaving

    @property
    def _stream_options(self) -> dict:
        return dict(device=self.device, block_rows=self.row_block, precision=self.precision)

    def propagated(self, name: str, z: Graphed, steps: int = 1, alpha: float | None = None) -> Graphed:
        """``P^steps(z)`` of a matrix in the graph layout, its width kept: ``P(h) = A_name h`` or, given ``alpha``,
        ``P(h) = (1 - alpha) A_name h + alpha z`` (APPNP)."""
        h = z.cols
        for _ in range(steps):
            h = _mix(self.propagate(name, h), z.cols, alpha)
        return Graphed(h, z.width)

    # -- the graph layout (tensor parallel: all rows, a column slice) ------------------------------------------
    def to_graph(self, z: torch.Tensor) -> torch.Tensor:
        if self.exchanges_in_passes:
            return split(z, self.comm, block_rows=self.row_block, to=self.home)
        return moved(split(moved(z, self.device), self.comm), self.home, columns=True)  # home: products take columns

    def from_graph(self, h: torch.Tensor, width: int) -> torch.Tensor:
        if self.exchanges_in_passes:
            return gather(h, self.comm, width, block_rows=self.row_block, to=self.nn_device)
        return moved(gather(moved(h, self.device, columns=True), self.comm, width), self.nn_device)

    @property
    def exchanges_in_passes(self) -> bool:
        """Whether split and gather move the row layout a block of rows at a time, its rows kept where they are
        (streamed, with ranks to exchange with or a GPU's memory to keep them out of;
        ntp.engine.distributed.collectives): the device then holds a pass's buffers, not the matrix (papers100M on
        16 ranks: 7 GB a matrix of 256 float32 columns). On one CPU rank the rows are the graph layout already."""
        return self.streams_rows and (self.comm.world > 1 or self.device.type == "cuda")

    def graph_cols(self, width: int) -> tuple[int, int]:
        return self.comm.part.cols(width)

    def propagate(self, name: str, h: torch.Tensor) -> torch.Tensor:
        """``A_name @ h`` in the graph layout."""
        return self.operator(name)(h)

    def propagate_rows(self, name: str, z: torch.Tensor, steps: int, alpha: float | None = None) -> torch.Tensor:
        """``gather(P^steps(split(z)))`` from the row layout back to it, with ``P(h) = A h`` or, given ``alpha``,
        ``P(h) = (1 - alpha) A h + alpha split(z)`` (APPNP). Tensor parallel with ``overlap``: the first step is
        fused with the split and the last with the gather, chunk by chunk (ntp.engine.parallel.overlap; one step: both, in one
        loop); same values."""
        width = z.shape[1]
        if not (self.pipelined and steps > 0):  # the split's output is not held through the gather (unless h is it)
            return self.from_graph(*self.propagated(name, Graphed(self.to_graph(z), width), steps, alpha))
        pop = self.overlapped_operator(name)
        if steps == 1:
            last = moved(split_propagate_gather(moved(z, self.device), pop), self.nn_device)
        else:
            p, z_cols = split_propagate(moved(z, self.device), pop)
            h = _mix(p, z_cols, alpha)
            for _ in range(steps - 2):
                h = _mix(self.propagate(name, h), z_cols, alpha)
            last = moved(propagate_gather(h, pop, width), self.nn_device)
        return last if alpha is None else (1 - alpha) * last + alpha * z  # gather(split(z)) is z, exactly

    def propagate_weighted(self, values: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        """``A(values) @ h`` over the attention topology (in-edges plus self-loops), in the graph layout."""
        return self.attention_topology.matmul(values, h)

    # -- operators -------------------------------------------------------------------------------------------------
    def operator(self, name: str) -> SparseOperator:
        if name not in self._operators:
            with in_phase(self.memory, "setup"):  # built once, at the first propagation: not the epochs' peak
                self._operators[name] = self._build_operator(name)
        return self._operators[name]

    def _build_operator(self, name: str) -> SparseOperator:
        op = SparseOperator(*self._blocks, scaling(self.topology, name))
        op.phases = self.memory
        return op

    def device_topology_bytes(self) -> int:
        """Device memory the topology occupies between products (the row blocks of ``A`` and ``A^T``, once each)."""
        if "_blocks" not in self.__dict__:
            return 0
        return sum(b.device_bytes() for b in {id(b): b for b in self._blocks}.values())

    @cached_property
    def _blocks(self) -> tuple[RowBlocks, RowBlocks]:
        """The row blocks of ``A`` and ``A^T`` that every operator scales (one object when ``A`` is symmetric)."""
        topo, bounds = self.topology, self.plan.bounds
        blocks = lambda indptr, indices: RowBlocks(
            indptr,
            indices,
            bounds,
            self.device,  # noqa: E731
            self.topology_offload,
            self.column_block,
        )
        forward = blocks(topo.indptr, topo.indices)
        return (forward, forward) if topo.symmetric else (forward, blocks(topo.t_indptr, topo.t_indices))

    def overlapped_operator(self, name: str) -> OverlappedOperator:
        """The operator with its per-chunk exchange schedules (built once per operator)."""
        if name not in self._overlapped:
            op = self.operator(name)
            with in_phase(self.memory, "setup"):
                self._overlapped[name] = OverlappedOperator(
                    op, self.comm, self.clock, self.memory, send_once=self.send_once, home=self.home
                )
        return self._overlapped[name]

    @cached_property
    def attention_topology(self) -> EdgeWeightedTopology:
        """In-edges plus one self-loop per vertex (as GATConv), for attention-weighted propagation."""
        with in_phase(self.memory, "setup"):
            pattern = CSR(self.topology.indptr, self.topology.indices, self.topology.num_nodes)  # 32-bit ids kept
            topo = EdgeWeightedTopology(with_self_loops(pattern), self.device, bounds=self.plan.bounds)
        topo.phases = self.memory
        return topo


def _mix(p: torch.Tensor, z_cols: torch.Tensor, alpha: float | None) -> torch.Tensor:
    return p if alpha is None else (1 - alpha) * p + alpha * z_cols
