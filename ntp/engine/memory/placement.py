"""Where the two stages of an epoch run, and where their data lives.

- Aggregation (the graph stage) always computes on the rank's device. With ``offload`` its topology ("topology")
  stays in host memory and streams to the device chunk by chunk (ntp.engine.graph.aggregate.RowBlocks); with "all" the
  column-slice embeddings live in host memory too when the device cannot hold them, and visit it one product at a
  time, a block of columns at a time, while the topology stays on the device if blocks of useful width fit beside
  it (ntp.engine.memory.offload decides).
- The NN stage (row layout: features, MLP activations, parameters) runs on the device, or on the CPU when its row
  block does not fit in device memory beside what aggregation keeps there (``nn_device="auto"``), or where the
  user says. Moving rows between the stages is a copy that autograd reverses in the backward.

On a CPU-only rank (ntp.engine.device.measure.free_device_bytes is 0) every choice resolves to the CPU and changes nothing
but these copies (which are no-ops).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial
from typing import Callable

import torch

from ntp.engine.device.measure import format_bytes, free_device_bytes
from ntp.engine.device.precision import element_bytes
from ntp.engine.device.transfer import streams_topology
from ntp.engine.distributed.partition import ceil_div
from ntp.engine.memory.chunks import DEVICE_MARGIN, ChunkPlan, make_plan
from ntp.engine.memory.parts import rank_slice_width
from ntp.engine.memory.phases import beside_chunks


def ways_out(resident: dict[str, int]) -> str:
    """How else a budget too small for ``resident`` (by part) can be met, besides a larger one: link prediction's
    encoder stays on the rank's device and its pairs come in chunks (ntp.engine.tasks.link.memory); GAT's edge tensors are
    on every rank whatever their number, and it offloads nothing ("" means ntp.engine.memory.chunks's default)."""
    if "pair chunk" in resident:
        return (
            "keep less resident (--offload topology, --offload all), score fewer pairs at once (a smaller "
            "--link-batch: a chunk holds up to twice its edges), or use more ranks (narrower column slices)"
        )
    if "attention" not in resident:
        return ""
    return (
        "use fewer --heads (GAT keeps its edge tensors per head, on every rank), --nn-device cpu, or a model "
        "without attention (gcn, sage)"
    )


def nn_placement(
    choice: str, device: torch.device, nn_bytes: int, graph_bytes: int, free_bytes: int, streamable: bool = True
) -> str:
    """Where the NN stage runs: "device" (the rank's device, its rows there), "stream" (its rows in host memory,
    streamed through the device in row blocks: ntp.engine.parallel.row_stream) or "cpu" (on the host). ``choice`` "device",
    "stream" or "cpu" as given (on a CPU rank "device" is "cpu", and "stream" runs its blocks on the CPU, as the
    tests do); "auto": the device when the NN stage (``nn_bytes``) fits beside aggregation (``graph_bytes``) in
    ``free_bytes`` with the usual margin, else streamed (on the host where the model does not stream:
    ``streamable``)."""
    if choice == "stream":
        return "stream"
    if choice == "cpu" or device.type == "cpu":
        return "cpu"
    if choice == "device":
        return "device"
    if nn_bytes + graph_bytes <= free_bytes * DEVICE_MARGIN:
        return "device"
    return "stream" if streamable else "cpu"


@dataclass(frozen=True)
class NNPlacement:
    """Where a rank's NN stage runs: ``home``, where its rows live; ``row_block``, rows of a block streamed through
    the rank's device (0: it computes at ``home``); ``reserved``: what the model keeps on the rank's device besides
    aggregation, by part (GraphContext's ``reserved``); ``features``: where its input features live (``home``, or,
    streamed, the rank's device where they fit at no cost to aggregation: :func:`features_stay`)."""

    home: torch.device
    row_block: int
    reserved: dict[str, int]
    features: torch.device


def feature_bytes(num_nodes: int, feature_dim: int, world: int, precision: str) -> int:
    """Bytes of a rank's rows of the input features (the largest row block) in ``precision``."""
    return ceil_div(num_nodes, world) * feature_dim * element_bytes(precision)


def features_stay(cfg, device: torch.device, feature_bytes: int, room: int, bus: Callable[[int], float] | None) -> bool:
    """Whether a streamed NN stage's input features stay on the rank's GPU (``cfg``: a TrainConfig) in ``room`` (what
    the budget leaves a product): under ``--offload all``, where aggregation's products in the room left move no more
    bytes over the bus (``bus(room)``: ntp.engine.memory.offload.offload_bus_bytes beside the NN block) than in the
    whole room. Their blocks then cross the bus neither in the forward nor in the backward's recompute (products scale,
    float32: 2 GB an epoch). Elsewhere the room beside the resident slice is the chunks', which the plan sizes later."""
    if bus is None or cfg.offload != "all" or device.type != "cuda" or not 0 < feature_bytes < room:
        return False
    return bus(room - feature_bytes) <= bus(room) < math.inf


def place_nn_stage(
    cfg,
    device: torch.device,
    resident: dict[str, int],
    reserved: dict[str, int],
    report: bool = False,
    streamed: Callable[..., tuple[int, dict[str, int]]] | None = None,
    feature_bytes: int = 0,
    bus: Callable[[int], float] | None = None,
) -> NNPlacement:
    """Where the NN stage of a rank on ``device`` runs (:func:`nn_placement`; ``cfg``: a TrainConfig), from its
    ``resident`` parts planned with the NN stage on the device (the part "NN stage"; the others stay there), and
    ``reserved`` (what the model keeps on the device besides aggregation) with the NN stage's bytes left out where it
    runs on the host, or a block's where it streams: ``streamed`` gives its rows and the parts then from the room
    (:func:`stream_parts`; None: the task does not stream, and ntp.config's checks refuse ``--nn-device stream``).
    Streamed, its input features (``feature_bytes``) stay on the device where :func:`features_stay` says so (``bus``:
    aggregation's bus bytes by room, ntp.engine.memory.offload.offload_bus_bytes; None: never). ``report``: print where
    and why."""
    nn_bytes = resident["NN stage"]
    graph_bytes = sum(resident.values()) - nn_bytes
    free = free_device_bytes(device)
    if free and cfg.memory_budget_bytes:  # the budget bounds the whole rank: the NN stage fits in what it leaves
        free = min(free, int(cfg.memory_budget_bytes / DEVICE_MARGIN))
    where = nn_placement(cfg.nn_device, device, nn_bytes, graph_bytes, free, streamed is not None)
    home = device if where == "device" else torch.device("cpu")
    block, nn_part = 0, {"NN stage": nn_bytes if home == device else 0}  # a CPU rank's host is its device
    features = home
    if where == "stream":
        room = cfg.memory_budget_bytes or int(free * DEVICE_MARGIN)
        block, parts = streamed(room=room)
        nn_part = {"NN stage": 0, "NN block": parts["NN block"], "parameters": parts["parameters"]}
        beside = room - beside_chunks({**reserved, **nn_part})  # what a product gets (GraphContext's room)
        bus_beside_block = partial(bus, segment=parts["NN block"]) if bus else None
        if features_stay(cfg, device, feature_bytes, beside, bus_beside_block):
            nn_part["features"], features = feature_bytes, device
    if report and (free or block):
        stay = "features" in nn_part
        print(f"[ntp] {describe(where, device, nn_bytes, graph_bytes, free, block, stay)}", flush=True)
    return NNPlacement(home, block, {**reserved, **nn_part}, features)


def describe(
    where: str,
    device: torch.device,
    nn_bytes: int,
    graph_bytes: int,
    free_bytes: int,
    row_block: int = 0,
    features_stay: bool = False,
) -> str:
    """One line for the worker log: where the NN stage runs and why (``features_stay``: its input features stay on
    the device, :func:`features_stay`)."""
    stays = " (its input features stay on the device)" if features_stay else ""
    what = {
        "device": f"NN stage on {device}",
        "cpu": "NN stage on cpu",
        "stream": f"NN stage streamed through {device} in blocks of {row_block} rows, its rows in host memory{stays}",
    }[where]
    if not free_bytes:
        return what
    return (
        f"{what}: it needs {format_bytes(nn_bytes)} whole, aggregation keeps {format_bytes(graph_bytes)}, "
        f"{format_bytes(free_bytes)} free on the device"
    )


def store_plan(cfg, store, world: int, device: str, resident: dict[str, int], out_dim: int) -> ChunkPlan:
    """The budget's chunk plan every rank will compute (ntp.engine.memory.chunks.make_plan) from the store's degrees,
    with ``resident`` (by part) beside the chunks."""
    slice_width = rank_slice_width(cfg, out_dim, world)
    return make_plan(
        store.in_degrees(),
        store.out_degrees(),
        memory_budget=cfg.memory_budget_bytes,
        width=slice_width,
        device=torch.device(device),
        resident=resident,
        element_bytes=element_bytes(cfg.precision),
        ways_out=ways_out(resident),
        pipelined=cfg.overlap and world > 1,
        streamed=streams_topology(cfg.offload, device),
    )
