"""``--offload all`` on a GPU: where the column slice meets the products. It stays on the device where it fits there
beside a chunk of the topology, which then streams (:func:`slice_stays`); else it lives in host memory and visits the
device one product at a time, a block of columns at a time (ntp.engine.device.transfer.stream_columns), while the
topology stays on the device if blocks of useful width fit beside it (:func:`streamed_layout`). A product moves the
topology over the bus once where the slice stays, and the slice there and back where it streams (and the exchanges
beside it cross too), so the slice stays unless streaming it moves fewer bytes (:func:`product_bus_bytes`). This
module makes that choice from the room a budget leaves (:func:`offloaded_layout`) and counts what a streamed layout
needs (:func:`offload_room`).
"""

from __future__ import annotations

import bisect
import math

from ntp.engine.device.precision import element_bytes
from ntp.engine.device.transfer import even_blocks, stream_depth
from ntp.engine.distributed.partition import ceil_div
from ntp.engine.memory.chunks import CHUNK_BYTES, EDGE_BYTES, STREAMED_CHUNKS, chunk_row_bytes, working_set_bytes
from ntp.engine.memory.parts import (
    INDEX_BYTES,
    ROW_POINTER_BYTES,
    device_topology_bytes,
    graph_resident_parts,
    streamed_bytes,
)

#: Bytes of a row of a streamed column block, at least, beside a topology kept on the device: one memory sector of a
#: GPU (32 bytes); narrower rows waste most of each read of the products' gathers.
SECTOR_BYTES = 32
#: Chunks of a product at most, where the column slice stays on the device and the topology streams (a chunk's room
#: is a share of their working set, :func:`chunk_bytes`): more chunks cost launches, tens of microseconds each, where
#: streaming the slice instead would move it over the bus (products scale: 1.25 GB a product in float32).
STAYING_CHUNKS = 32


def offloaded_layout(
    num_nodes: int,
    num_edges: int,
    slice_width: int,
    room: int,
    precision: str = "fp32",
    max_degree: int = 0,
    symmetric: bool = False,
    segment: int = 0,
) -> tuple[int, bool]:
    """``--offload all`` on a GPU, given ``room`` (what the budget leaves a product besides the NN stage) and
    ``segment`` (what only the NN stage's segments hold: a streamed NN block, which what stays on the device must
    leave room for, and a product's blocks need not: ntp.engine.memory.phases): how many columns of the column slice
    a product holds on the device at once, and whether the topology stays there meanwhile.

    0 columns (the slice stays on the device, the topology streams) where the slice fits there beside a chunk of
    the streamed topology (:func:`slice_stays`) and streaming it would not move fewer bytes over the bus (a
    product's, :func:`product_bus_bytes`; streamed, the exchanges beside the products cross too, so this favours
    streaming). Else the slice streams (:func:`streamed_layout`)."""
    streamed = streamed_layout(num_nodes, num_edges, slice_width, room, precision, max_degree, symmetric, segment)
    if slice_stays(num_nodes, num_edges, slice_width, room, precision, max_degree, symmetric, segment):
        stay = product_bus_bytes(num_nodes, num_edges, slice_width, precision, 0, False)
        if stay <= product_bus_bytes(num_nodes, num_edges, slice_width, precision, *streamed):
            return 0, False
    return streamed


def slice_stays(
    num_nodes: int,
    num_edges: int,
    slice_width: int,
    room: int,
    precision: str = "fp32",
    max_degree: int = 0,
    symmetric: bool = False,
    segment: int = 0,
) -> bool:
    """Whether the column slice fits on the device under ``--offload all`` (as ``--offload topology`` keeps it: its
    copies and a product's float32 copy, ntp.engine.memory.parts.graph_resident_parts; two copies beside a streamed
    NN stage, which ``segment`` > 0 means) with a chunk of the topology that then streams (:func:`chunk_bytes`, a
    product in :data:`STAYING_CHUNKS` at most) in ``room``, and its copies beside a segment's block."""
    kept = graph_resident_parts(
        num_nodes,
        num_edges,
        slice_width,
        "all",
        precision,
        "cuda",
        column_block=0,
        symmetric=symmetric,
        rows_streamed=segment > 0,
    )
    chunk = chunk_bytes(num_nodes, num_edges, slice_width, precision, max_degree, STAYING_CHUNKS)
    return kept["embeddings"] <= room - segment and sum(kept.values()) + chunk <= room


