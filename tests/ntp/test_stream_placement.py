"""Where a streamed NN stage's parts go on a GPU (``--nn-device stream``; ntp.engine.memory.placement), planned at
ogbn-products' shape on one GPU (2.4M vertices, 124M edges, 100 features, 47 classes, coupled GCN, hidden 64): the
NN block leaves ``--offload all`` the room to keep the topology on the device, and the input features stay there
only where aggregation then moves no more bytes over the bus. Planned only: nothing runs on a device (the GPU's
runs are tests/ntp/test_cuda_stream.py's)."""

from __future__ import annotations

import math
from functools import partial
from types import SimpleNamespace

import pytest
import torch

from ntp.config import TrainConfig
from ntp.engine.distributed.collectives import Comm
from ntp.engine.distributed.partition import Partition
from ntp.engine.memory import offload, parts, placement
from ntp.engine.memory.offload import offloaded_layout
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


def test_a_streamed_nn_block_leaves_offload_all_the_room_to_keep_the_topology() -> None:
    """Under ``--offload all --memory-budget 2GB`` the NN block holds at most :data:`STREAM_BLOCK_ROWS` rows and the
    topology stays on the device beside it. The block is not alive in a product (ntp.engine.memory.phases), so the
    product's column blocks take the room it leaves there: wider blocks than where the block's bytes were taken
    from the product's room (18 columns in float32, 4 blocks a product; now 29, 3 blocks; bfloat16 has 32, two
    blocks that overlap, either way)."""
    for precision in ("fp32", "bf16"):
        cfg = _config(offload="all", memory_budget="2GB", precision=precision)
        block, resident = stream_parts(cfg, **SHAPE, device_type="cuda", symmetric=True, room=cfg.memory_budget_bytes)
        assert block == STREAM_BLOCK_ROWS
        room, segment = cfg.memory_budget_bytes - resident["parameters"], resident["NN block"]
        columns, kept = offloaded_layout(N, E, 64, room, precision, symmetric=True, segment=segment)
        assert kept and columns >= 8, (precision, columns)
        narrower = offloaded_layout(N, E, 64, room - segment, precision, symmetric=True)[0]
        assert columns > narrower if precision == "fp32" else columns == narrower == 32, (precision, columns)
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


@pytest.mark.parametrize(
    "precision, budget, stay",
    [
        ("fp32", "3.5GB", True),  # beside them, the topology and blocks of 32 columns
        ("bf16", "2GB", True),  # 0.49 GB, the topology still kept
        ("fp32", "2GB", False),  # 0.98 GB: the topology would stream once a column block
        ("fp32", "6GB", False),  # the slice stays on the device without them, and would stream with them
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
    ctx = GraphContext(
        TOPOLOGY,
        Comm(Partition(N, 1, 0), GPU),
        memory_budget=cfg.memory_budget_bytes,
        width=64,
        offload="all",
        reserved=placed.reserved,
        precision=precision,
        row_block=placed.row_block,
    )
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
