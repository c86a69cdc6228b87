"""Chunked execution and inter-chunk pipelining never change results; plans fit their budget; bytes are honest."""

from __future__ import annotations

import contextlib
import json
import re

import numpy as np
import pytest
import torch

from ntp.config import TrainConfig
from ntp.engine.distributed.cost import coupled_bytes, decoupled_bytes
from ntp.engine.distributed.dist import DistEnv
from ntp.engine.graph import aggregate
from ntp.engine.graph.aggregate import RowBlocks, SparseOperator, csr_matmul, prescaled
from ntp.engine.graph.operators import CSR, OPERATORS, Scaling, operator_pattern, scaling, with_self_loops
from ntp.engine.graph.topology import Topology, build, from_csr
from ntp.engine.memory.chunks import (
    CHUNK_BYTES,
    EDGE_BYTES,
    ROW_BYTES,
    budget_plan,
    make_plan,
    row_costs,
    source_schedule,
    uniform_plan,
)
from ntp.engine.memory.parts import graph_resident_parts, nn_stage_bytes, rank_resident_parts
from ntp.engine.memory.placement import nn_placement
from ntp.engine.train.loop import fit
from ntp.engine.train.setup import setup
from ntp.errors import ConfigError, MemoryPlanError
from ntp.options import parse_bytes
from storage.csr import transpose_indices
from tests.ntp.exactness_worker import trace_all
from tests.ntp.graphs import graph_budget, loader, random_graph
from tests.ntp.spawn import run_on_ranks
from tests.ntp.test_exactness import assert_close_to_scale

SINGLE = DistEnv(0, 1, 0, 1, torch.device("cpu"), None)
EPOCHS = 2
BASE = dict(hidden=10, heads=2, nn_layers=2, prop_steps=3, dropout=0.5, lr=0.05, seed=3)
MODELS = [dict(BASE, model=m, arch="decoupled") for m in ("gcn", "appnp", "sage", "gin", "gat")] + [
    dict(BASE, model=m, arch="coupled") for m in ("gcn", "gat")
]
DIRECTED = random_graph(n=100, d=17, classes=5, directed=True, seed=1)


def _topology(graph: dict) -> Topology:
    src, dst = graph["edge_index"]
    n = graph["x"].shape[0]
    order = np.argsort(dst, kind="stable")
    indptr = np.zeros(n + 1, np.int64)
    np.cumsum(np.bincount(dst, minlength=n), out=indptr[1:])
    return from_csr(indptr, src[order])


def _csr(graph: dict) -> CSR:
    topo = _topology(graph)
    return CSR(topo.indptr, topo.indices.long(), topo.num_nodes)


def _gcn(topo: Topology, bounds: list[int] | None = None, offload: str = "none") -> SparseOperator:
    """The GCN operator of ``topo`` cut at ``bounds`` (default: one chunk)."""
    bounds = bounds or [0, topo.num_nodes]
    cpu = torch.device("cpu")
    forward = RowBlocks(topo.indptr, topo.indices, bounds, cpu, offload)
    backward = RowBlocks(topo.t_indptr, topo.t_indices, bounds, cpu, offload)
    return SparseOperator(forward, backward, scaling(topo, "gcn"))


def assert_same_run(ours: dict, ref: dict, where: str) -> None:
    torch.testing.assert_close(
        torch.tensor(ours["losses"]),
        torch.tensor(ref["losses"]),
        rtol=1e-5,
        atol=1e-6,
        msg=lambda m: f"losses differ: {where}\n{m}",
    )
    for name, g in ref["grads"].items():
        assert_close_to_scale(ours["grads"][name], g, f"gradient of {name}: {where}")


# -- configuration -------------------------------------------------------------------------------------------------
def test_memory_budget_parses_units_and_rejects_nonsense() -> None:
    assert parse_bytes("8GB") == 8 * 10**9 and parse_bytes("512MiB") == 512 << 20 and parse_bytes("") == 0
    assert TrainConfig(memory_budget="1.5GB").memory_budget_bytes == 1_500_000_000
    for bad in ("8 gigs", "lots", "0MB", "-1GB"):
        with pytest.raises(ConfigError, match="--memory-budget .* e.g. --memory-budget 8GB"):
            TrainConfig(memory_budget=bad)
    with pytest.raises(ConfigError, match="--overlap .* use --mode tp"):
        TrainConfig(overlap=True, mode="data")
    with pytest.raises(ConfigError, match="--offload .* use --mode tp"):
        TrainConfig(offload="all", mode="data")
    with pytest.raises(ConfigError, match="attention .* use --offload none"):
        TrainConfig(offload="topology", model="gat")
    with pytest.raises(ConfigError, match="--offload 'yes' is not valid; choose one of: none, topology, all"):
        TrainConfig(offload="yes")
    saved_before_levels = {**TrainConfig().to_dict(), "offload": True}  # checkpoints and models of older versions
    assert TrainConfig.from_dict(saved_before_levels).offload == "topology"


# -- plans ---------------------------------------------------------------------------------------------------------
def test_budget_plan_chunks_are_the_largest_that_fit() -> None:
    csr = _csr(DIRECTED)
    width = 3
    costs = row_costs(csr.indptr, csr.indices, csr.num_nodes, width)
    for budget in (int(costs.max()) + CHUNK_BYTES, 2_000, 10_000, int(costs.sum()) + CHUNK_BYTES):
        plan = budget_plan(csr.indptr, csr.indices, csr.num_nodes, width, budget)
        assert plan.bounds[0] == 0 and plan.bounds[-1] == csr.num_nodes
        rows = budget - CHUNK_BYTES  # a chunk's own bytes besides its rows'
        for a, b in plan.ranges():
            assert costs[a:b].sum() <= rows, f"chunk [{a}, {b}) exceeds {budget}"
            if b < csr.num_nodes:
                assert costs[a : b + 1].sum() > rows, "a chunk could have taken one more row"
    assert budget_plan(csr.indptr, csr.indices, csr.num_nodes, width, int(costs.sum()) + CHUNK_BYTES).num_chunks == 1
    with pytest.raises(MemoryPlanError, match="raise --memory-budget to at least"):
        budget_plan(csr.indptr, csr.indices, csr.num_nodes, width, int(costs.max()) + CHUNK_BYTES - 1)


def test_only_pipelined_chunks_count_a_source_row_per_edge() -> None:
    """The sparse kernels read their input where it lies; the pipelined loops (ntp.engine.parallel.overlap) receive each
    chunk's new source rows, up to one per edge, so only their plan counts them (and cuts more chunks)."""
    from ntp.engine.distributed.collectives import Comm
    from ntp.engine.distributed.partition import Partition
    from ntp.engine.parallel.context import GraphContext

    csr, width = _csr(DIRECTED), 3
    plain, piped = (row_costs(csr.indptr, csr.indices, csr.num_nodes, width, pipelined=p) for p in (False, True))
    deg = np.maximum(np.diff(csr.indptr.numpy()), np.bincount(csr.indices.numpy(), minlength=csr.num_nodes)) + 1
    assert np.array_equal(piped - plain, deg * 4 * width)
    topo = _topology(DIRECTED)
    comm = Comm(Partition(topo.num_nodes, 2, 0), torch.device("cpu"))
    plans = [GraphContext(topo, comm, memory_budget=12_600, width=2 * width, overlap=o).plan for o in (False, True)]
    assert plans[1].num_chunks > plans[0].num_chunks > 1


def test_a_budget_bounds_the_whole_rank_and_names_what_does_not_fit() -> None:
    """``--memory-budget`` is the rank's, not aggregation's: the chunks get what the resident parts leave, and a
    budget that leaves them nothing names every part and the ways out."""
    topo = _topology(DIRECTED)
    deg = topo.in_degrees().numpy(), topo.out_degrees().numpy()
    width, budget = 3, 10_000
    alone = make_plan(*deg, memory_budget=budget, width=width)
    shared = make_plan(*deg, memory_budget=budget, width=width, resident={"topology": 4_000, "NN stage": 2_000})
    assert shared.bounds == make_plan(*deg, memory_budget=budget - 6_000, width=width).bounds
    assert shared.num_chunks > alone.num_chunks and "6KB resident" in shared.reason
    with pytest.raises(MemoryPlanError) as err:
        make_plan(
            *deg,
            memory_budget=budget,
            width=width,
            resident={"topology": 6_000, "embeddings": 3_000, "NN stage": 2_000},
        )
    message = str(err.value)
    for part in (
        "topology 5.86KB",
        "embeddings 2.93KB",
        "NN stage 1.95KB",
        "raise --memory-budget to at least",
        "--offload topology",
        "--nn-device cpu",
        "more ranks",
    ):
        assert part in message, message


