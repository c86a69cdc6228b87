"""``--precision bf16``: bfloat16 activations and traffic with float32 sums; tensor parallel close to one process, for
node classification, link prediction and R-GCN.

bf16 runs are compared with a tolerance, not exactly: a Linear layer's weight gradient is a bfloat16 product per
rank (autocast), summed across ranks in float32, so its rounding depends on the row split. fp32 stays exact
(tests/ntp/test_exactness.py)."""

from __future__ import annotations

import pytest
import torch

from ntp.config import TrainConfig
from ntp.engine.distributed.traffic import GATHER, SPLIT
from ntp.engine.graph.aggregate import csr_matmul
from ntp.engine.memory.parts import rank_resident_parts
from ntp.engine.tasks.link.model import LINK
from tests.ntp.exactness_worker import trace_all
from tests.ntp.graphs import random_graph
from tests.ntp.hetero_worker import hetero_graph
from tests.ntp.hetero_worker import trace_all as hetero_trace_all
from tests.ntp.link_worker import link_graph
from tests.ntp.link_worker import trace_all as link_trace_all
from tests.ntp.spawn import run_on_ranks

EPOCHS = 3
# A small lr: Adam's first step moves each weight by lr * sign(gradient + weight decay), so where the two nearly cancel
# the split's rounding can flip a step (with lr 0.05, 4 of 28 seeds' GAT ended 2-10 % of the logits' scale apart)
BASE = dict(hidden=10, heads=2, nn_layers=2, prop_steps=3, dropout=0.5, lr=0.005, seed=3, precision="bf16")
CONFIGS = [
    dict(BASE, model="gcn", arch="decoupled"),
    dict(BASE, model="sage", arch="coupled"),
    dict(BASE, model="gat", arch="coupled"),
    dict(BASE, model="gcn", arch="decoupled", nn_layers=3, norm="batch"),
]
GRAPH = random_graph(directed=True, seed=1)
LINK_GRAPH = link_graph()


def _within(actual: torch.Tensor, expected: torch.Tensor, share: float, what: str) -> None:
    scale = float(expected.abs().max())
    error = float((actual - expected).abs().max())
    assert error <= share * scale, f"{what}: max error {error:.3g} exceeds {share} x scale {scale:.3g}"


def _grads_within(actual: dict, expected: dict, share: float, where: str) -> None:
    """Every gradient within ``share`` of the model's largest one (some are ~0, e.g. a bias before a norm)."""
    scale = max(float(g.abs().max()) for g in expected.values())
    for name, g in expected.items():
        error = float((actual[name] - g).abs().max())
        assert error <= share * scale, f"gradient of {name}: {where}: error {error:.3g}, scale {scale:.3g}"


@pytest.fixture(scope="module")
def single() -> list[dict]:
    return run_on_ranks(trace_all, 1, [dict(c, mode="single") for c in CONFIGS], GRAPH, EPOCHS)[0]


@pytest.mark.parametrize("world", [3])  # divides neither the 100 vertices nor the widths
def test_bf16_tensor_parallel_matches_one_process(world: int, single: list[dict]) -> None:
    per_rank = run_on_ranks(trace_all, world, [dict(c, mode="tp") for c in CONFIGS], GRAPH, EPOCHS)
    for i, cfg in enumerate(CONFIGS):
        where = f"bf16 {cfg['arch']} {cfg['model']} (norm {cfg.get('norm', 'none')}), world {world}"
        ref = single[i]
        torch.testing.assert_close(
            torch.tensor(per_rank[0][i]["losses"]),
            torch.tensor(ref["losses"]),
            rtol=1e-3,
            atol=0,
            msg=lambda m: f"losses: {where}\n{m}",
        )
        _grads_within(per_rank[0][i]["grads"], ref["grads"], 0.02, where)
        _within(torch.cat([r[i]["logits"] for r in per_rank]), ref["logits"], 0.03, f"predictions: {where}")
        assert per_rank[0][i]["logits"].dtype == torch.float32, "models return float32 outputs under bf16"


