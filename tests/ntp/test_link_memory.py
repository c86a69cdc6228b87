"""Link prediction's memory plan (ntp.engine.tasks.link.memory) holds what a link step really allocates, counted tensor by
tensor (tests/ntp/live_bytes.py), on one rank and on two: the encoder, the learned embeddings with Adam's moments,
the gradient of the encoder's output, a chunk of pairs in the decoder and the edges a CPU rank keeps. Before it, a
link job's budget counted the propagation's parts only (41 MB of a step that allocates 83 MB: docs/benchmarks.md,
section 7). The ranks and the launcher's preflight plan alike, and the launcher refuses a budget too small before any
rank starts, naming the link step's parts."""

from __future__ import annotations

import re

import pytest
import torch

from ntp.config import TrainConfig
from ntp.engine.distributed.dist import DistEnv
from ntp.engine.tasks.link import memory as link_memory
from ntp.engine.tasks.link import pairs as link_pairs
from ntp.engine.tasks.link.task import memory_shape, split_shapes
from ntp.engine.train.loop import evaluate_splits, train_step
from ntp.engine.train.setup import setup
from ntp.errors import MemoryPlanError
from ntp.run.preflight import check_launch
from ntp.spec import resolve
from tests.ntp.link_worker import link_graph, link_loader
from tests.ntp.live_bytes import LINK_SLACK, LiveBytes, chunk_bytes, held_bytes
from tests.ntp.spawn import run_on_ranks

N, FEATURES = 8_000, 48
SINGLE = DistEnv(0, 1, 0, 1, torch.device("cpu"), None)
#: (options, whether the graph has features); 4096 positives and as many negatives a batch: a chunk of pairs
CASES = [
    (dict(model="gcn", hidden=96, link_batch=4096), True),
    (dict(model="gcn", hidden=96, link_batch=4096), False),  # learned embeddings
    (dict(model="sage", hidden=96, link_batch=4096, decoder="dot"), True),
    (dict(model="sage", hidden=64, link_batch=4096, decoder_layers=3), False),
    (dict(model="gin", hidden=64, link_batch=4096, dropout=0.0), True),
    (dict(model="gcn", hidden=96, link_batch=4096, precision="bf16"), True),  # the encoder in bfloat16
    (dict(model="sage", hidden=64, link_batch=4096, precision="bf16"), False),
]
IDS = [
    f"{o['model']}-{o.get('decoder', 'mlp')}-{'features' if f else 'learned'}-{o.get('precision', 'fp32')}"
    for o, f in CASES
]


def _graph() -> dict:
    return link_graph(n=N, d=FEATURES, edges=60_000, seed=1)


def _job(options: dict, features: bool, env: DistEnv = SINGLE):
    return setup(TrainConfig(mode="tp", epochs=2, seed=1, **options), env, link_loader(_graph(), features))


def measured_and_planned(options: dict, features: bool, env: DistEnv = SINGLE) -> tuple[int, int]:
    """The peak live bytes of a link step or of an evaluation, with what they start from (features, the parameters
    (the embeddings too) and their Adam moments, the edges and splits), and the plan's count of all but the topology,
    on a CPU rank, with the edges of the one chunk of propagation a step without a budget runs."""
    job = _job(options, features, env)
    train_step(job, 0)  # the optimizer's state exists from here on
    live, evaluation = LiveBytes(), LiveBytes()
    with live:
        train_step(job, 1)
    with evaluation:
        evaluate_splits(job)
    pairs = [job.task.taken, *job.task.pos.values(), *(q for q in job.task.neg.values() if q is not None)]
    parts = link_memory.resident_parts(job.cfg, **memory_shape(job.data, job.model, env.world, "cpu"))
    peak = max(live.peak, evaluation.peak) + held_bytes(job)  # the features, the parameters (embeddings too), Adam's
    planned = sum(parts.values()) - parts["topology"] + chunk_bytes(job, device_type="cpu")  # a chunk's edges
    return peak + sum(t.numel() * t.element_size() for t in pairs), planned


@pytest.mark.parametrize("options, features", CASES, ids=IDS)
def test_the_plan_covers_a_link_step_on_one_rank(options: dict, features: bool) -> None:
    measured, planned = measured_and_planned(options, features)
    assert measured <= planned < LINK_SLACK * measured, f"the plan counts {planned} bytes, a step allocates {measured}"


def _two_rank_worker(cases: list) -> list[tuple[int, int]]:
    from ntp.engine.distributed.dist import distributed

    with distributed(60, "cpu") as env:
        return [measured_and_planned(options, features, env) for options, features in cases]


def test_the_plan_covers_a_link_step_on_each_of_two_ranks() -> None:
    """Over two ranks the column slice's parts are bounds too: the plan is 1.63-1.76x a step (2026-12-02), its pair
    chunk (the decoder's gathered rows) summed with the encoder's NN stage, which never peak together."""
    for rank, results in enumerate(run_on_ranks(_two_rank_worker, 2, CASES[:2] + CASES[3:4], timeout=300)):
        for (options, features), (measured, planned) in zip(CASES[:2] + CASES[3:4], results):
            assert measured <= planned < 2 * measured, (
                f"rank {rank}, {options}, features {features}: the plan counts {planned}, a step allocates {measured}"
            )