def test_a_streamed_nn_block_leaves_the_chunks_its_room_but_must_fit_beside_a_segment() -> None:
    """A streamed NN block lives only in the NN stage's segments, a product's float32 copies only in the product
    (ntp.engine.memory.phases): the chunks get the room beside all but the block, and a budget whose segment cannot
    hold the block fails naming it and the smallest budget that works, which then plans."""
    topo = _topology(DIRECTED)
    deg = topo.in_degrees().numpy(), topo.out_degrees().numpy()
    width, budget = 3, 10_000
    stays = {"topology": 4_000, "parameters": 1_000}
    with_copy = {**stays, "float32 product input": 1_000}
    plan = make_plan(*deg, memory_budget=budget, width=width, resident={**with_copy, "NN block": 4_000})
    assert plan.bounds == make_plan(*deg, memory_budget=budget, width=width, resident=with_copy).bounds
    assert plan.num_chunks > 1, "the room is the chunks' limit, not the block"
    make_plan(*deg, memory_budget=budget, width=width, resident={**with_copy, "NN block": budget - 5_000})
    with pytest.raises(MemoryPlanError) as err:  # the product's copy is not alive beside the block
        make_plan(*deg, memory_budget=budget, width=width, resident={**with_copy, "NN block": budget - 4_999})
    assert "NN block" in str(err.value), err.value
    minimum = re.search(r"at least ([0-9.]+[KMG]?B)", str(err.value)).group(1)
    make_plan(*deg, memory_budget=parse_bytes(minimum), width=width, resident={**with_copy, "NN block": 5_001})


def test_a_chunk_is_planned_as_its_device_runs_it() -> None:
    """A chunk's bytes per edge and output rows follow its kernel (ntp.engine.graph.aggregate.csr_matmul): a CPU's bag
    sum reads the topology's indices and gathers a value per edge (and the bag's index of it) at most, about nothing
    an edge where the product scales its rows once (a graph with as many edges as a quarter of the slice's elements:
    aggregate.scales_rows), and makes its own output rows, which in a product of one chunk are the product's output
    (counted as embeddings); a GPU's float32 product writes into the output's rows, its bfloat16 product and the
    pipelined loops make their own; an unknown kernel is bounded. A chunk holds CHUNK_BYTES besides its rows'."""
    from ntp.engine.memory.chunks import CPU_EDGE_BYTES, CPU_SCALED_EDGE_BYTES, degree_costs, one_chunk_bytes

    topo = _topology(DIRECTED)
    in_deg, out_deg = topo.in_degrees().numpy(), topo.out_degrees().numpy()
    edges = np.maximum(in_deg, out_deg).astype(np.int64) + 1
    width, n = 3, len(in_deg)
    wide = 4 * int(in_deg.sum()) // n + 4  # rows scaled once at 3 columns, not at ``wide``
    expected = {
        ("cpu", 4, False, width): edges * CPU_SCALED_EDGE_BYTES + 4 * width + ROW_BYTES,
        ("cpu", 4, False, wide): edges * CPU_EDGE_BYTES + 4 * wide + ROW_BYTES,
        ("cpu", 4, True, width): edges * (CPU_EDGE_BYTES + 4 * width) + 4 * width + ROW_BYTES,
        ("cuda", 4, False, width): edges * EDGE_BYTES + ROW_BYTES,
        ("cuda", 2, False, width): edges * EDGE_BYTES + 2 * width + ROW_BYTES,
        ("cuda", 4, True, width): edges * (EDGE_BYTES + 4 * width) + 4 * width + ROW_BYTES,
        (None, 4, False, width): edges * EDGE_BYTES + 4 * width + ROW_BYTES,
    }
    for (device_type, eb, piped, w), costs in expected.items():
        got = degree_costs(in_deg, out_deg, w, element_bytes=eb, pipelined=piped, device_type=device_type)
        np.testing.assert_array_equal(got, costs, err_msg=str((device_type, eb, piped, w)))
    cpu_costs = expected["cpu", 4, False, wide]
    alone = one_chunk_bytes(cpu_costs, wide, 4, "cpu", pipelined=False)
    assert alone == cpu_costs.sum() - n * 4 * wide
    assert one_chunk_bytes(cpu_costs, wide, 4, "cpu", pipelined=True) == cpu_costs.sum()
    cpu = torch.device("cpu")
    assert make_plan(in_deg, out_deg, memory_budget=alone + CHUNK_BYTES, width=wide, device=cpu).num_chunks == 1
    split = make_plan(in_deg, out_deg, memory_budget=alone + CHUNK_BYTES - 1, width=wide, device=cpu)
    assert split.num_chunks > 1, "several chunks each make their output rows"
    for a, b in split.ranges():
        assert cpu_costs[a:b].sum() + CHUNK_BYTES <= alone + CHUNK_BYTES - 1