def test_bf16_halves_traffic_and_stays_close_to_fp32() -> None:
    cfg = dict(BASE, model="gcn", arch="coupled", mode="tp")
    fp32, bf16 = run_on_ranks(trace_all, 2, [dict(cfg, precision="fp32"), cfg], GRAPH, EPOCHS)[0]
    for kind in (SPLIT, GATHER):
        assert bf16["bytes"][kind] * 2 == fp32["bytes"][kind], f"{kind}: bf16 must move half of fp32's bytes"
    torch.testing.assert_close(torch.tensor(bf16["losses"]), torch.tensor(fp32["losses"]), rtol=1e-2, atol=0)
    _grads_within(bf16["grads"], fp32["grads"], 0.1, "bf16 against fp32")  # first step: rounding, no drift


def test_bf16_products_sum_in_float32() -> None:
    torch.manual_seed(0)
    n, e = 50, 2000  # 40 edges per row: bfloat16 sums would lose several bits
    rows = torch.arange(n).repeat_interleave(e // n)
    cols = torch.randint(0, n, (e,))
    values = torch.rand(e)
    block = torch.sparse_coo_tensor(torch.stack([rows, cols]), values, (n, n)).coalesce().to_sparse_csr()
    h = torch.randn(n, 7).bfloat16()
    expected = torch.sparse.mm(block, h.float()).bfloat16()  # exact inputs, float32 sums, one rounding
    with torch.autocast("cpu", dtype=torch.bfloat16):  # as inside a model: autocast must not recast the product
        out = csr_matmul(block, h)
    assert out.dtype == torch.bfloat16
    assert torch.equal(out, expected)


def test_memory_plan_counts_bf16_elements() -> None:
    sizes = dict(
        num_nodes=10_000, num_edges=100_000, feature_dim=64, out_dim=8, world=2, params=5_000, nn_on_device=True
    )
    fp32 = rank_resident_parts(TrainConfig(hidden=64), **sizes)
    bf16_gpu = rank_resident_parts(TrainConfig(hidden=64, precision="bf16"), **sizes)
    bf16_cpu = rank_resident_parts(TrainConfig(hidden=64, precision="bf16"), **sizes, device_type="cpu")
    assert bf16_gpu["embeddings"] * 2 == fp32["embeddings"]
    assert bf16_gpu["topology"] == fp32["topology"]
    assert bf16_gpu["NN stage"] < fp32["NN stage"]  # activations halve; parameters and Adam state stay float32
    assert bf16_cpu["float32 product input"] == fp32["embeddings"] // 4  # the float32 copy CPU products multiply


@pytest.mark.parametrize("model", ["gcn", "sage", "gin"])
def test_bf16_keeps_what_the_backward_needs_in_bfloat16_or_bits(model: str) -> None:
    """Under bf16 a coupled model's step keeps, of its hidden activations, autocast's bfloat16 casts for the
    products and packed flags (ReLU, dropout): no float32 copy as wide as a hidden layer (the row sums of a bias or
    a norm are float32, but nothing keeps them)."""
    from ntp.engine.distributed.dist import DistEnv
    from ntp.engine.train.setup import setup
    from tests.ntp.graphs import loader

    hidden = 24
    cfg = TrainConfig(model=model, arch="coupled", hidden=hidden, dropout=0.5, precision="bf16", mode="single")
    job = setup(cfg, DistEnv(0, 1, 0, 1, torch.device("cpu"), None), loader(GRAPH))
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append((t.dtype, tuple(t.shape))) or t, lambda t: t):
        job.model.train()(job.x, job.ctx)
    wide = [(dt, shape) for dt, shape in saved if len(shape) == 2 and shape[1] >= hidden]
    assert wide and all(dt == torch.bfloat16 for dt, _ in wide), wide
    assert any(dt == torch.uint8 for dt, _ in saved), "the ReLU'd dropout's flags, packed"


