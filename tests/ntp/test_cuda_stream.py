"""The NN stage streamed through a GPU in row blocks (``--nn-device stream``), on a machine with one (skipped
elsewhere): it trains as the CPU does, its rows stay in host memory, and a step holds what the plan counts."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ntp.config import TrainConfig
from ntp.engine.distributed.dist import DistEnv
from ntp.engine.train.loop import fit, train_step
from ntp.engine.train.setup import setup
from tests.ntp.graphs import loader, random_graph
from tests.ntp.live_bytes import chunk_bytes, gpu_step_peak

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (run where one is)"),
]

GRAPH = random_graph(n=300, d=17, classes=5, seed=4)
GPU = torch.device("cuda:0")


def step_device_peak(job) -> int:  # noqa: ANN001 (a ntp.engine.train.setup.Job)
    """The GPU's allocation peak over a second training step, above what lived before it (the first warms up)."""
    train_step(job, 0)
    return gpu_step_peak(job)


def _config(**options) -> TrainConfig:
    return TrainConfig(**{"model": "gcn", "epochs": 5, "hidden": 16, "seed": 1, "dropout": 0.5, **options})


def _job(device: torch.device, graph: dict = GRAPH, **options):
    job = setup(_config(**options), DistEnv(0, 1, 0, 1, device, None), loader(graph))
    fit(job, sinks=[])
    return job


@pytest.mark.parametrize(
    "options",
    [
        dict(arch="coupled"),
        dict(arch="coupled", model="sage", hidden=24),
        dict(arch="coupled", model="gin", nn_layers=3),
        dict(arch="decoupled", model="appnp"),
        dict(arch="decoupled", norm="layer"),
        dict(arch="coupled", offload="all", memory_budget="2MB"),
        dict(arch="coupled", offload="topology", chunk_rows=64),
    ],
    ids=lambda o: "-".join(map(str, o.values())),
)
def test_a_streamed_nn_stage_trains_on_the_gpu_as_on_the_cpu(options: dict) -> None:
    """Blocks of 64 rows (five of them, the last short) on the GPU, its rows in pinned host memory: the losses of
    the in-memory stage on the CPU, dropout included (the blocks redraw the CPU's masks in the backward)."""
    job = _job(GPU, nn_device="stream", nn_block_rows=64, **options)
    assert job.ctx.streams_rows and job.ctx.nn_device.type == "cpu"
    stay = options.get("offload") == "all"  # the budget holds the features beside the rest: they stay on the GPU
    assert job.x.is_cuda if stay else job.x.is_pinned(), job.x.device
    assert all(p.is_cuda for p in job.model.parameters())
    cpu = {k: v for k, v in options.items() if k not in ("offload", "memory_budget", "chunk_rows")}
    np.testing.assert_allclose(
        [r.loss for r in job.history], [r.loss for r in _job(torch.device("cpu"), **cpu).history], rtol=1e-4
    )


@pytest.mark.parametrize(
    "options",
    [
        dict(arch="coupled"),
        dict(arch="coupled", precision="bf16"),
        dict(arch="coupled", nn_layers=3, jk="cat"),
        dict(arch="decoupled", nn_layers=3),
        dict(arch="decoupled", model="appnp"),
    ],
    ids=lambda o: "-".join(map(str, o.values())),
)
def test_a_streamed_step_holds_about_one_block_on_the_gpu(options: dict) -> None:
    """100k rows in blocks of 10k: a step's device peak (above what lived before it) is at most the plan's peak but
    the topology, with a chunk (ntp.engine.memory.phases.peak_bytes); and well under the in-device stage's (the rows
    are on the host)."""
    from ntp.engine.device.precision import element_bytes
    from ntp.engine.memory.parts import rank_resident_parts
    from ntp.engine.memory.phases import peak_bytes

    graph = random_graph(n=100_000, d=128, classes=8, avg_degree=10, seed=5)
    measured = {}
    for where in ("device", "stream"):
        cfg = _config(hidden=64, nn_device=where, nn_block_rows=10_000 if where == "stream" else 0, **options)
        job = setup(cfg, DistEnv(0, 1, 0, 1, GPU, None), loader(graph))
        measured[where] = step_device_peak(job)
    topo = job.ctx.topology
    parts = rank_resident_parts(
        cfg,
        num_nodes=100_000,
        num_edges=topo.num_edges,
        feature_dim=128,
        out_dim=8,
        world=1,
        params=sum(p.numel() for p in job.model.parameters()),
        nn_on_device=True,
        symmetric=topo.symmetric,
        row_block=10_000,
    )
    chunk = chunk_bytes(job, element_bytes=element_bytes(cfg.precision), device_type="cuda")
    parts.pop("topology")
    planned = peak_bytes(parts, chunk)
    print(
        f"streamed step {measured['stream'] / 1e6:.1f} MB, planned {planned / 1e6:.1f} MB "
        f"({planned / measured['stream']:.2f}x), in-device "
        f"{measured['device'] / 1e6:.1f} MB ({options})"
    )
    assert measured["stream"] <= planned, (measured, parts, chunk)
    assert measured["stream"] < 0.8 * measured["device"], measured


def test_rows_cross_between_a_column_major_host_slice_and_the_gpu_unchanged() -> None:
    """``--offload all``'s column slice lies column by column in pinned host memory: rows taken from it reach the GPU
    through a pinned staging copy, and rows put into it arrive there, waiting for their copy (``put_rows``) or not
    (``Downloads.put_rows``, spread on leaving)."""
    from ntp.engine.device import transfer

    rows = torch.randn(1000, 7, device=GPU)
    host = transfer.layout_empty(1000, 7, rows.dtype, torch.device("cpu"), GPU)
    assert host.is_pinned() and transfer.is_column_major(host) and not host.is_contiguous()
    transfer.put_rows(host, 0, rows[:300])
    with transfer.Downloads(GPU) as downloads:
        for a in range(300, 1000, 128):
            downloads.put_rows(host, a, rows[a : min(a + 128, 1000)])
    assert torch.equal(host, rows.cpu())
    taken = transfer.rows_on(host, 250, 777, GPU)
    assert taken.is_cuda and taken.is_contiguous() and torch.equal(taken, rows[250:777])
