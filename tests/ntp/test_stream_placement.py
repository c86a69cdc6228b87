"""Where a streamed NN stage's parts go on a GPU (``--nn-device stream``; ntp.engine.memory.placement), planned at
ogbn-products' shape on one GPU (2.4M vertices, 124M edges, 100 features, 47 classes, coupled GCN, hidden 64): the
NN block leaves ``--offload all`` the room to keep the topology on the device, and the input features stay there
only where aggregation then moves no more bytes over the bus. Planned only: nothing runs on a device (the GPU's
runs are tests/ntp/test_cuda_stream.py's)."""

from __future__ import annotations

import math
from functools import partial
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from ntp.config import TrainConfig
from ntp.engine.distributed.collectives import Comm
from ntp.engine.distributed.partition import Partition
from ntp.engine.memory import offload, parts, placement
from ntp.engine.memory.chunks import STREAMED_CHUNKS
from ntp.engine.memory.offload import STAYING_CHUNKS, offloaded_layout
from ntp.engine.memory.parts import STREAM_BLOCK_ROWS, stream_block_rows, stream_parts
from ntp.engine.memory.phases import beside_chunks
from ntp.engine.parallel.context import GraphContext

N, E, FEATURES, CLASSES, HIDDEN = 2_449_029, 123_718_280, 100, 47, 64
PARAMS = FEATURES * HIDDEN + HIDDEN + HIDDEN * CLASSES + CLASSES
SHAPE = dict(num_nodes=N, num_edges=E, feature_dim=FEATURES, out_dim=CLASSES, world=1, params=PARAMS)
GPU = torch.device("cuda", 0)
#: what the plan reads of products' topology (its largest degree, 17k, bounds a chunk from below)
TOPOLOGY = SimpleNamespace(
    num_nodes=N,
    num_edges=E,
    symmetric=True,
    in_degrees=lambda: torch.tensor([17_000]),
    out_degrees=lambda: torch.tensor([17_000]),
)


def _config(**options) -> TrainConfig:
    return TrainConfig(model="gcn", arch="coupled", hidden=HIDDEN, nn_device="stream", **options)


@pytest.mark.parametrize(
    "precision, budget, layout",
    [
        ("fp32", "3.5GB", (0, False)),  # the slice stays, the topology streams
        ("fp32", "2GB", (0, False)),  # its two copies and a product's float32 copy, 1.88 GB, beside 18 chunks
        ("fp32", "1.5GB", (17, True)),  # it streams beside the topology
        ("fp32", "1GB", (37, False)),  # both stream
        ("bf16", "1GB", (0, False)),
        ("bf16", "0.8GB", (49, False)),
    ],
)
def test_offload_all_keeps_the_slice_on_the_gpu_where_it_fits_beside_a_streamed_topology(
    precision: str, budget: str, layout: tuple[int, bool]
) -> None:
    """Beside a streamed NN stage (blocks of at most :data:`STREAM_BLOCK_ROWS` rows) ``--offload all`` keeps the
    column slice on the device wherever it fits there with a chunk of the topology, which then streams: a product
    moves the topology once (0.5 GB), where streaming the slice beside a topology kept on the device moved the slice
    there and back (1.25 GB in float32), and the segments' exchanges crossed the bus as well. Before 2026-12-02's
    last change the slice stayed only where four copies of it fit in half the room: under 2GB and 3.5GB it streamed.
    Where it streams, the NN block, which is not alive in a product (ntp.engine.memory.phases), leaves the column
    blocks its room: wider blocks than where its bytes were taken from the product's room."""
    cfg = _config(offload="all", memory_budget=budget, precision=precision)
    block, resident = stream_parts(cfg, **SHAPE, device_type="cuda", symmetric=True, room=cfg.memory_budget_bytes)
    assert block == STREAM_BLOCK_ROWS
    room, segment = cfg.memory_budget_bytes - resident["parameters"], resident["NN block"]
    shape = (N, E, 64, room, precision, 17_000, True, segment)
    assert offloaded_layout(*shape) == layout
    streamed, bus = offload.streamed_layout(*shape), partial(offload.product_bus_bytes, N, E, 64, precision)
    if layout[0]:
        narrower = offloaded_layout(N, E, 64, room - segment, precision, 17_000, True)
        assert layout == streamed and bus(*layout) < bus(*narrower), (layout, narrower)
    else:
        assert bus(*layout) < bus(*streamed), (layout, streamed)
    assert stream_block_rows(100, 10 * STREAM_BLOCK_ROWS, 0) == STREAM_BLOCK_ROWS, "a CPU rank's blocks too"
    assert stream_block_rows(100, 5000, 0) == 5000 and stream_block_rows(10**6, 10**6, 10**6) == 1024


def test_what_stays_on_the_device_leaves_a_segment_its_block() -> None:
    """The topology stays beside a product's column blocks only where it also fits beside the NN block, which the
    segments hold: the product's room alone does not decide it."""
    room = int(2e9)
    topology = parts.device_topology_bytes(N, E, symmetric=True)
    assert offloaded_layout(N, E, 64, room, "fp32", symmetric=True, segment=room - topology)[1]
    assert not offloaded_layout(N, E, 64, room, "fp32", symmetric=True, segment=room - topology + 1)[1]


def _placed(cfg: TrainConfig, monkeypatch) -> placement.NNPlacement:
    monkeypatch.setattr(placement, "free_device_bytes", lambda device: 0)  # the budget is the room: no GPU asked
    resident = parts.rank_resident_parts(cfg, nn_on_device=True, device_type="cuda", symmetric=True, **SHAPE)
    return placement.place_nn_stage(
        cfg,
        GPU,
        resident,
        {"NN stage": resident["NN stage"]},
        report=True,
        streamed=partial(stream_parts, cfg, device_type="cuda", symmetric=True, **SHAPE),
        feature_bytes=placement.feature_bytes(N, FEATURES, 1, cfg.precision),
        bus=partial(offload.offload_bus_bytes, TOPOLOGY, 64, cfg.precision),
    )