def test_bf16_on_a_gpu_keeps_cublas_sums_in_float32() -> None:
    """Under bf16 on a GPU a run forbids cuBLAS's bfloat16 reductions of split-K partial sums (torch allows them by
    default), so dense products sum in float32 as sparse ones do; fp32 runs and CPU runs leave the setting alone.
    Only the process-wide setting is checked here: nothing runs on a device."""
    from ntp.engine.device import precision

    matmul = torch.backends.cuda.matmul
    before = matmul.allow_bf16_reduced_precision_reduction
    try:
        matmul.allow_bf16_reduced_precision_reduction = True
        for name, device in (("bf16", "cpu"), ("fp32", "cuda")):
            precision.configure(name, torch.device(device))
            assert matmul.allow_bf16_reduced_precision_reduction
        precision.configure("bf16", torch.device("cuda", 0))
        assert not matmul.allow_bf16_reduced_precision_reduction
    finally:
        matmul.allow_bf16_reduced_precision_reduction = before


# Link prediction: the encoder in bfloat16, the learned embeddings, the decoder and its pairs in float32
LINK_BASE = dict(
    hidden=10,
    heads=2,
    nn_layers=2,
    prop_steps=2,
    dropout=0.5,
    lr=0.005,
    seed=5,
    link_batch=37,
    weight_decay=0.0,
    precision="bf16",
)
LINK_CONFIGS = [
    (dict(LINK_BASE, model="gcn", arch="decoupled", decoder="mlp"), False),  # learned embeddings
    (dict(LINK_BASE, model="sage", arch="coupled", decoder="dot"), True),
]


@pytest.fixture(scope="module")
def link_single() -> list[dict]:
    return link_trace_all([(dict(c, mode="single"), f) for c, f in LINK_CONFIGS], LINK_GRAPH, EPOCHS)


def test_bf16_link_prediction_tensor_parallel_matches_one_process(link_single: list[dict]) -> None:
    world = 3
    per_rank = run_on_ranks(
        link_trace_all, world, [(dict(c, mode="tp"), f) for c, f in LINK_CONFIGS], LINK_GRAPH, EPOCHS
    )
    for i, (cfg, features) in enumerate(LINK_CONFIGS):
        where = f"bf16 link {cfg['model']} {cfg['decoder']} ({'features' if features else 'learned'}), world {world}"
        ref, ranks = link_single[i], [r[i] for r in per_rank]
        torch.testing.assert_close(
            torch.tensor(ranks[0]["losses"]),
            torch.tensor(ref["losses"]),
            rtol=1e-3,
            atol=0,
            msg=lambda m: f"losses: {where}\n{m}",
        )
        grads = {
            n: torch.cat([r["grads"][n] for r in ranks], 1) if n == "embedding.weight" else g
            for n, g in ranks[0]["grads"].items()
        }  # the embeddings' column slices side by side
        _grads_within(grads, ref["grads"], 0.02, where)
        _within(ranks[0]["scores"], ref["scores"], 0.03, f"validation scores: {where}")
        assert all(v.dtype == torch.float32 for v in ranks[0]["state"].values()), "parameters stay float32"


def test_bf16_link_prediction_halves_the_encoders_traffic_and_stays_close_to_fp32() -> None:
    """The encoder's all-to-alls move bfloat16, its output's too; the decoder's exchanges of pairs stay float32. (With
    features: learned embeddings also gather their whole float32 matrices for the state dicts.)"""
    cfg, features = dict(LINK_CONFIGS[1][0], mode="tp"), LINK_CONFIGS[1][1]
    fp32, bf16 = run_on_ranks(
        link_trace_all, 2, [(dict(cfg, precision="fp32"), features), (cfg, features)], LINK_GRAPH, EPOCHS
    )[0]
    for kind in (SPLIT, GATHER):
        assert bf16["bytes"][kind] * 2 == fp32["bytes"][kind], f"{kind}: bf16 must move half of fp32's bytes"
    assert bf16["bytes"][LINK] == fp32["bytes"][LINK], "the decoder's pairs move in float32"
    torch.testing.assert_close(torch.tensor(bf16["losses"]), torch.tensor(fp32["losses"]), rtol=1e-2, atol=0)
    _within(bf16["scores"], fp32["scores"], 0.05, "validation scores, bf16 against fp32")


