"""R-GCN's memory plan (ntp.engine.tasks.hetero.memory): it counts the model it will build, a budget too small fails before
training with the budget, what stays resident and the smallest budget that works, and a feasible budget cuts every
typed operator into blocks that fit it without changing training (1 and 2 ranks)."""

from __future__ import annotations

import re

import pytest
import torch

from ntp.config import TrainConfig
from ntp.engine.distributed.dist import DistEnv
from ntp.engine.memory.chunks import EDGE_BYTES, ROW_BYTES
from ntp.engine.tasks.hetero.memory import operator_degrees
from ntp.engine.tasks.hetero.rgcn import parameter_sizes
from ntp.engine.train.setup import setup
from ntp.errors import MemoryPlanError
from tests.ntp.hetero_worker import featureless, hetero_budget, hetero_graph, hetero_loader, trace_all
from tests.ntp.spawn import run_on_ranks

GRAPH = hetero_graph(seed=1)
BASE = dict(hidden=10, nn_layers=2, prop_steps=2, dropout=0.5, lr=0.05, seed=3)
CONFIGS = [
    dict(BASE, arch="coupled"),
    dict(BASE, arch="coupled", decomposition="basis", num_bases=3),
    dict(BASE, arch="coupled", decomposition="block", num_bases=2, featureless=True),
    dict(BASE, arch="decoupled"),
    dict(BASE, arch="coupled", featureless=True),  # one-hot first layer: stacked tables, their own operators
    dict(BASE, arch="coupled", featureless=True, decomposition="basis", num_bases=2, nn_layers=1),
]
SINGLE = DistEnv(0, 1, 0, 1, torch.device("cpu"), None)
#: bytes the budgets below leave to one chunk (a few rows of the graph's operators)
CHUNK_BYTES = 1_500


def _cfg(c: dict, **extra) -> TrainConfig:
    return TrainConfig(model="rgcn", mode="single", **{k: v for k, v in c.items() if k != "featureless"}, **extra)


def _graph(c: dict) -> dict:
    return featureless(GRAPH) if c.get("featureless") else GRAPH


@pytest.mark.parametrize(
    "c",
    CONFIGS,
    ids=lambda c: f"{c['arch']}-{c.get('decomposition', 'none')}{'-featureless' if c.get('featureless') else ''}",
)
def test_plan_counts_the_model_and_operators_it_builds(c: dict) -> None:
    job = setup(_cfg(c), SINGLE, hetero_loader(_graph(c)))
    data, sliced = job.data, {id(p) for p in job.model.sliced()}
    tables, replicated = parameter_sizes(job.cfg, data.counts, data.feature_dims, len(data.relations), 4)
    assert sorted(tables) == sorted(tuple(p.shape) for p in job.model.sliced())
    assert replicated == sum(p.numel() for p in job.model.parameters() if id(p) not in sliced)
    degrees = operator_degrees(data.relations, data.counts, one_hot=True)
    for t, op in job.ctx.ops.items():  # the pairs and sources, in the operators' row order
        for kind, blocks in (("forward", op.forward_blocks), ("backward", op.backward_blocks)):
            built = torch.cat([b.crow_indices().diff() for b in blocks])
            assert built.tolist() == degrees[kind, t].tolist(), f"{kind} degrees of {t}"


def test_a_budget_too_small_fails_before_training_with_the_minimum() -> None:
    c = CONFIGS[0]
    with pytest.raises(MemoryPlanError) as err:
        setup(_cfg(c, memory_budget="20KB"), SINGLE, hetero_loader(GRAPH))
    message = str(err.value)
    for part in (
        "memory budget 19.5KB cannot hold this rank",
        "typed operators",
        "activations",
        "embedding tables",
        "raise --memory-budget to at least",
        "more ranks",
    ):
        assert part in message
    assert "--offload" not in message  # R-GCN has no offload
    minimum = re.search(r"at least ([0-9.]+KB)", message).group(1)
    setup(_cfg(c, memory_budget=minimum), SINGLE, hetero_loader(GRAPH))  # the budget it names works


@pytest.mark.parametrize("c", [CONFIGS[0], CONFIGS[4]], ids=["coupled", "featureless"])
def test_every_block_of_a_planned_operator_fits_what_the_budget_leaves(c: dict) -> None:
    budget = hetero_budget(CHUNK_BYTES, c, GRAPH, 1)
    job = setup(_cfg(c, memory_budget=budget), SINGLE, hetero_loader(_graph(c)))
    width = job.cfg.hidden
    ops = list(job.ctx.ops.values()) + (list(job.ctx.relation_ops().values()) if c.get("featureless") else [])
    chunks = 0
    for op in ops:
        for blocks in (op.forward_blocks, op.backward_blocks):
            chunks += len(blocks)
            for b in blocks:
                rows, edges = b.shape[0], b.values().numel()
                # its edges, its output rows and their pointers (the kernel reads its input where it lies)
                assert edges * EDGE_BYTES + rows * (4 * width + ROW_BYTES) <= CHUNK_BYTES
    assert job.ctx.plan.num_chunks > 1 and chunks > 2 * len(ops), "the budget should cut the operators"


@pytest.mark.slow
@pytest.mark.parametrize("world", [1, 2])
def test_budgeted_training_equals_unbudgeted(world: int) -> None:
    configs = [dict(c, mode="tp") for c in CONFIGS]
    budgeted = [dict(c, memory_budget=hetero_budget(CHUNK_BYTES, c, GRAPH, world)) for c in configs]
    runs = run_on_ranks(trace_all, world, configs + budgeted, GRAPH, 2)
    for ranks in runs:
        for c, ref, ours in zip(configs, ranks[: len(configs)], ranks[len(configs) :]):
            torch.testing.assert_close(
                torch.tensor(ours["losses"]),
                torch.tensor(ref["losses"]),
                rtol=1e-5,
                atol=1e-6,
                msg=lambda m: f"losses with a budget: {c}\n{m}",
            )
            torch.testing.assert_close(ours["logits"], ref["logits"], rtol=1e-5, atol=1e-5)


def test_preflight_refuses_an_impossible_budget_and_plans_a_feasible_one(tmp_path) -> None:
    """Before any rank starts: the launcher reads the store's relations (not its features) and computes the plan
    the ranks will."""
    from ntp.run.preflight import check_launch
    from ntp.spec import resolve
    from storage import prepare
    from tests.storage.test_store_hetero import quiet, tiny_folder

    store = prepare("tiny", from_dir=tiny_folder(tmp_path / "t"), out=tmp_path / "s", add_reverse=True, **quiet)
    cfg = TrainConfig(store=str(store), model="rgcn", arch="coupled", hidden=8, memory_budget="2KB")
    with pytest.raises(MemoryPlanError, match=r"memory budget 1.95KB cannot hold this rank: .*raise --memory-budget"):
        check_launch(resolve(cfg, nproc=2, device="cpu"))
    minimum = re.search(
        r"at least ([0-9.]+KB)",
        str(
            pytest.raises(
                MemoryPlanError, check_launch, resolve(cfg.replace(memory_budget="3KB"), nproc=2, device="cpu")
            ).value
        ),
    ).group(1)
    plan = check_launch(resolve(cfg.replace(memory_budget=minimum), nproc=2, device="cpu"))
    assert plan is not None and "R-GCN" in plan.reason