def streamed_layout(
    num_nodes: int,
    num_edges: int,
    slice_width: int,
    room: int,
    precision: str = "fp32",
    max_degree: int = 0,
    symmetric: bool = False,
    segment: int = 0,
) -> tuple[int, bool]:
    """The columns of a block of a column slice that streams, and whether the topology stays on the device beside
    the blocks, in ``room`` beside a ``segment``'s own parts (:func:`offloaded_layout`): the widest blocks the room
    holds (:func:`offload_room`), at least one column. The topology stays when blocks a memory sector wide
    (:data:`SECTOR_BYTES`; or the whole slice, if narrower) fit beside it: each block then reads it from device
    memory instead of streaming it over the bus once more (an H200 streamed a 120M-edge topology in about the time
    of a whole product). The blocks then come one ahead of the compute (:func:`streamed_bytes`), and number two at
    least where they stay a sector wide, so that copies overlap the products."""
    eb, staying = element_bytes(precision), room - segment  # what stays must fit beside a segment too
    widest = lambda kept: bisect.bisect_right(  # noqa: E731
        range(1, slice_width + 1),
        room,
        key=lambda c: offload_room(num_nodes, num_edges, c, precision, kept, max_degree, symmetric),
    )
    topology_fits = device_topology_bytes(num_nodes, num_edges, symmetric) <= staying
    beside, sector = widest(True) if topology_fits else 0, min(slice_width, SECTOR_BYTES // eb)
    if beside >= sector:
        return min(beside, max(sector, ceil_div(slice_width, 2))), True
    return max(1, widest(False)), False


def offload_room(
    num_nodes: int,
    num_edges: int,
    columns: int,
    precision: str = "fp32",
    topology_kept: bool = False,
    max_degree: int = 0,
    symmetric: bool = False,
) -> int:
    """Device bytes ``--offload all`` needs besides the NN stage to stream ``columns`` columns at a time: the
    product's (:func:`streamed_bytes`), a chunk (:func:`chunk_bytes`) and the topology where it stays."""
    eb = element_bytes(precision)
    chunk = chunk_bytes(num_nodes, num_edges, columns, precision, max_degree)
    topology = device_topology_bytes(num_nodes, num_edges, symmetric) if topology_kept else 0
    return streamed_bytes(num_nodes, columns, eb, stream_depth(not topology_kept)) + chunk + topology


def chunk_bytes(
    num_nodes: int,
    num_edges: int,
    columns: int,
    precision: str = "fp32",
    max_degree: int = 0,
    chunks: int = STREAMED_CHUNKS,
) -> int:
    """The room ``--offload all`` leaves a chunk of a product over ``columns`` columns on a GPU: the chunks' working
    set shared by ``chunks`` (default :data:`STREAMED_CHUNKS`, the least a streamed topology has; the plan makes
    more where rows cost more), and at least the row of ``max_degree`` edges, with a chunk's own bytes
    (ntp.engine.memory.chunks.CHUNK_BYTES)."""
    eb = element_bytes(precision)
    share = working_set_bytes(num_nodes, num_edges, columns, eb) // chunks
    return max(share, (max_degree + 1) * EDGE_BYTES + chunk_row_bytes(columns, eb, "cuda")) + CHUNK_BYTES


def offload_layout(topology, slice_width: int, precision: str, room: int, segment: int = 0) -> tuple[int, bool]:  # noqa: ANN001
    """``--offload all``'s layout on a GPU for ``topology`` (a ntp.engine.graph.topology.Topology) in ``room``
    beside a ``segment``'s own parts: the columns of a block of the slice and whether the topology stays on the
    device (:func:`offloaded_layout`, the rows of its largest degree a chunk at least)."""
    degrees = (topology.in_degrees(), topology.out_degrees())
    max_degree = max((int(d.max()) for d in degrees if d.numel()), default=0)
    n, e = topology.num_nodes, topology.num_edges
    return offloaded_layout(n, e, slice_width, room, precision, max_degree, topology.symmetric, segment)


def offload_bus_bytes(topology, slice_width: int, precision: str, room: int, segment: int = 0) -> float:  # noqa: ANN001
    """Bytes a product moves over the bus under ``--offload all`` in ``room`` beside a ``segment``'s own parts
    (:func:`offload_layout`, :func:`product_bus_bytes`); infinite where even one column's blocks, or the segment's, do
    not fit (the chunks' plan may still find a way)."""
    columns, kept = offload_layout(topology, slice_width, precision, room, segment)
    n, e = topology.num_nodes, topology.num_edges
    if columns and (
        room < segment or offload_room(n, e, columns, precision, kept, symmetric=topology.symmetric) > room
    ):
        return math.inf
    return product_bus_bytes(n, e, slice_width, precision, columns, kept)


def product_bus_bytes(
    num_nodes: int, num_edges: int, slice_width: int, precision: str, columns: int, topology_kept: bool
) -> int:
    """Bytes a product moves over the bus in an ``--offload all`` layout (``columns`` of the slice a block, 0: it
    stays on the device; ``topology_kept``): where the slice stays, the topology once; else the slice there and back,
    and the topology once a column block unless it stays."""
    one_direction = num_edges * INDEX_BYTES + num_nodes * ROW_POINTER_BYTES
    if not columns:
        return one_direction
    passes = 0 if topology_kept else len(even_blocks(slice_width, columns))
    return passes * one_direction + 2 * num_nodes * slice_width * element_bytes(precision)


def describe_streaming(column_block: int, slice_width: int, topology_kept: bool) -> str:
    """One line for the worker log: how ``--offload all`` moves the column slice through the device (``column_block``
    0: it does not)."""
    if not column_block:
        return (
            "--offload all: the column slice stays on the device (it fits there beside a chunk of the topology, or one "
            "rank's slice is its NN stage's rows, there already); the topology streams from host memory"
        )
    blocks = ceil_div(slice_width, column_block)
    where = (
        "stays on the device, and each block arrives while the one before computes"
        if topology_kept
        else f"streams {blocks} time(s) a product"
    )
    return (
        f"--offload all: the {slice_width}-column slice lives in host memory and passes through the device in "
        f"{blocks} block(s) of up to {column_block} columns; the topology {where}"
    )