# R-GCN: per-type features and activations in bfloat16, embedding tables float32 (cast as they are read), float32 sums
RGCN_BASE = dict(hidden=10, nn_layers=2, prop_steps=3, dropout=0.5, lr=0.005, seed=3, precision="bf16")
RGCN_CONFIGS = [
    dict(RGCN_BASE, arch="coupled"),
    dict(RGCN_BASE, arch="decoupled"),
    dict(RGCN_BASE, arch="coupled", featureless=True, decomposition="basis", num_bases=2),
]
HETERO_GRAPH = hetero_graph(seed=1)


def test_bf16_rgcn_tensor_parallel_matches_one_process() -> None:
    world = 3
    single = run_on_ranks(hetero_trace_all, 1, [dict(c, mode="single") for c in RGCN_CONFIGS], HETERO_GRAPH, EPOCHS)[0]
    per_rank = run_on_ranks(hetero_trace_all, world, [dict(c, mode="tp") for c in RGCN_CONFIGS], HETERO_GRAPH, EPOCHS)
    for i, cfg in enumerate(RGCN_CONFIGS):
        where = f"bf16 R-GCN {cfg['arch']}{' featureless' if cfg.get('featureless') else ''}, world {world}"
        ref, ranks = single[i], [r[i] for r in per_rank]
        torch.testing.assert_close(
            torch.tensor(ranks[0]["losses"]),
            torch.tensor(ref["losses"]),
            rtol=1e-3,
            atol=0,
            msg=lambda m: f"losses: {where}\n{m}",
        )
        grads = {
            n: torch.cat([r["grads"][n] for r in ranks], 1) if n in ranks[0]["sliced"] else g
            for n, g in ranks[0]["grads"].items()
        }  # the tables' column slices side by side
        _grads_within(grads, ref["grads"], 0.02, where)
        _within(torch.cat([r["logits"] for r in ranks]), ref["logits"], 0.03, f"predictions: {where}")
        assert ranks[0]["logits"].dtype == torch.float32, "R-GCN returns float32 logits under bf16"
        assert all(v.dtype == torch.float32 for v in ranks[0]["state"].values()), "parameters stay float32"


def test_bf16_rgcn_halves_traffic_and_stays_close_to_fp32() -> None:
    cfg = dict(RGCN_CONFIGS[0], mode="tp")
    fp32, bf16 = run_on_ranks(hetero_trace_all, 2, [dict(cfg, precision="fp32"), cfg], HETERO_GRAPH, EPOCHS)[0]
    for kind in (SPLIT, GATHER):
        assert bf16["bytes"][kind] * 2 == fp32["bytes"][kind], f"{kind}: bf16 must move half of fp32's bytes"
    torch.testing.assert_close(torch.tensor(bf16["losses"]), torch.tensor(fp32["losses"]), rtol=1e-2, atol=0)
    _grads_within(bf16["grads"], fp32["grads"], 0.1, "bf16 R-GCN against fp32")


def test_bf16_rgcn_sums_rows_in_float32() -> None:
    """add_rows sums rows of either precision into rows of either (float32 tables beside bfloat16 messages, bfloat16
    rows beside float32 mixing weights) in float32, rounding once to the rows' dtype: index_add alone refuses mixed
    dtypes, and on a GPU it sums bfloat16 in bfloat16."""
    from ntp.engine.tasks.hetero.rgcn import add_rows

    torch.manual_seed(0)
    index = torch.randint(0, 4, (200,))
    for y, source in (
        (torch.randn(4, 3), torch.randn(200, 3).bfloat16()),
        (torch.randn(4, 3).bfloat16(), torch.randn(200, 3)),
    ):
        with pytest.raises(RuntimeError):
            y.index_add(0, index, source)
        expected = y.double().index_add(0, index, source.double()).to(y.dtype)
        out = add_rows(y, index, source)
        assert out.dtype == y.dtype
        torch.testing.assert_close(
            out.double(), expected.double(), rtol=0, atol=1e-5 if y.dtype == torch.float32 else 0
        )