@pytest.mark.parametrize(
    "options", [dict(decoder="dot"), dict(decoder_layers=2), dict(decoder_layers=4)], ids=["dot", "mlp-2", "mlp-4"]
)
def test_a_chunk_of_pairs_holds_what_the_plan_counts(options: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    """The decoder's pass over a batch holds the gradient of the encoder's output and one chunk at a time: a chunk's
    tensors die before the next chunk's are made (they lived on through the loop: six copies of a chunk where the
    plan counts five)."""
    job = _job(dict(model="gcn", hidden=64, link_batch=8192, **options), features=True)  # two chunks a batch
    train_step(job, 0)
    peaks = []

    def measured(*args, **kwargs):
        live = LiveBytes()
        with live:
            out = train_pairs(*args, **kwargs)
        peaks.append(live.peak)
        return out

    train_pairs = link_pairs.train_pairs
    monkeypatch.setattr("ntp.engine.tasks.link.task.train_pairs", measured)
    train_step(job, 1)
    planned = link_memory.pair_chunk_bytes(job.cfg, 1, 64, "cpu") + 4 * N * 64  # and the output's gradient
    assert peaks and max(peaks) <= planned, (max(peaks), planned)


def test_the_decoders_slice_is_counted_where_offload_all_may_stream_it() -> None:
    """Where ``--offload all`` streams the column slice through a GPU, the decoder still copies it there whole
    (ntp.engine.tasks.link.task.LinkTask.train_epoch): counted on several ranks; one rank's slice is its NN stage's rows, which
    never stream (ntp.engine.memory.parts.slice_is_rows)."""
    shape = dict(num_nodes=1_000, num_edges=8_000, feature_dim=16, splits={"train": ((4_000, 2), None)}, params=100)
    cfg = TrainConfig(hidden=64, offload="all")
    assert link_memory.resident_parts(cfg, world=2, **shape)["decoder's slice"] == 4 * 1_000 * 32
    assert "decoder's slice" not in link_memory.resident_parts(cfg, world=1, **shape)
    assert "decoder's slice" not in link_memory.resident_parts(cfg.replace(offload="topology"), world=2, **shape)
    assert "decoder's slice" not in link_memory.resident_parts(cfg, world=2, device_type="cpu", **shape)


def test_a_budget_too_small_names_the_link_steps_parts_and_the_minimum_it_names_works() -> None:
    options = dict(model="gcn", hidden=64, link_batch=4096)
    with pytest.raises(MemoryPlanError) as err:
        _job(dict(options, memory_budget="5MB"), features=False).ctx.plan
    message = str(err.value)
    for part in (
        "cannot hold this rank",
        "NN stage",
        "node embeddings",
        "pair chunk",
        "raise --memory-budget",
        "--link-batch",
    ):
        assert part in message, message
    assert "--nn-device" not in message  # a link rank's encoder stays on its device
    minimum = re.search(r"at least ([0-9.]+[KMG]B)", message).group(1)
    assert _job(dict(options, memory_budget=minimum), features=False).ctx.plan.num_chunks > 1


@pytest.fixture(scope="module")
def link_store(tmp_path_factory: pytest.TempPathFactory):
    from storage.prepare import prepare
    from tests.ntp.test_link_run import _community_folder

    tmp = tmp_path_factory.mktemp("link")
    return prepare(
        "communities",
        from_dir=_community_folder(tmp / "folder", n=400),
        out=tmp / "store",
        symmetrize=True,
        progress=lambda line: None,
    )


def test_the_launcher_plans_a_link_job_as_its_ranks_do(link_store) -> None:
    """The preflight reads the splits' shapes from the store (not their pairs) and counts the model the ranks build."""
    # 256 columns: its products gather a value an edge (they do not scale the rows once), so the least budget chunks
    cfg = TrainConfig(store=str(link_store), model="gcn", hidden=256, link_batch=512, mode="tp")
    with pytest.raises(MemoryPlanError, match="pair chunk") as err:
        check_launch(resolve(cfg.replace(memory_budget="100KB"), nproc=1, device="cpu"))
    minimum = re.search(r"at least ([0-9.]+[KMG]B)", str(err.value)).group(1)
    budgeted = cfg.replace(memory_budget=minimum)
    plan = check_launch(resolve(budgeted, nproc=1, device="cpu"))
    job = setup(budgeted, SINGLE)
    assert plan.bounds == job.ctx.plan.bounds and plan.num_chunks > 1


def test_an_encoder_on_the_host_leaves_the_gpu_the_link_step() -> None:
    """``--nn-device cpu`` (or "auto" where the encoder does not fit): a GPU rank's plan leaves the encoder's rows
    out and keeps the rest (the topology, the column slice, the embeddings' slice, the output's gradient, the pairs),
    which stay on the GPU."""
    shape = dict(
        num_nodes=N,
        num_edges=120_000,
        feature_dim=0,
        splits=split_shapes(_graph()["splits"]),
        world=2,
        params=10_000,
        device_type="cuda",
    )
    cfg = TrainConfig(model="sage", hidden=64, link_batch=4096)
    on_gpu = link_memory.resident_parts(cfg, **shape)
    on_host = link_memory.resident_parts(cfg, **shape, nn_on_device=False)
    assert on_gpu["NN stage"] > 0 and on_host["NN stage"] == 0
    assert {k: v for k, v in on_host.items() if k != "NN stage"} == {k: v for k, v in on_gpu.items() if k != "NN stage"}
    assert link_memory.reserved_parts(cfg, **shape, nn_on_device=False)["NN stage"] == 0


def test_the_launcher_takes_an_encoder_on_the_host(link_store) -> None:
    """It refused ``--nn-device cpu`` for link prediction before; on a CPU rank the option changes nothing."""
    cfg = TrainConfig(store=str(link_store), model="gcn", hidden=32, link_batch=512, memory_budget="64MB")
    planned = check_launch(resolve(cfg.replace(nn_device="cpu"), nproc=1, device="cpu"))
    assert planned.bounds == check_launch(resolve(cfg, nproc=1, device="cpu")).bounds