@pytest.mark.parametrize("avg_degree", [2, 40], ids=["values-gathered", "rows-scaled"])
def test_a_cpu_product_holds_at_most_its_planned_chunk(avg_degree: int) -> None:
    """What a CPU product makes beyond its output and its float32 scaled input (parts of their own) is at most the
    plan's largest chunk (``make_plan`` on a CPU: 8 B an edge, 1 where it scales the rows once), in one chunk and
    in several: the bag sum reads the topology's indices, gathers a value per edge where it does not scale the rows
    once, and in several chunks makes each chunk's rows before copying them into the output."""
    from ntp.engine.memory.chunks import degree_costs, one_chunk_bytes
    from tests.ntp.live_bytes import LiveBytes

    topo = _topology(random_graph(n=2_000, avg_degree=avg_degree, directed=True, seed=5))
    deg, width, cpu = (topo.in_degrees().numpy(), topo.out_degrees().numpy()), 16, torch.device("cpu")
    h = torch.randn(topo.num_nodes, width)
    alone = one_chunk_bytes(degree_costs(*deg, width, device_type="cpu"), width, 4, "cpu", pipelined=False)
    alone += CHUNK_BYTES  # the chunk's own: a row pointer more than its rows, its edges' one value, a few scalars
    for budget in (alone, alone // 4):
        plan = make_plan(*deg, memory_budget=budget, width=width, device=cpu)
        assert (plan.num_chunks == 1) == (budget == alone), plan.bounds
        blocks = RowBlocks(topo.indptr, topo.indices, plan.bounds, cpu)
        ops = scaling(topo, "gcn")
        scaled = prescaled(h, ops, topo.num_edges) is not None
        live = LiveBytes()
        with live:
            out = blocks.matmul(h, ops)
        beyond = live.peak - out.numel() * 4 - (h.numel() * 4 if scaled else 0)
        assert 0 <= beyond <= budget, (plan.num_chunks, beyond, budget)
        print(
            f"{plan.num_chunks} chunks, rows scaled {scaled}: {beyond / topo.num_edges:.2f} B an edge beyond the output"
        )
        assert scaled == (avg_degree == 40)


def test_source_schedule_sends_every_vertex_once_and_in_time() -> None:
    pattern = with_self_loops(_csr(random_graph(n=60, directed=True, seed=3)), keep_existing=False)
    plan = uniform_plan(pattern.num_nodes, 7)
    sched = source_schedule(pattern.indptr, pattern.indices, plan)
    csr = _csr(random_graph(n=60, directed=True, seed=3))  # the same without self-loops: own rows are asked for
    assert all(
        torch.equal(a, b)
        for a, b in zip(
            sched.new_sources, source_schedule(csr.indptr, csr.indices.int(), plan, own_rows=True).new_sources
        )
    )
    everything = torch.cat(sched.new_sources)
    assert torch.equal(everything.sort().values, torch.arange(pattern.num_nodes)), "each vertex exactly once"
    received = set()
    for j, (a, b) in enumerate(plan.ranges()):
        received |= set(sched.new_sources[j].tolist())
        needed = set(pattern.indices[int(pattern.indptr[a]) : int(pattern.indptr[b])].tolist())
        assert needed <= received, f"chunk {j} aggregates before its sources arrived"
    plain = source_schedule(pattern.indptr, pattern.indices, plan, send_once=False)
    assert plain.total > sched.total


@pytest.mark.parametrize("offload", ["none", "topology", "all"])
def test_operator_products_do_not_depend_on_chunks(offload: str) -> None:
    topo = _topology(DIRECTED)
    h = torch.randn(topo.num_nodes, 6, requires_grad=True)
    g = torch.randn(topo.num_nodes, 6)
    whole = _gcn(topo)(h)
    (ref_grad,) = torch.autograd.grad(whole, h, g)
    for bounds in ([0, 1, 2, 50, 99, 100], uniform_plan(100, 13).bounds):
        out = _gcn(topo, bounds, offload)(h)
        (grad,) = torch.autograd.grad(out, h, g)
        torch.testing.assert_close(out, whole, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(grad, ref_grad, rtol=1e-6, atol=1e-6)


def _with_self_loops_and_multi_edges(n: int = 100, e: int = 600, seed: int = 0) -> Topology:
    rng = np.random.default_rng(seed)
    src, dst = rng.integers(0, n, e), rng.integers(0, n, e)
    src[:20] = dst[:20]  # self-loops
    src[20:25] = dst[20:25] = 5  # one vertex with five of them
    order = np.argsort(dst, kind="stable")
    indptr = np.zeros(n + 1, np.int64)
    np.cumsum(np.bincount(dst, minlength=n), out=indptr[1:])
    return from_csr(indptr, src[order])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_cpu_products_equal_the_dense_product(dtype: torch.dtype) -> None:
    """The CPU kernel (FBGEMM's embedding bags, not MKL's CSR product) against a dense product: rows without edges,
    unit values as an expanded scalar (as RowBlocks builds them) and another scalar, a product written into rows of
    a larger output, and a block without edges; float64 stays float64."""
    g = torch.Generator().manual_seed(0)
    n, m, e = 30, 20, 200
    rows, cols = torch.randint(0, n - 5, (e,), generator=g), torch.randint(0, m, (e,), generator=g)  # 5 rows empty
    values = torch.rand(e, generator=g, dtype=dtype)
    block = torch.sparse_coo_tensor(torch.stack([rows, cols]), values, (n, m)).coalesce().to_sparse_csr()
    dense, h = block.to_dense(), torch.randn(m, 6, generator=g, dtype=dtype)
    assert csr_matmul(block, h).dtype == dtype
    torch.testing.assert_close(csr_matmul(block, h), dense @ h)
    crow, col = block.crow_indices().int(), block.col_indices().int()
    unit = torch.sparse_csr_tensor(crow, col, torch.ones(1, dtype=dtype).expand(col.numel()), size=(n, m))
    torch.testing.assert_close(csr_matmul(unit, h), (dense != 0).to(dtype) @ h)
    half = torch.sparse_csr_tensor(crow, col, torch.full((1,), 0.5, dtype=dtype).expand(col.numel()), size=(n, m))
    torch.testing.assert_close(csr_matmul(half, h), 0.5 * (dense != 0).to(dtype) @ h)
    out = torch.full((n + 4, 6), float("nan"), dtype=dtype)
    csr_matmul(block, h, out[2 : n + 2])
    torch.testing.assert_close(out[2 : n + 2], dense @ h)
    none = torch.sparse_csr_tensor(
        torch.zeros(4, dtype=torch.int32), torch.zeros(0, dtype=torch.int32), torch.zeros(0, dtype=dtype), size=(3, m)
    )
    assert torch.equal(csr_matmul(none, h), torch.zeros(3, 6, dtype=dtype))


@pytest.mark.parametrize("prescale", [0.0, float("inf")], ids=["rows-scaled", "per-edge-values"])
@pytest.mark.parametrize("name", OPERATORS)
def test_compact_operators_equal_their_explicit_matrices(
    name: str, prescale: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every operator as unit-weight topology + scaling (what runs) equals its explicit form (self-loops added as
    edges, per-edge values; what data-parallel mode runs), forward and backward, on a directed graph with
    self-loops and repeated edges, in any chunks and offload mode, whether a CPU product scales its input rows
    once or gathers the scaling per edge (which one depends on the graph's density)."""
    monkeypatch.setattr(aggregate, "PRESCALE_EDGES_PER_ELEMENT", prescale)
    topo = _with_self_loops_and_multi_edges()
    assert topo.indices.dtype == torch.int32 and topo.self_loops is not None and not topo.symmetric
    pattern, values = operator_pattern(CSR(topo.indptr, topo.indices.long(), topo.num_nodes), name)
    dense = torch.sparse_csr_tensor(pattern.indptr, pattern.indices, values, size=(100, 100)).to_dense()
    h = torch.randn(100, 7, requires_grad=True)
    g = torch.randn(100, 7)
    ref = dense @ h
    (ref_grad,) = torch.autograd.grad(ref, h, g)
    cpu = torch.device("cpu")
    for bounds in ([0, 100], [0, 1, 2, 50, 99, 100], uniform_plan(100, 13).bounds):
        for offload in ("none", "topology", "all"):
            op = SparseOperator(
                RowBlocks(topo.indptr, topo.indices, bounds, cpu, offload),
                RowBlocks(topo.t_indptr, topo.t_indices, bounds, cpu, offload),
                scaling(topo, name),
            )
            out = op(h)
            (grad,) = torch.autograd.grad(out, h, g)
            torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(grad, ref_grad, rtol=1e-5, atol=1e-5)


def test_topology_is_8_bytes_per_edge_or_4_when_symmetric() -> None:
    directed = _topology(DIRECTED)
    n, e = directed.num_nodes, directed.num_edges
    loops = 0 if directed.self_loops is None else 4 * n  # a count per vertex, only when there are self-loops
    assert directed.nbytes() == 2 * 4 * e + 2 * 8 * (n + 1) + loops and not directed.symmetric
    src, dst = DIRECTED["edge_index"]
    both = {**DIRECTED, "edge_index": np.unique(np.concatenate([[src, dst], [dst, src]], axis=1), axis=1)}
    undirected = _topology(both)
    assert undirected.symmetric and undirected.t_indices is undirected.indices
    assert undirected.nbytes() == 4 * undirected.num_edges + 8 * (n + 1) + loops


def test_a_gpu_plan_counts_one_direction_of_a_symmetric_topology() -> None:
    """A symmetric ``A`` keeps one topology on the device (``A^T`` is ``A``: one set of row blocks), so the plan
    counts one direction (only planned here: nothing runs on a device), and the chunks get the room the other one
    took; so do a rank's resident parts (the preflight's figures: there from the store's "symmetrized" flag)."""
    from ntp.engine.device.measure import format_bytes
    from ntp.engine.distributed.collectives import Comm
    from ntp.engine.distributed.partition import Partition
    from ntp.engine.memory.parts import device_topology_bytes
    from ntp.engine.parallel.context import GraphContext

    src, dst = DIRECTED["edge_index"]
    both = {**DIRECTED, "edge_index": np.unique(np.concatenate([[src, dst], [dst, src]], axis=1), axis=1)}
    topo = _topology(both)
    n, e = topo.num_nodes, topo.num_edges
    assert device_topology_bytes(n, e) == 2 * (4 * e + 4 * n) + 12 * n
    assert device_topology_bytes(n, e, symmetric=True) == 4 * e + 4 * n + 12 * n
    comm = Comm(Partition(n, 1, 0), torch.device("cuda", 0))
    ctx = GraphContext(topo, comm, memory_budget=10**7, width=8, offload="none")
    kept = graph_resident_parts(n, e, 8, "none", symmetric=True)
    assert kept["topology"] == device_topology_bytes(n, e, symmetric=True)
    assert f"budget {format_bytes(10**7 - sum(kept.values()))}" in ctx.plan.reason
    cfg = TrainConfig(model="gcn", hidden=8)
    rank = [
        rank_resident_parts(
            cfg, num_nodes=n, num_edges=e, feature_dim=4, out_dim=8, world=1, params=0, nn_on_device=False, symmetric=s
        )["topology"]
        for s in (False, True)
    ]
    assert rank == [device_topology_bytes(n, e), device_topology_bytes(n, e, symmetric=True)]


def test_attention_topology_keeps_32_bit_ids_and_is_what_the_plan_counts_for_gat() -> None:
    """GAT propagates through its attention pattern alone, so the plan counts that pattern as its topology, in place
    of the row blocks every other model builds (exactly, but for the self-loops the graph already has: the plan
    cannot know them and adds one per vertex)."""
    from ntp.engine.graph.aggregate import EdgeWeightedTopology

    topo = _topology(DIRECTED)
    pattern = CSR(topo.indptr, topo.indices, topo.num_nodes)
    attention = EdgeWeightedTopology(with_self_loops(pattern))
    arrays = (attention.indptr, attention.cols, attention.t_indptr, attention.t_cols, attention.perm)
    assert all(a.dtype == torch.int32 for a in arrays) and attention.row_offsets.dtype == torch.int64
    edges = attention.cols.numel()  # with one self-loop per vertex
    held = sum(a.numel() * a.element_size() for a in (*arrays, attention.row_offsets))
    assert held == 4 * (3 * edges + 2 * (topo.num_nodes + 1)) + 8 * (topo.num_nodes + 1)
    shape = dict(
        num_nodes=topo.num_nodes,
        num_edges=topo.num_edges,
        feature_dim=5,
        out_dim=3,
        world=2,
        params=0,
        nn_on_device=True,
    )
    loops = int((pattern.indices.long() == pattern.edge_rows()).sum())
    assert rank_resident_parts(TrainConfig(model="gat"), **shape)["topology"] == held + 12 * loops
    gcn = rank_resident_parts(TrainConfig(model="gcn"), **shape)
    assert gcn["topology"] == graph_resident_parts(topo.num_nodes, topo.num_edges, 2, "none")["topology"] != held


def test_a_stored_transpose_builds_the_same_topology_as_sorting() -> None:
    src, dst = DIRECTED["edge_index"]
    both = {**DIRECTED, "edge_index": np.unique(np.concatenate([[src, dst], [dst, src]], axis=1), axis=1)}
    for graph in (DIRECTED, both):
        ref = _topology(graph)
        indptr, indices = ref.indptr.numpy(), ref.indices.numpy()

        def fill(p: np.ndarray, i: np.ndarray) -> None:
            p[:], i[:] = indptr, indices

        def fill_transpose(p: np.ndarray, i: np.ndarray) -> None:  # as a store keeps it (storage.csr)
            p[0] = 0
            np.cumsum(np.bincount(indices, minlength=len(indptr) - 1), out=p[1:])
            transpose_indices(indptr, indices, out=i)

        read = Topology.from_arrays(build(len(indptr) - 1, len(indices), fill, fill_transpose=fill_transpose))
        assert read.symmetric == ref.symmetric
        for name in ("indptr", "indices", "t_indptr", "t_indices"):
            assert torch.equal(getattr(read, name), getattr(ref, name)), name


# -- placement: where the NN stage runs ------------------------------------------------------------------------------------
def test_nn_stage_streams_only_when_it_does_not_fit_beside_aggregation() -> None:
    gpu, cpu = torch.device("cuda", 0), torch.device("cpu")
    gib = 1 << 30
    # an ogbn-products row block on one of 4 ranks: 612k rows, 100 features, hidden 256, 47 classes (~2.6 GB)
    nn = nn_stage_bytes(612_000, 100, 256, 47, 3, params=100_000)
    small = nn_stage_bytes(10_000, 100, 256, 47, 3, params=100_000)
    graph_bytes = lambda *args: sum(graph_resident_parts(*args).values())  # noqa: E731
    graph = graph_bytes(2_450_000, 124_000_000, 12, "all")
    assert graph == 4 * 2_450_000 * 4, "offload all needs a column of a product's input and output, and one each way"
    assert graph_bytes(2_450_000, 124_000_000, 12, "topology") > 0
    assert graph_bytes(10, 20, 4, "none") > graph_bytes(10, 20, 4, "topology")
    assert nn_placement("auto", gpu, nn, graph, 80 * gib) == "device"
    assert nn_placement("auto", gpu, nn, graph, 2 * gib) == "stream", f"{nn / gib:.1f} GiB cannot fit in 2 GiB"
    assert nn_placement("auto", gpu, nn, graph, 2 * gib, streamable=False) == "cpu", "GAT, batch norm, link"
    assert nn_placement("auto", gpu, small, graph, 4 * gib) == "device"
    assert nn_placement("auto", gpu, small, 4 * gib, 4 * gib) == "stream", "what aggregation keeps comes first"
    assert nn_placement("device", gpu, nn, graph, 1) == "device", "an explicit choice is obeyed"
    assert nn_placement("cpu", gpu, small, graph, 80 * gib) == "cpu"
    assert nn_placement("auto", cpu, small, graph, 0) == "cpu" and nn_placement("device", cpu, 1, 1, 0) == "cpu"
    assert nn_placement("stream", cpu, small, graph, 0) == "stream", "the tests stream blocks on a CPU"


# -- single process: any chunk size, any budget, same training ----------------------------------------------------------
def _no_op_streams(monkeypatch) -> list[str]:
    """Replace CUDA's stream API by no-ops that log what they were asked, so the streaming loops' bookkeeping runs on
    CPU tensors (stream semantics themselves need a GPU: tests/ntp/test_cuda.py)."""
    log: list[str] = []

    class Stream:
        def wait_stream(self, other) -> None:
            log.append("wait_stream")

        def wait_event(self, event) -> None: ...

        def synchronize(self) -> None:
            log.append("synchronize")

    class Event:
        def record(self, stream) -> None: ...
        def synchronize(self) -> None: ...

    monkeypatch.setattr(torch.cuda, "Stream", lambda device: Stream())
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device: Stream())
    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.Tensor, "record_stream", lambda self, stream: log.append("record_stream"))
    import ntp.engine.device.transfer as transfer

    unpinned = transfer.host_empty
    monkeypatch.setattr(transfer, "host_empty", lambda *size, dtype, pinned: unpinned(*size, dtype=dtype, pinned=False))
    return log


@pytest.mark.parametrize("offload, pinned", [("topology", False), ("all", False), ("topology", True)])
def test_cuda_streaming_loop_feeds_each_chunk_its_own_data(offload: str, pinned: bool, monkeypatch) -> None:
    """The CUDA streaming loop (side-stream prefetch of each chunk's topology) with no-op streams, on CPU tensors:
    through the staging buffers, or straight from a topology whose pages are locked (``pinned``)."""
    import ntp.engine.device.transfer as transfer

    _no_op_streams(monkeypatch)
    staged: list[int] = []
    fill = transfer.Staging.fill
    monkeypatch.setattr(transfer.Staging, "fill", lambda slot, *t: staged.append(1) or fill(slot, *t))
    topo = _topology(DIRECTED)
    h = torch.randn(topo.num_nodes, 5)
    whole = _gcn(topo)(h)
    op = _gcn(topo, uniform_plan(100, 13).bounds, offload)
    blocks = op.forward_blocks
    parts = [tuple(t.clone() for t in p) for p in transfer.streamed(blocks._parts, torch.device("cpu"), pinned)]
    assert len(parts) == len(blocks) and all(len(p) == 2 for p in parts)
    assert len(staged) == (0 if pinned else len(blocks)), "a pinned topology is copied from where it lies"
    for (a, b), part in zip(blocks.ranges(), parts):
        torch.testing.assert_close(blocks._apply(part, a, b, h, op.scaling), whole[a:b])
        into = torch.full((b - a, 5), float("nan"))  # the output's rows: written in place, nothing else returned
        assert blocks._apply(part, a, b, h, op.scaling, into) is into
        torch.testing.assert_close(into, whole[a:b])


def test_offloaded_embeddings_pass_through_the_device_once_per_product(monkeypatch) -> None:
    """``--offload all``: a product over a host input copies it to the device once, computes every chunk there and
    copies each chunk's output rows back (on CUDA, on a download stream that waits for the compute and is synchronised
    before the host reads the output)."""
    from ntp.engine.device.transfer import Downloads

    topo = _topology(DIRECTED)
    h = torch.randn(topo.num_nodes, 5)
    ref, op = _gcn(topo), _gcn(topo, uniform_plan(100, 13).bounds, "all")
    for mine, whole in ((op.forward, ref.forward), (op.backward, ref.backward)):  # A and A^T
        for columns in (0, 2, 5):  # the whole slice at once, or blocks of columns (the last one narrower)
            mine.blocks.column_block = columns
            torch.testing.assert_close(mine.blocks._matmul_through_device(h, mine.scaling), whole.matmul(h))
    log = _no_op_streams(monkeypatch)
    y = torch.randn(100, 5)
    out = torch.full_like(y, float("nan"))
    with Downloads(torch.device("cuda")) as downloads:
        for a, b in op.forward_blocks.ranges():
            downloads.copy(out[a:b], y[a:b])
        assert "synchronize" not in log, "the host does not wait for a chunk's copy inside the loop"
    assert torch.equal(out, y), "every chunk's rows land in their place"
    chunks = len(op.forward_blocks)
    assert log == ["wait_stream", "record_stream"] * chunks + ["synchronize"]


def test_offloaded_column_blocks_come_and_go_in_contiguous_slabs(monkeypatch) -> None:
    """``--offload all`` in blocks of columns: the slice lies column by column in host memory (as ``to_graph``
    leaves it), so a block reaches the device a slab of columns at a time, each slab one contiguous piece of host
    memory laid out row by row there, and the output returns the same way: the host gathers and scatters nothing."""
    import ntp.engine.device.transfer as transfer

    log = _no_op_streams(monkeypatch)
    monkeypatch.setattr(transfer, "SLAB_BYTES", 2 * 7 * 4)  # two columns of 7 float32 rows
    transposed: list[tuple[int, ...]] = []
    transpose = transfer.transpose_copy
    monkeypatch.setattr(
        transfer, "transpose_copy", lambda dst, src: transposed.append(tuple(dst.shape)) or transpose(dst, src)
    )
    h = torch.randn(7, 5)
    cols = transfer.host_columns(h, pinned=True)
    assert torch.equal(cols, h) and transfer.is_column_major(cols) and not cols.is_contiguous()
    out = transfer.host_empty(5, 7, dtype=h.dtype, pinned=True).t()
    with transfer.Downloads(torch.device("cuda")) as downloads:  # a GPU's output: the CUDA path, no-op streams
        downloads.copy_columns(out, h)
    assert torch.equal(out, h) and transposed == [(2, 7), (2, 7), (1, 7)], "slabs of 2, 2 and 1 columns"
    assert log == ["wait_stream", "record_stream", "synchronize"], "transposed and copied on the download stream"
    sent: list[tuple[int, ...]] = []
    to = torch.Tensor.to
    monkeypatch.setattr(
        torch.Tensor,
        "to",
        lambda t, *a, **k: (
            sent.append(t.shape) or to(t, *a, **k) if t.is_contiguous() else pytest.fail("a slab in two pieces")
        ),
    )
    x = transfer.device_rows(cols, torch.device("cpu"), 1, 5)
    assert torch.equal(x, h[:, 1:5]) and x.is_contiguous() and sent == [(2, 7), (2, 7)]
    topo = _topology(DIRECTED)
    h, op = torch.randn(topo.num_nodes, 5), _gcn(topo, uniform_plan(100, 13).bounds, "all")
    op.forward_blocks.column_block = 2
    y = op.forward_blocks._matmul_through_device(transfer.host_columns(h, pinned=False), op.scaling)
    torch.testing.assert_close(y, _gcn(topo)(h))
    assert transfer.is_column_major(y) and not y.is_contiguous(), "the output lies as the input did"


def test_rows_put_into_a_column_major_host_slice_spread_there_once_their_copy_has_arrived(monkeypatch) -> None:
    """A streamed segment's output rows split into the column slice in host memory (``--offload all``): each block
    is transposed and copied down on the download stream into pinned memory, and spread into the slice's columns on
    the host only later, so the compute stream never waits for it: the oldest block once
    :data:`PENDING_PUTS` more are on their way, the rest on leaving. CPU tensors stand in for a GPU's, on no-op
    streams (their semantics need a GPU: tests/ntp/test_cuda_stream.py)."""
    import ntp.engine.device.transfer as transfer

    log = _no_op_streams(monkeypatch)
    monkeypatch.setattr(  # the rows are a GPU's: they cross to a column-major host matrix
        transfer, "_across_columns", lambda t, device: not t.is_contiguous() and transfer.is_column_major(t)
    )
    rows = torch.randn(10, 3)
    out = transfer.host_empty(3, 10, dtype=rows.dtype, pinned=False).t().fill_(float("nan"))
    with transfer.Downloads(torch.device("cuda")) as downloads:
        for a in range(0, 10, 3):  # blocks of 3, 3, 3 and 1 rows
            downloads.put_rows(out, a, rows[a : a + 3])
        assert len(downloads.pending) == transfer.PENDING_PUTS == 2
        assert torch.equal(out[:6], rows[:6]) and out[6:].isnan().all(), "the first two blocks are spread"
    assert torch.equal(out, rows) and not downloads.pending
    assert log == ["wait_stream", "record_stream"] * 4 + ["synchronize"]
    again = torch.full_like(out, float("nan"))
    assert transfer.is_column_major(again) and not again.is_contiguous()
    transfer.put_rows(again, 3, rows[3:7])  # the same, waiting for its copy
    assert torch.equal(again[3:7], rows[3:7]) and again[:3].isnan().all() and again[7:].isnan().all()


def test_column_blocks_are_even_and_as_few_as_their_width_allows() -> None:
    from ntp.engine.device.transfer import even_blocks

    assert even_blocks(64, 31) == [(0, 21), (21, 42), (42, 64)], "not 31, 31 and 2"
    assert even_blocks(64, 64) == [(0, 64)] and even_blocks(64, 100) == [(0, 64)]
    assert even_blocks(5, 2) == [(0, 1), (1, 3), (3, 5)] and even_blocks(3, 1) == [(0, 1), (1, 2), (2, 3)]
    assert even_blocks(0, 4) == []


class _StreamLog:
    """Streams and events that log the order in which they are asked to wait and mark (the column pipeline's
    dependencies; what a GPU then does with them: tests/ntp/test_cuda.py)."""

    def __init__(self) -> None:
        self.log: list[str] = []
        self.marks: dict[str, int] = {}

    def stream(self, name: str):
        recorder = self

        class Stream:
            def wait_event(self, event: str) -> None:
                recorder.log.append(f"{name}<{event}")

            def synchronize(self) -> None:
                recorder.log.append(f"{name} sync")

        stream = Stream()
        stream.name = name
        return stream

    def mark(self, stream) -> str:
        k = self.marks[stream.name] = self.marks.get(stream.name, -1) + 1
        event = f"{stream.name[0].upper()}{k}"
        self.log.append(f"{stream.name}:{event}")
        return event


@pytest.mark.parametrize("depth", [1, 2])
def test_column_blocks_stream_through_buffers_allocated_once_in_order(depth: int, monkeypatch) -> None:
    """``transfer.stream_columns`` with logged streams, on CPU tensors: each block's input arrives in a set of
    buffers (``depth`` sets, reused in turn) and its output leaves from them; a set is refilled only once the
    compute stream is done with its last block, and written only once that block's output has left. Depth 2:
    the next block arrives while this one computes; depth 1: after."""
    import ntp.engine.device.transfer as transfer

    streams = _StreamLog()
    names = iter(["up", "down"])
    monkeypatch.setattr(transfer, "_stream", lambda device: streams.stream(next(names)))
    monkeypatch.setattr(transfer, "_current_stream", lambda device: streams.stream("compute"))
    monkeypatch.setattr(transfer, "_on", lambda stream: contextlib.nullcontext())
    monkeypatch.setattr(transfer, "_mark", streams.mark)
    h = transfer.host_columns(torch.randn(9, 7), pinned=False)
    out = transfer.host_empty(7, 9, dtype=h.dtype, pinned=False).t()
    blocks = transfer.even_blocks(7, 3)
    storage = []

    def compute(x: torch.Tensor, y: torch.Tensor) -> None:
        c0, c1 = blocks[len(storage)]
        assert torch.equal(x, h[:, c0:c1]) and x.is_contiguous() and y.shape == x.shape
        storage.append((x.untyped_storage().data_ptr(), y.untyped_storage().data_ptr()))
        y.copy_(2 * x)

    transfer.stream_columns(h, out, torch.device("cpu"), blocks, depth, compute)
    assert torch.equal(out, 2 * h), "every block's output lands in its columns"
    assert len(set(storage)) == depth and storage[0] == storage[depth], "the sets of buffers, reused in turn"
    first = ["compute:C0", "up<C0"]  # fresh buffers: written only after what the compute stream queued before
    if depth == 2:
        assert streams.log == first + [
            "up:U0",
            "up:U1",
            "compute<U0",
            "compute:C1",
            "down<C1",
            "down:D0",
            "up<C1",
            "up:U2",
            "compute<U1",
            "compute:C2",
            "down<C2",
            "down:D1",
            "compute<U2",
            "compute<D0",
            "compute:C3",
            "down<C3",
            "down:D2",
            "up sync",
            "down sync",
        ]
    else:
        assert streams.log == first + [
            "up:U0",
            "compute<U0",
            "compute:C1",
            "down<C1",
            "down:D0",
            "up<C1",
            "up:U1",
            "compute<U1",
            "compute<D0",
            "compute:C2",
            "down<C2",
            "down:D1",
            "up<C2",
            "up:U2",
            "compute<U2",
            "compute<D1",
            "compute:C3",
            "down<C3",
            "down:D2",
            "up sync",
            "down sync",
        ]


def test_offloaded_embeddings_leave_the_gradients_in_host_memory_and_the_budget_holds_the_rest() -> None:
    """With ``--offload all`` the device holds the input and output slices of the product running (not their
    gradients), a slab of columns in transit each way (here all of them: the graph is small) and one chunk; every
    chunk of a budget plan, forward and backward, fits what they leave."""
    csr = _csr(DIRECTED)
    width, n, e = 3, csr.num_nodes, csr.num_edges
    kept = graph_resident_parts(n, e, width, "all", column_block=width)
    assert kept == {"topology": 0, "column blocks": 4 * n * width * 4}
    ahead = graph_resident_parts(n, e, width, "all", column_block=width, topology_kept=True)
    assert ahead["column blocks"] == 6 * n * width * 4, (
        "where the topology stays, blocks come one ahead: twice the buffers"
    )
    assert graph_resident_parts(n, e, width, "topology")["embeddings"] == 4 * n * width * 4
    assert graph_resident_parts(n, e, width, "all", column_block=0) == graph_resident_parts(n, e, width, "topology")
    on_cpu = graph_resident_parts(n, e, width, "all", "fp32", "cpu", width)
    assert on_cpu == graph_resident_parts(n, e, width, "topology", "fp32", "cpu"), "on a CPU nothing moves"
    in_deg, out_deg = np.diff(csr.indptr.numpy()), np.bincount(csr.indices.numpy(), minlength=n)
    for budget in (1_500, 4_000, 20_000):
        total = budget + kept["column blocks"]
        plan = make_plan(in_deg, out_deg, memory_budget=total, width=width, resident=kept)
        op = _gcn(_topology(DIRECTED), plan.bounds, "all")
        for blocks in (op.forward_blocks, op.backward_blocks):
            for a, b in blocks.ranges():
                edges = int(blocks.indptr[b] - blocks.indptr[a]) + (b - a)  # the diagonal: one more per row
                working_set = edges * EDGE_BYTES + (b - a) * width * 4 + (b - a + 1) * ROW_BYTES
                assert working_set <= budget, f"chunk [{a}, {b}) needs {working_set} B, {budget} B left"
    with pytest.raises(MemoryPlanError, match="column blocks"):
        make_plan(in_deg, out_deg, memory_budget=kept["column blocks"], width=width, resident=kept)


def test_offloaded_embeddings_visit_the_device_in_the_widest_blocks_the_room_holds() -> None:
    """A product streaming a block of columns holds their input and output and a slab of columns in transit; beside
    them the chunks get an eighth of their working set (they number STREAMED_CHUNKS; the costliest row at least:
    its edges and row pointer, and in bfloat16 its output row, which a float32 chunk writes into the block's) and a
    chunk's own bytes, and the topology where it stays. The blocks are the widest that this leaves room for."""
    from ntp.engine.memory.chunks import STREAMED_CHUNKS
    from ntp.engine.memory.offload import STAYING_CHUNKS, chunk_bytes, offload_room, offloaded_layout
    from ntp.engine.memory.parts import device_topology_bytes, streamed_bytes

    for n in (1_000, 1_000_000):  # a slab holds all the columns of the small graph, 4 of the large one
        e, width = 20 * n, 64
        slab = 10 if n == 1_000 else 4
        assert streamed_bytes(n, 10, 4) == n * 4 * (20 + 2 * slab)
        assert streamed_bytes(n, 10, 4, depth=2) == n * 4 * (40 + 2 * slab), "a block arriving, one leaving"
        chunks = ((e + n) * EDGE_BYTES + n * ROW_BYTES) // STREAMED_CHUNKS + CHUNK_BYTES
        assert offload_room(n, e, 10) == streamed_bytes(n, 10, 4) + chunks
        in_bf16 = ((e + n) * EDGE_BYTES + n * (2 * 10 + ROW_BYTES)) // STREAMED_CHUNKS + CHUNK_BYTES
        assert offload_room(n, e, 10, "bf16") == streamed_bytes(n, 10, 2) + in_bf16
        hub = (e + 1) * EDGE_BYTES + ROW_BYTES + CHUNK_BYTES  # a vertex with every edge: its row a chunk at least
        assert offload_room(n, e, 10, max_degree=e) == streamed_bytes(n, 10, 4) + hub
        assert offload_room(n, e, 10, topology_kept=True) == (
            offload_room(n, e, 10)
            + device_topology_bytes(n, e)
            + streamed_bytes(n, 10, 4, 2)
            - streamed_bytes(n, 10, 4)
        )
        stay = 5 * 4 * n * width + chunk_bytes(n, e, width, chunks=STAYING_CHUNKS)  # 4 copies, a float32 one, a chunk
        assert offloaded_layout(n, e, width, stay) == (0, False), "the slice fits beside a chunk: it stays"
        assert offloaded_layout(n, e, width, stay - 1) == (width // 2, True), "else it streams, in two blocks at least"
        streamed = [offloaded_layout(n, e, width, offload_room(n, e, 7) - k) for k in (0, 1)]
        assert streamed == [(7, False), (6, False)], "the widest blocks the room holds"
        assert offloaded_layout(n, e, width, offload_room(n, e, 10, "bf16"), "bf16") == (10, False)
        assert offloaded_layout(n, e, width, 1) == (1, False), (
            "at least one column (the plan then says what does not fit)"
        )
        dense = 100 * n  # a narrow slice's trips cost less than the topology's: it streams even where it fits
        assert offloaded_layout(n, dense, 4, 10**12) == (4, True)
        assert offloaded_layout(n, dense, 4, 10**12, segment=1) == (4, True), "beside a streamed NN stage too"


def test_offload_all_keeps_the_topology_on_the_device_when_blocks_a_sector_wide_fit_beside_it() -> None:
    """A streamed slice's blocks read the topology once each: from device memory if it stays there, over the bus
    if it streams. It stays when the room it leaves holds blocks a memory sector wide (8 float32 columns, 16
    bfloat16) or the whole slice, if narrower; otherwise it streams as before, in wider blocks. (In these rooms the
    slice would stay on the device: ``offloaded_layout`` keeps it where it fits; this is the layout where it does
    not.)"""
    from ntp.engine.memory.offload import describe_streaming, offload_room, streamed_layout

    n, e, width = 10_000, 50_000, 64
    room = lambda columns, precision="fp32", e=e: offload_room(n, e, columns, precision, True)  # noqa: E731
    assert streamed_layout(n, e, width, room(width)) == (width // 2, True), "beside the topology, two blocks at least"
    assert streamed_layout(n, e, width, room(8)) == (8, True)
    block, kept = streamed_layout(n, e, width, room(8) - 1)
    assert not kept and block > 8, "wider blocks, each streaming the topology"
    assert streamed_layout(n, e, width, room(16, "bf16"), "bf16") == (16, True)
    assert streamed_layout(n, e, width, room(16, "bf16") - 1, "bf16")[1] is False
    sparse = n  # a slice narrower than a sector stays with the topology only whole, and in one block
    assert streamed_layout(n, sparse, 6, room(6, e=sparse)) == (6, True)
    assert streamed_layout(n, sparse, 6, room(6, e=sparse) - 1)[1] is False
    assert describe_streaming(8, 64, True).endswith(
        "in 8 block(s) of up to 8 columns; the topology stays on the "
        "device, and each block arrives while the one before computes"
    )
    assert describe_streaming(36, 64, False).endswith("the topology streams 2 time(s) a product")
    assert describe_streaming(0, 64, False).startswith("--offload all: the column slice stays on the device")


OFFLOADABLE = [c for c in MODELS if c["model"] != "gat"]


def _with_budget(cfg: dict, extra: dict, world: int) -> dict:
    """``extra`` with a ``memory_budget`` of ("chunks", B) made the budget that leaves B bytes to the chunks."""
    if isinstance(extra.get("memory_budget"), tuple):
        chunk_bytes = extra["memory_budget"][1]
        return dict(extra, memory_budget=graph_budget(chunk_bytes, TrainConfig(**cfg), DIRECTED, world))
    return extra


@pytest.mark.parametrize(
    "chunking",
    [
        dict(chunk_rows=1),
        dict(chunk_rows=33),
        dict(memory_budget=("chunks", 4_000)),
        dict(chunk_rows=7, offload="topology"),
        dict(chunk_rows=7, offload="all"),
        dict(chunk_rows=7, nn_device="cpu"),
    ],
)
def test_chunked_training_equals_unchunked(chunking: dict) -> None:
    from tests.ntp.exactness_worker import trace

    for cfg in OFFLOADABLE if chunking.get("offload") else MODELS:
        ref = trace(TrainConfig(**cfg), DIRECTED, EPOCHS, SINGLE)
        ours = trace(TrainConfig(**cfg, **_with_budget(cfg, chunking, 1)), DIRECTED, EPOCHS, SINGLE)
        where = f"{cfg['arch']}-{cfg['model']} with {chunking}"
        assert_same_run(ours, ref, where)
        torch.testing.assert_close(ours["logits"], ref["logits"], rtol=1e-5, atol=1e-5)


def test_worker_records_report_chunks_overlap_and_phase_memory(tmp_path) -> None:
    results = tmp_path / "r.jsonl"
    fit(
        setup(
            TrainConfig(model="gcn", epochs=2, hidden=8, chunk_rows=30, results=str(results)), SINGLE, loader(DIRECTED)
        )
    )
    first, second = (json.loads(line)["workers"][0] for line in open(results).readlines()[:2])
    assert set(first["peak_mem_by_phase"]) == {"setup", "nn", "propagate"}, "operators are built in the first epoch"
    worker = second
    assert worker["chunks"] == 4 and worker["overlap_s"] == 0.0
    assert worker["nn_device"] == "cpu" and worker["offload"] == "none"
    assert set(worker["peak_mem_by_phase"]) == {"nn", "propagate"}
    assert worker["peak_mem_bytes"] == max(worker["peak_mem_by_phase"].values()) > 0


# -- several ranks: chunked tensor parallelism and pipelining equal the reference -------------------------------------------
PIPE_BASE = dict(BASE, arch="decoupled", dropout=0.3)
PIPE_MODELS = [
    dict(PIPE_BASE, model="gcn"),
    dict(PIPE_BASE, model="appnp"),
    dict(PIPE_BASE, model="sage"),
    dict(PIPE_BASE, model="gin", prop_steps=2),
    dict(PIPE_BASE, model="sgc", prop_steps=1),
    dict(PIPE_BASE, model="appnp", prop_steps=1),
    dict(PIPE_BASE, model="gat"),
]


COUPLED_PIPE_MODELS = [dict(BASE, model=m, arch="coupled", dropout=0.3) for m in ("gcn", "sage", "gin")]


@pytest.fixture(scope="module")
def reference() -> list[dict]:
    return trace_all([dict(c, mode="single") for c in PIPE_MODELS + MODELS + COUPLED_PIPE_MODELS], DIRECTED, EPOCHS)


@pytest.mark.parametrize("world", [2, 3])
def test_chunked_and_pipelined_tensor_parallel_equal_single(world: int, reference: list[dict]) -> None:
    variants = {
        "chunked": dict(chunk_rows=9),
        "budget": dict(memory_budget=("chunks", 3_000)),
        "pipelined": dict(chunk_rows=9, overlap=True),
        "pipelined-one-chunk": dict(overlap=True),
        "offloaded": dict(chunk_rows=9, offload="all"),
        "pipelined-offloaded": dict(chunk_rows=9, overlap=True, offload="all"),
    }
    configs, names = [], []
    for vname, extra in variants.items():
        models = PIPE_MODELS + (MODELS if vname in ("chunked", "budget") else COUPLED_PIPE_MODELS)
        if "offload" in extra or "overlap" in extra:  # attention streams nothing and overlaps nothing
            models = [c for c in models if c["model"] != "gat"]
        for c in models:
            configs.append(dict(c, mode="tp", **_with_budget(c, extra, world)))
            names.append((vname, c))
    per_rank = run_on_ranks(trace_all, world, configs, DIRECTED, EPOCHS, timeout=300)
    refs = {id(c): r for c, r in zip(PIPE_MODELS + MODELS + COUPLED_PIPE_MODELS, reference)}
    for i, (vname, c) in enumerate(names):
        where = f"{c['arch']}-{c['model']} K={c['prop_steps']} {vname}, world {world}"
        for rank_result in (r[i] for r in per_rank):
            assert_same_run(rank_result, refs[id(c)], where)
        assert_close_to_scale(
            torch.cat([r[i]["logits"] for r in per_rank]), refs[id(c)]["logits"], f"final predictions: {where}"
        )


def pipeline_bytes_worker(configs: list[dict]) -> list[dict]:
    from ntp.engine.distributed.dist import distributed
    from ntp.engine.train.loop import train_step

    with distributed(60, "cpu") as env:
        out = []
        for c in configs:
            send_once = c.pop("send_once", True)
            job = setup(TrainConfig(**c), env, loader(DIRECTED))
            job.ctx.send_once = send_once  # before the first propagation builds the schedules
            train_step(job, 0)  # builds the operators
            job.comm.stats.reset()
            job.ctx.reset_stats()
            loss = train_step(job, 1)
            out.append(
                {
                    "loss": loss,
                    "sent": dict(job.comm.stats.bytes_sent),
                    "recv": dict(job.comm.stats.bytes_recv),
                    "overlap": job.ctx.clock.overlap_s,
                    "async": job.ctx.clock.async_calls,
                    "chunks": job.ctx.plan.num_chunks,
                }
            )
        return out


@pytest.mark.parametrize("world", [2, 3])
def test_pipelined_bytes_dedup_and_unpipelined_cost_model(world: int) -> None:
    base = dict(mode="tp", model="gcn", hidden=11, dropout=0.0, nn_layers=2, prop_steps=3)
    coupled = dict(base, arch="coupled", chunk_rows=9)
    configs = [
        dict(base, chunk_rows=9),
        dict(base, chunk_rows=9, overlap=True),
        dict(base, chunk_rows=9, overlap=True, send_once=False),
        dict(base),
        coupled,
        dict(coupled, overlap=True),
    ]
    per_rank = run_on_ranks(pipeline_bytes_worker, world, configs)
    n, classes = 100, 5
    chunked, piped, no_dedup, plain, coupled_off, coupled_on = (list(r) for r in zip(*per_rank))
    for off, on in zip(coupled_off, coupled_on):  # one step per layer: split and gather in one pipelined loop
        graph_bytes = [sum(r["sent"].get(k, 0) for k in ("split", "gather")) for r in (off, on)]
        assert graph_bytes[0] == coupled_bytes(n, [17, 11, classes], world) and graph_bytes[1] <= graph_bytes[0]
        assert on["async"] > 2 * 2 * 12, "2 layers x (forward, backward) x 12 chunk gathers, and the splits too"
        assert on["loss"] == pytest.approx(off["loss"], rel=1e-5)
    cost = decoupled_bytes(n, classes, world)
    for r in range(world):
        assert chunked[r]["sent"]["split"] + chunked[r]["sent"]["gather"] == cost, "chunking keeps the cost model"
        assert plain[r]["sent"]["split"] + plain[r]["sent"]["gather"] == cost
        moved = sum(piped[r]["sent"].get(k, 0) for k in ("split", "gather"))
        assert moved <= cost, "pipelined: each row once, no padding"
        assert sum(no_dedup[r]["sent"].get(k, 0) for k in ("split", "gather")) > moved, "send_once saves bytes"
        assert piped[r]["chunks"] == 12 and piped[r]["async"] > 4 and piped[r]["overlap"] >= 0.0
        assert piped[r]["loss"] == pytest.approx(chunked[r]["loss"], rel=1e-5)
        assert no_dedup[r]["loss"] == pytest.approx(chunked[r]["loss"], rel=1e-5)
    total_sent = sum(sum(p["sent"].values()) for p in piped)
    total_recv = sum(sum(p["recv"].values()) for p in piped)
    assert total_sent == total_recv, "every byte sent is received"


def test_a_gpu_plan_under_offload_all_streams_column_blocks_when_the_budget_is_short() -> None:
    """The plan of a CUDA rank (only planned here: nothing runs on a device) with ``--offload all``: the slice stays
    on the device when the budget holds it beside a chunk, else streams in the widest blocks the room holds, over a
    topology that stays on the device where blocks of 8 columns fit beside it; the chunks get what the blocks (and
    the topology, where it stays) leave."""
    from ntp.engine.device.measure import format_bytes
    from ntp.engine.distributed.collectives import Comm
    from ntp.engine.distributed.partition import Partition
    from ntp.engine.memory.chunks import STREAMED_CHUNKS
    from ntp.engine.memory.offload import offload_room
    from ntp.engine.memory.parts import device_topology_bytes, streamed_bytes
    from ntp.engine.parallel.context import GraphContext

    topo = _topology(DIRECTED)
    n, e, width = topo.num_nodes, topo.num_edges, 32
    comm = Comm(Partition(n, 1, 0), torch.device("cuda", 0))
    roomy = GraphContext(topo, comm, memory_budget=10**7, width=width, offload="all")
    short = GraphContext(topo, comm, memory_budget=offload_room(n, e, 4), width=width, offload="all")
    two = Comm(Partition(n, 2, 0), torch.device("cuda", 0))  # the pipelined loops exchange with another rank
    piped = GraphContext(topo, two, memory_budget=offload_room(n, e, 4), width=width, offload="all", overlap=True)
    alone = GraphContext(topo, comm, memory_budget=offload_room(n, e, 4), width=width, offload="all", overlap=True)
    wide = GraphContext(
        topo, comm, memory_budget=offload_room(n, e, width // 2, topology_kept=True), width=width, offload="all"
    )
    assert [c.column_block for c in (roomy, short, piped, alone, wide)] == [0, 4, width // 2, 4, width // 2]
    assert [c.topology_offload for c in (roomy, short, wide)] == ["all", "all", "none"]
    assert roomy.home == comm.device and {c.home.type for c in (short, piped, wide)} == {"cpu"}
    chunks = offload_room(n, e, 4) - streamed_bytes(n, 4, 4)  # what the chunks get
    assert f"budget {format_bytes(chunks)}" in short.plan.reason and short.plan.num_chunks >= STREAMED_CHUNKS
    kept = device_topology_bytes(n, e) + streamed_bytes(n, width // 2, 4, depth=2)
    assert f"budget {format_bytes(wide.memory_budget - kept)}" in wide.plan.reason
    assert "the topology streams" not in wide.plan.reason
    assert GraphContext(topo, comm, memory_budget=10**4, width=width, offload="topology").column_block == 0


def test_one_rank_counts_its_slice_once_with_the_nn_stage_that_holds_it() -> None:
    """On one rank whose NN stage runs on its device the column slice is the NN stage's rows (split and gather are
    the identity): the plan counts them with the NN stage, not again as embeddings, and ``--offload all`` keeps them
    there (streaming the topology) where the same room beside the NN stage streams them in blocks of 4 columns when
    it runs on the host or the ranks are two. Planned only: nothing runs on a device."""
    from ntp.engine.distributed.collectives import Comm
    from ntp.engine.distributed.partition import Partition
    from ntp.engine.memory.offload import offload_room
    from ntp.engine.parallel.context import GraphContext

    topo = _topology(DIRECTED)
    n, e, width, nn_stage = topo.num_nodes, topo.num_edges, 32, 10**5
    one, two = (Comm(Partition(n, world, 0), torch.device("cuda", 0)) for world in (1, 2))
    context = lambda comm, reserved: GraphContext(  # noqa: E731
        topo,
        comm,
        memory_budget=sum(reserved.values()) + offload_room(n, e, 4),
        width=width,
        offload="all",
        reserved=reserved,
    )
    kept, hosted, two_ranks = context(one, {"NN stage": nn_stage}), context(one, {"NN stage": 0}), context(two, {})
    assert [c.column_block for c in (kept, hosted, two_ranks)] == [0, 4, 4]
    assert kept.home == one.device and kept.topology_offload == "all"
    cfg = TrainConfig(model="gcn", arch="coupled", hidden=width)
    parts = lambda world, on_device: rank_resident_parts(
        cfg,
        num_nodes=n,
        num_edges=e,
        feature_dim=4,  # noqa: E731
        out_dim=8,
        world=world,
        params=0,
        nn_on_device=on_device,
    )
    assert parts(1, True)["embeddings"] == 0 < parts(1, True)["NN stage"]
    assert parts(1, False)["embeddings"] == 4 * n * width * 4 and parts(1, False)["NN stage"] == 0
    assert parts(2, True)["embeddings"] == 4 * n * (width // 2) * 4


def test_a_streamed_topology_comes_in_enough_chunks_for_its_copies_to_overlap() -> None:
    """Where products stream their topology (``--offload`` on a GPU; only planned here), a budget that holds the
    graph in one chunk still cuts :data:`STREAMED_CHUNKS` of about equal working sets, so each chunk's copy overlaps
    the compute of the one before; nothing changes on a CPU or without offload, and ``--chunk-rows`` wins."""
    from ntp.engine.distributed.collectives import Comm
    from ntp.engine.distributed.partition import Partition
    from ntp.engine.memory.chunks import STREAMED_CHUNKS, ChunkPlan
    from ntp.engine.parallel.context import GraphContext

    topo = _topology(DIRECTED)
    gpu, cpu = (Comm(Partition(topo.num_nodes, 1, 0), torch.device(*d)) for d in (("cuda", 0), ("cpu",)))

    def plan(comm: Comm, offload: str, **kw) -> ChunkPlan:
        return GraphContext(topo, comm, memory_budget=10**7, width=8, offload=offload, **kw).plan

    streamed = plan(gpu, "topology")
    assert STREAMED_CHUNKS <= streamed.num_chunks <= STREAMED_CHUNKS + 1 and "the topology streams" in streamed.reason
    assert plan(gpu, "all").bounds == streamed.bounds
    assert [plan(gpu, "none").num_chunks, plan(cpu, "topology").num_chunks] == [1, 1]
    assert plan(gpu, "topology", chunk_rows=50).bounds == [0, 50, 100]
    costs = row_costs(topo.indptr, topo.indices, topo.num_nodes, 8)
    shares = [costs[a:b].sum() for a, b in streamed.ranges()]
    assert max(shares[:-1]) <= costs.sum() / STREAMED_CHUNKS + costs.max(), "about an equal share each"
    deg = topo.in_degrees().numpy(), topo.out_degrees().numpy()
    assert make_plan(*deg, width=8, device=torch.device("cpu"), streamed=True).num_chunks >= STREAMED_CHUNKS


def test_cpu_products_scale_the_rows_once_only_on_dense_graphs() -> None:
    """Scaling the input rows by ``pre`` costs one pass over them and saves a gather per edge: it is chosen from
    about a quarter of an edge per input element, never without a ``pre`` term, and in float32 for bfloat16; the
    memory plan counts the copy exactly where it is made."""
    h = torch.randn(10, 8)
    gcn = Scaling(pre=torch.rand(10), post=torch.rand(10))
    assert prescaled(h, gcn, num_edges=19) is None
    torch.testing.assert_close(prescaled(h, gcn, num_edges=20), h * gcn.pre[:, None])
    assert prescaled(h, Scaling(post=torch.rand(10)), num_edges=1000) is None
    assert prescaled(h.bfloat16(), gcn, num_edges=20).dtype == torch.float32
    dense, sparse = (graph_resident_parts(10, e, 8, "none", "fp32", "cpu") for e in (20, 19))
    assert dense["float32 product input"] == 4 * 10 * 8 and "float32 product input" not in sparse, "the plan counts it"