def _rank_context(topology, cfg: TrainConfig, placed: placement.NNPlacement) -> GraphContext:  # noqa: ANN001
    """The GPU rank's context of ``cfg`` with the NN stage ``placed``: what the layout is read from."""
    return GraphContext(
        topology,
        Comm(Partition(N, 1, 0), GPU),
        memory_budget=cfg.memory_budget_bytes,
        width=64,
        offload="all",
        reserved=placed.reserved,
        precision=cfg.precision,
        row_block=placed.row_block,
    )


@pytest.mark.parametrize(
    "precision, budget, stay",
    [
        ("fp32", "3.5GB", True),  # the column slice stays on the device beside them
        ("bf16", "2GB", True),  # 0.49 GB, the slice still there
        ("fp32", "2GB", False),  # 0.98 GB: the slice would stream
        ("fp32", "6GB", True),
        ("fp32", "1GB", False),
    ],
)
def test_streamed_features_stay_on_the_gpu_only_where_aggregation_moves_no_more_bytes(
    precision: str, budget: str, stay: bool, monkeypatch, capsys
) -> None:
    """The features stay where aggregation's products, in the room they leave, move no more bytes over the bus than
    in the whole room; then the plan counts them, the log says so, and the rank's layout is the one the decision
    assumed."""
    cfg = _config(offload="all", memory_budget=budget, precision=precision)
    placed = _placed(cfg, monkeypatch)
    features = placement.feature_bytes(N, FEATURES, 1, precision)
    assert (placed.features == GPU) is stay and (placed.reserved.get("features") == features) is stay
    assert ("its input features stay on the device" in capsys.readouterr().out) is stay
    assert placed.home.type == "cpu" and placed.row_block == STREAM_BLOCK_ROWS
    ctx = _rank_context(TOPOLOGY, cfg, placed)
    room, segment = cfg.memory_budget_bytes - beside_chunks(placed.reserved), placed.reserved["NN block"]
    layout = offload.offload_layout(TOPOLOGY, 64, precision, room, segment)
    assert (ctx.column_block, ctx.topology_offload == "none") == layout
    without = room + (features if stay else 0)
    bus = partial(offload.offload_bus_bytes, TOPOLOGY, 64, precision, segment=segment)
    assert bus(room) <= bus(without)


def test_streamed_features_stay_in_host_memory_unless_offload_all_plans_the_room(monkeypatch, capsys) -> None:
    """Beside a resident slice (``--offload topology``) the room left is the chunks', which the plan sizes later:
    the features stay in host memory, as on a CPU rank (whose log says nothing of them) and without a bus to
    compare."""
    placed = _placed(_config(offload="topology", memory_budget="6GB"), monkeypatch)
    assert placed.features.type == "cpu" and "features" not in placed.reserved
    cpu = torch.device("cpu")
    on_cpu = placement.place_nn_stage(
        _config(offload="all"),
        cpu,
        {"NN stage": 10**6},
        {},
        report=True,
        streamed=lambda room: (64, {"NN block": 1, "parameters": 0}),
    )
    assert on_cpu.features == cpu and "features" not in on_cpu.reserved
    assert "features" not in capsys.readouterr().out
    cfg = _config(offload="all", memory_budget="3.5GB")
    assert not placement.features_stay(cfg, torch.device("cpu"), 10, 10**9, lambda room: 0)
    assert not placement.features_stay(cfg, GPU, 10, 10**9, None)
    assert not placement.features_stay(cfg, GPU, 10**9, 10**9, lambda room: 0), "they must fit"
    assert placement.features_stay(cfg, GPU, 10, 10**9, lambda room: 0)
    assert offload.offload_bus_bytes(TOPOLOGY, 64, "fp32", 10**8) == math.inf, "not even a column's blocks fit"
    assert not placement.features_stay(cfg, GPU, 10, 10**9, lambda room: math.inf), "nor beside them"


@pytest.mark.parametrize("precision, budget", [("fp32", "3.5GB"), ("fp32", "2GB"), ("bf16", "1GB")])
def test_a_slice_kept_by_offload_all_leaves_the_rank_a_plan_of_few_chunks_under_the_budget(
    precision: str, budget: str, monkeypatch
) -> None:
    """Where ``--offload all`` keeps the slice on the GPU, the rank's chunk plan (made after the layout, from the
    same parts) accepts the budget, and the topology it streams comes in at least :data:`STREAMED_CHUNKS` chunks and
    about :data:`STAYING_CHUNKS` at most (the chunk the layout left room for: a 32nd of their working set). Products'
    degrees: about 50 a vertex, one of 17,000."""
    degrees = torch.from_numpy(np.random.default_rng(0).poisson(E / N, N))
    degrees[0] = 17_000
    topology = SimpleNamespace(
        num_nodes=N,
        num_edges=int(degrees.sum()),
        symmetric=True,
        in_degrees=lambda: degrees,
        out_degrees=lambda: degrees,
    )
    cfg = _config(offload="all", memory_budget=budget, precision=precision)
    placed = _placed(cfg, monkeypatch)
    ctx = _rank_context(topology, cfg, placed)
    assert ctx.column_block == 0 and ctx.home == GPU and ctx.topology_offload == "all"
    print(f"{precision} {budget}: {ctx.plan.num_chunks} chunks ({ctx.plan.reason})")
    assert STREAMED_CHUNKS <= ctx.plan.num_chunks <= STAYING_CHUNKS + 1, ctx.plan.reason
