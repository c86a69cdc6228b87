"""The CUDA path, on a machine with a GPU (skipped elsewhere): one rank on the GPU trains like one on the CPU, with
and without offloaded topology and embeddings."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch

from ntp.config import TrainConfig
from ntp.engine.distributed.dist import DistEnv
from ntp.engine.memory.offload import offload_room
from ntp.engine.train.loop import fit
from ntp.engine.train.setup import setup
from tests.ntp.graphs import loader, random_graph
from tests.ntp.live_bytes import LINK_SLACK, PLAN_SLACK, chunk_bytes, gpu_step_peak, held_bytes

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (run where one is)"),
]

GRAPH = random_graph(n=300, d=17, classes=5, seed=4)


def _config(**options) -> TrainConfig:
    return TrainConfig(**{"model": "gcn", "epochs": 6, "hidden": 16, "seed": 1, "dropout": 0.0, **options})


def _job(device: str, graph: dict = GRAPH, **options):
    env = DistEnv(0, 1, 0, 1, torch.device(device), None)
    job = setup(_config(**options), env, loader(graph))
    fit(job, sinks=[])
    return job


def _losses(device: str, graph: dict = GRAPH, **options) -> list[float]:
    return [r.loss for r in _job(device, graph, **options).history]


@pytest.mark.parametrize(
    "options",
    [
        dict(),
        dict(chunk_rows=64),
        dict(chunk_rows=64, offload="topology"),
        dict(chunk_rows=64, offload="all"),
        dict(nn_device="cpu"),
        dict(dropout=0.5),
        dict(dropout=0.3, arch="decoupled"),
    ],
)
def test_one_gpu_rank_trains_like_the_cpu(options: dict) -> None:
    """With dropout too: the GPU drops the elements the CPU drops."""
    cpu = {k: v for k, v in options.items() if k in ("dropout", "arch")}
    np.testing.assert_allclose(_losses("cuda:0", **options), _losses("cpu", **cpu), rtol=1e-4)


@pytest.mark.parametrize("columns, topology_kept, block", [(8, False, 8), (8, True, 8), (16, True, 0)])
def test_offloaded_embeddings_stream_through_the_gpu_in_column_blocks(
    columns: int, topology_kept: bool, block: int
) -> None:
    """A budget too small for the embeddings on the device: they live in pinned host memory and each product copies
    them through the GPU in blocks of 8 columns, over a topology kept on the device (where the blocks come one ahead
    of the compute) or streamed per block; the losses stay the CPU's. The room to stream the whole 16-column slice
    in two blocks beside the topology holds the slice itself beside a chunk: it stays on the device then, and the
    topology streams (ntp.engine.memory.offload.offloaded_layout). The NN stage runs on the host: on one rank whose
    NN stage is on the GPU the slice is its rows, which stay there (ntp.engine.memory.parts.slice_is_rows). The
    budget is the room ``--offload all`` needs for ``columns`` (``offload_room``: the block's columns and a slab in
    transit, the chunks, and the topology where it stays)."""
    n = GRAPH["x"].shape[0]
    options = dict(arch="coupled", offload="all", nn_device="cpu")
    probe = setup(_config(**options), DistEnv(0, 1, 0, 1, torch.device("cuda:0"), None), loader(GRAPH))
    assert sum(probe.ctx.reserved.values()) == 0, "the NN stage is on the host"
    budget = f"{offload_room(n, probe.ctx.topology.num_edges, columns, topology_kept=topology_kept)}B"
    job = _job("cuda:0", **options, memory_budget=budget)
    assert job.ctx.column_block == block and job.ctx.home.type == ("cpu" if block else "cuda")
    assert (job.ctx.device_topology_bytes() > 0) == (topology_kept and block > 0)
    np.testing.assert_allclose([r.loss for r in job.history], _losses("cpu", arch="coupled"), rtol=1e-4)


@pytest.mark.parametrize("depth", [1, 2])
def test_column_blocks_cross_the_gpu_in_order_while_the_compute_stream_lags(depth: int, monkeypatch) -> None:
    """``transfer.stream_columns`` on a GPU: 5 blocks of 7-8 columns, 3 slabs each way, and a compute stream held
    back before each block (``torch.cuda._sleep``), so a copy that did not wait for its event would overwrite a
    block still being computed on, or read an output not yet written: every block still lands in its columns. The
    device holds no more than the memory plan counts (``placement.streamed_bytes``)."""
    from ntp.engine.device import transfer
    from ntp.engine.kernels import cuda_transpose
    from ntp.engine.memory.parts import streamed_bytes

    monkeypatch.setattr(transfer, "SLAB_BYTES", 3 * 10_000 * 4)
    h = transfer.host_columns(torch.randn(10_000, 37), pinned=True)
    out = transfer.host_empty(37, 10_000, dtype=h.dtype, pinned=True).t()
    blocks = transfer.even_blocks(37, 8)

    def compute(x: torch.Tensor, y: torch.Tensor) -> None:
        torch.cuda._sleep(2_000_000)  # about a millisecond: the side streams run ahead
        torch.add(x, 1, out=y).mul_(2)

    cuda_transpose.works(torch.device("cuda:0"))  # its once-per-GPU check allocates: before the count
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    transfer.stream_columns(h, out, torch.device("cuda:0"), blocks, depth, compute)
    assert len(blocks) == 5 and torch.equal(out, (h + 1) * 2)
    held = torch.cuda.max_memory_allocated() - before
    assert held <= streamed_bytes(10_000, 8, 4, depth) + 4 * 512  # the allocator's 512-byte rounding


@functools.cache
def _large_graph() -> dict:
    """Large enough that the allocator's rounding and cuBLAS's workspace are small beside a step (100k vertices)."""
    return random_graph(n=100_000, d=128, classes=8, avg_degree=10, seed=5)


@pytest.mark.parametrize(
    "options",
    [
        dict(arch="coupled"),
        dict(arch="coupled", precision="bf16"),
        dict(arch="coupled", model="sage"),
        dict(arch="coupled", model="gin"),
        dict(arch="decoupled", nn_layers=3),
    ],
    ids=lambda o: "-".join(map(str, o.values())),
)
def test_a_training_step_on_one_gpu_stays_within_the_memory_plan(options: dict) -> None:
    """What a step allocates on the GPU (the caching allocator's peak above what lived before it, plus the features,
    the parameters and Adam's moments, as tests/ntp/test_memory_estimate.py counts on a CPU) is at most what the plan
    gives it, and the plan at most 10 % more: its parts but the topology, and the one chunk's edges
    (ntp.engine.memory.chunks.degree_costs; its output rows are the NN stage's on one rank). On one rank the slice is the NN stage's rows and counts once
    (ntp.engine.memory.parts.slice_is_rows), in float32 and bfloat16."""
    from ntp.engine.memory.parts import rank_resident_parts
    from ntp.engine.train.loop import train_step

    cfg = _config(hidden=64, dropout=0.5, **options)
    job = setup(cfg, DistEnv(0, 1, 0, 1, torch.device("cuda:0"), None), loader(_large_graph()))
    train_step(job, 0)  # cuBLAS's workspace and the optimiser's state exist from here on
    measured = _step_bytes(job)
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
    )
    chunk = chunk_bytes(job, width=0)  # its output rows are the NN stage's on one rank
    planned = sum(parts.values()) - parts["topology"] + chunk
    print(f"memory plan {options}: step {measured / 1e6:.1f} MB, planned {planned / 1e6:.1f} MB", flush=True)
    assert measured <= planned <= PLAN_SLACK * measured, (measured, chunk, parts)


def _step_bytes(job) -> int:
    """What a training step allocates on the GPU: the caching allocator's peak above what lived before it
    (tests/ntp/live_bytes.gpu_step_peak), plus what the plan counts that lived before it besides the topology: the
    features, the parameters and the optimiser's state (as tests/ntp/test_memory_estimate.py counts on a CPU)."""
    return gpu_step_peak(job) + held_bytes(job)


@pytest.mark.parametrize(
    "features, precision",
    [(True, "fp32"), (False, "fp32"), (False, "bf16")],
    ids=["features", "learned", "learned-bf16"],
)
def test_a_link_step_on_one_gpu_stays_within_its_memory_plan(features: bool, precision: str) -> None:
    """Link prediction's plan (ntp.engine.tasks.link.memory) on a GPU, whose chunks of pairs are 16 times a CPU's: a
    step's allocator peak (above what lived before it, plus the features, parameters and Adam's moments) is at most
    its parts but the topology and one chunk of propagation, and they at most LINK_SLACK times it; and the GPU trains
    as the CPU does (in bf16, within its rounding)."""
    from ntp.engine.tasks.link import memory as link_memory
    from ntp.engine.tasks.link.task import memory_shape
    from ntp.engine.train.loop import train_step
    from tests.ntp.link_worker import link_graph, link_loader

    graph = link_graph(n=50_000, d=64, edges=400_000, seed=2)
    cfg = _config(hidden=64, dropout=0.5, mode="tp", precision=precision)
    first = {}
    for device in ("cpu", "cuda:0"):  # the GPU's job stays: cuBLAS's workspace and Adam's state exist after a step
        job = setup(cfg, DistEnv(0, 1, 0, 1, torch.device(device), None), link_loader(graph, features))
        first[device] = train_step(job, 0)
    measured = _step_bytes(job)
    parts = link_memory.resident_parts(cfg, **memory_shape(job.data, job.model, 1, "cuda"))
    chunk = chunk_bytes(job, width=0)
    planned = sum(parts.values()) - parts["topology"] + chunk
    print(f"memory plan link {features=} {precision}: step {measured / 1e6:.1f} MB, planned {planned / 1e6:.1f} MB")
    assert measured <= planned <= LINK_SLACK * measured, (measured, chunk, parts)
    np.testing.assert_allclose(first["cuda:0"], first["cpu"], rtol=1e-4 if precision == "fp32" else 1e-2)


@pytest.mark.parametrize("features", [True, False], ids=["features", "learned"])
def test_a_link_encoder_on_the_host_trains_like_the_cpu(features: bool) -> None:
    """``--nn-device cpu`` for link prediction: the encoder (and its input) on the host, the decoder and the learned
    embeddings' slice on the GPU with the graph layout; the losses are the CPU's."""
    from tests.ntp.link_worker import link_graph, link_loader

    graph = link_graph(n=400, d=12, edges=2_000, seed=3)
    losses, jobs = {}, {}
    for device, nn_device in (("cpu", "auto"), ("cuda:0", "cpu")):
        cfg = _config(epochs=3, dropout=0.5, mode="single", nn_device=nn_device, link_batch=256)
        jobs[device] = job = setup(cfg, DistEnv(0, 1, 0, 1, torch.device(device), None), link_loader(graph, features))
        fit(job, sinks=[])
        losses[device] = [r.loss for r in job.history]
    job = jobs["cuda:0"]
    assert job.ctx.nn_device.type == "cpu" and job.x.device.type == "cpu"
    assert {p.device.type for p in job.model.encoder.parameters()} == {"cpu"}
    assert {p.device.type for p in job.model.decoder.parameters()} == {"cuda"}
    assert job.ctx.reserved["NN stage"] == 0, "the encoder's rows are host memory: the GPU's plan leaves them out"
    np.testing.assert_allclose(losses["cuda:0"], losses["cpu"], rtol=1e-4)


def _sum_gradients_on_two_devices() -> list:
    from ntp.engine.distributed.collectives import Comm, all_reduce_gradients
    from ntp.engine.distributed.dist import distributed
    from ntp.engine.distributed.partition import Partition

    with distributed(60, "cpu") as env:  # gloo, whose all-reduce takes CUDA tensors: two ranks on one GPU
        comm = Comm(Partition(10, env.world, env.rank), torch.device("cuda:0"))
        params = [torch.nn.Parameter(torch.zeros(3)), torch.nn.Parameter(torch.zeros(2, device="cuda:0"))]
        for i, p in enumerate(params):
            p.grad = torch.full_like(p, float(env.rank + 1 + 10 * i))
        all_reduce_gradients(params, comm)
        return [(p.grad.device.type, p.grad.cpu().tolist()) for p in params]


def test_gradients_on_the_host_and_the_gpu_are_summed_over_ranks() -> None:
    """A link job's encoder on the host and its decoder on the GPU: one flat all-reduce over both (torch.cat of
    tensors on two devices raised before), each gradient back on its parameter's device."""
    from tests.ntp.spawn import run_on_ranks

    for rank in run_on_ranks(_sum_gradients_on_two_devices, 2):
        assert rank == [("cpu", [3.0] * 3), ("cuda", [23.0] * 2)]


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_rgcn_on_one_gpu_trains_like_the_cpu(precision: str) -> None:
    """R-GCN with features and with R-GCN's one-hot first layer (basis tables): the GPU's losses are the CPU's (in
    bf16 within its rounding; CUDA's own index_add would sum bfloat16 messages in bfloat16, rgcn.add_rows does not)."""
    from tests.ntp.hetero_worker import featureless, hetero_graph, hetero_loader

    graph = hetero_graph(seed=1)
    for g, extra in ((graph, {}), (featureless(graph), dict(decomposition="basis", num_bases=2))):
        losses = {}
        for device in ("cpu", "cuda:0"):
            cfg = TrainConfig(
                model="rgcn", arch="coupled", hidden=10, epochs=4, seed=3, mode="single", precision=precision, **extra
            )
            job = setup(cfg, DistEnv(0, 1, 0, 1, torch.device(device), None), hetero_loader(g))
            fit(job, sinks=[])
            losses[device] = [r.loss for r in job.history]
        np.testing.assert_allclose(losses["cuda:0"], losses["cpu"], rtol=1e-4 if precision == "fp32" else 1e-2)


def test_a_bare_cuda_device_is_the_current_gpu() -> None:
    """``cuda`` without an index is the current GPU: the products then see their input where they are (a bare
    ``cuda`` once compared unequal to ``cuda:0`` and sent every product through host memory)."""
    assert DistEnv(0, 1, 0, 1, torch.device("cuda"), None).device == torch.device("cuda", torch.cuda.current_device())
    np.testing.assert_allclose(_losses("cuda", chunk_rows=64, offload="all"), _losses("cpu"), rtol=1e-4)


def test_the_gpu_draws_the_masks_the_cpu_draws() -> None:
    """A mask is integer arithmetic on a stream of words: torch's ops on the GPU (where its kernel does not drop)
    draw the bits numpy draws on the CPU."""
    from ntp.engine.kernels.masks import keep_mask, stream_keep_mask

    for rows, width, p, stream in (
        ((0, 1013), 37, 0.4, 2**70 + 5),
        ((5_000, 9_000), 256, 0.5, 3),
        ((7, 900), 19, 0.25, 2**63 + 1),
    ):
        gpu = keep_mask(rows, width, p, stream, torch.device("cuda:0"))
        assert torch.equal(gpu.cpu(), stream_keep_mask(rows, width, p, stream))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("p", [0.5, 0.25, 0.4])
@pytest.mark.parametrize("kernel", [True, False], ids=["triton", "torch ops"])
def test_the_gpu_drops_in_one_pass_what_the_cpu_drops(monkeypatch, dtype: torch.dtype, p: float, kernel: bool) -> None:
    """The Triton kernel (and, with ``NTP_NATIVE=0``, torch's ops) drop on the GPU the elements the CPU drops, to
    the same values forward and backward: whole rows, and a column slice of a wider mask with a row stride."""
    from ntp.engine.kernels import cuda_dropout
    from ntp.engine.kernels.dropout import drop, one_pass

    if not kernel:
        monkeypatch.setenv("NTP_NATIVE", "0")
    x, grad = torch.randn(1013, 41).to(dtype), torch.randn(1013, 41).to(dtype)
    x[3, 4], x[5, 6] = float("nan"), float("inf")
    assert one_pass(x.cuda()) == kernel, "Triton's kernel runs on this GPU" if kernel else "NTP_NATIVE=0 holds"
    assert cuda_dropout.works(torch.device("cuda:0")) == kernel
    for cut, relu, column, width in ((slice(None), True, 0, None), (slice(3, 40), False, 3, 41)):
        results = []
        for device in ("cpu", "cuda:0"):
            leaf = x.to(device, copy=True).requires_grad_()
            y = drop(leaf[:, cut], p, 77, 17, relu, column=column, width=width)
            y.backward(grad[:, cut].to(device))
            results.append((y.detach().cpu(), leaf.grad.cpu()))
        for a, b in zip(*results):
            torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_gpu_drops_and_scales_like_the_cpu(dtype: torch.dtype) -> None:
    """CUDA applies a mask in one fused pass (torch's dropout backward kernel), the CPU in a conversion and two
    products: the same values forward and backward."""
    from ntp.engine.kernels.dropout import dropped

    x, grad, keep = torch.randn(1000, 37).to(dtype), torch.randn(1000, 37).to(dtype), torch.rand(1000, 37) > 0.3
    results = []
    for device in ("cpu", "cuda:0"):
        leaf = x.to(device, copy=True).requires_grad_()  # a leaf on each device
        y = dropped(leaf, keep, 0.3)
        y.backward(grad.to(device))
        results.append((y.detach().cpu(), leaf.grad.cpu()))
    assert all(torch.equal(a, b) for a, b in zip(*results))


def test_bf16_on_the_gpu_trains_close_to_fp32_with_float32_sums() -> None:
    """A bf16 run on the GPU forbids cuBLAS's bfloat16 split-K reductions for its process and trains close to the
    fp32 run (the losses of six epochs within 0.5 %; 0.004 % apart on a CPU)."""
    matmul = torch.backends.cuda.matmul
    before = matmul.allow_bf16_reduced_precision_reduction
    try:
        low = _losses("cuda:0", precision="bf16")
        assert not matmul.allow_bf16_reduced_precision_reduction
        np.testing.assert_allclose(low, _losses("cuda:0"), rtol=5e-3)
    finally:
        matmul.allow_bf16_reduced_precision_reduction = before


def test_a_bf16_product_on_the_gpu_gathers_its_edge_values_in_bf16() -> None:
    """A bfloat16 product's edge values (``pre`` of every edge's source) are made in bfloat16, 2 bytes an edge, and
    equal float32 values cast: the allocator's peak above its input and output stays under 4 bytes an edge (made in
    float32 and cast they took 6); the result is the float32 product's within bfloat16's rounding."""
    from ntp.engine.graph.aggregate import RowBlocks
    from ntp.engine.graph.operators import Scaling

    n, degree, width = 20_000, 200, 8
    gen = torch.Generator().manual_seed(0)
    indptr = torch.arange(0, n * degree + 1, degree, dtype=torch.int64)
    indices = torch.randint(0, n, (n * degree,), generator=gen, dtype=torch.int32)
    dev = torch.device("cuda:0")
    blocks = RowBlocks(indptr, indices, [0, n], dev)
    scaling = Scaling(pre=torch.rand(n, generator=gen).to(dev))
    h = torch.randn(n, width, generator=gen).to(dev)
    low = h.bfloat16()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    y = blocks.matmul(low, scaling)
    torch.cuda.synchronize()
    extra = torch.cuda.max_memory_allocated() - before - y.numel() * y.element_size()
    assert extra < 4 * indices.numel(), extra
    np.testing.assert_allclose(y.float().cpu(), blocks.matmul(low.float(), scaling).cpu(), rtol=2e-2, atol=0.1)


def test_a_streamed_topology_is_copied_from_its_own_locked_pages(tmp_path, monkeypatch) -> None:
    """``--offload topology``: the host topology's pages are locked once, read-only, so each chunk goes to the GPU
    without a staging copy; a shared mapping of it (as the ranks of a machine share it) keeps the file's pages, no
    private copy of them (a write through the file shows in the mapping and in what the GPU copies from it); and the
    run trains as on the CPU (its 4.8 MB topology locked although smaller than what glibc surely maps apart)."""
    from ntp.engine.device import page_lock
    from ntp.engine.device.page_lock import pin_read_only

    path = tmp_path / "indices.npy"
    np.save(path, np.arange(4 << 20, dtype=np.int32))  # 16 MiB
    mapped = torch.from_numpy(np.load(path, mmap_mode="r+"))  # shared, as local rank 0 maps it
    assert int(mapped.sum()) > 0  # its pages faulted in: a page mapped once counts as private in smaps
    before = _private_dirty()
    assert pin_read_only(mapped, torch.device("cuda:0")) and mapped.is_pinned()
    assert not pin_read_only(torch.arange(1000, dtype=torch.int32), torch.device("cuda:0")), "a few KB are staged"
    assert _private_dirty() - before < 1 << 20, "locking copied no page"
    header = path.stat().st_size - mapped.numel() * 4
    with open(path, "r+b") as f:  # through the file, not the mapping
        f.seek(header + 4 * 2_000_000)
        f.write(np.int32(-7).tobytes())
    assert int(mapped[2_000_000]) == -7, "its pages stay the file's"
    on_gpu = mapped[1000:3_000_000].to("cuda:0", non_blocking=True)
    assert torch.equal(on_gpu.cpu(), mapped[1000:3_000_000]) and int(on_gpu[2_000_000 - 1000]) == -7
    monkeypatch.setattr(page_lock, "_OWN_MAPPING_BYTES", 1 << 20)
    graph = random_graph(n=20_000, d=17, classes=5, avg_degree=60, seed=5)  # 4.8 MB: arrays of their own pages
    job = _job("cuda:0", graph, chunk_rows=4096, offload="topology")
    assert all(blocks._pinned for blocks in job.ctx._blocks)
    np.testing.assert_allclose([r.loss for r in job.history], _losses("cpu", graph), rtol=1e-4)


def _private_dirty() -> int:
    with open("/proc/self/smaps_rollup") as f:
        return sum(int(line.split()[1]) * 1024 for line in f if line.startswith("Private_Dirty:"))
