"""Link prediction's parts on their own: metrics equal OGB's Evaluator, negatives avoid edges and are seeded, the
sliced embeddings start from the same matrix for every world size, the reduce-scatter's backward is an all-gather,
the chunked loss and gradients equal autograd over a whole batch."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ntp.config import TrainConfig
from ntp.engine.distributed.collectives import Comm, reduce_scatter_rows
from ntp.engine.distributed.partition import Partition
from ntp.engine.nn.embedding import SlicedEmbedding
from ntp.engine.tasks.link import pairs as link_pairs
from ntp.engine.tasks.link.metrics import link_metric
from ntp.engine.tasks.link.model import LinkModel
from ntp.engine.tasks.link.task import _member, sample_negatives
from tests.ntp.spawn import run_on_ranks


@pytest.mark.parametrize(
    "metric,name",
    [("hits@20", "ogbl-ddi"), ("hits@50", "ogbl-collab"), ("hits@100", "ogbl-ppa"), ("mrr", "ogbl-citation2")],
)
def test_metrics_equal_ogb_evaluator(metric: str, name: str) -> None:
    g = torch.Generator().manual_seed(0)
    pos = torch.randn(500, generator=g) + 1.5
    neg = torch.randn(500, 40, generator=g) if metric == "mrr" else torch.randn(3000, generator=g)
    neg[:5] = pos[:5].reshape(-1, 1) if metric == "mrr" else pos[:5]  # ties count as OGB counts them
    ours, ogb = link_metric(metric, pos, neg), link_metric(metric, pos, neg, name)
    assert 0.0 < ours < 1.0 and ours == pytest.approx(ogb, abs=1e-6)


def test_hits_with_fewer_negatives_than_k_is_one() -> None:
    assert link_metric("hits@20", torch.zeros(3), torch.ones(5)) == 1.0  # OGB's convention


def test_negatives_avoid_edges_and_are_seeded() -> None:
    n = 30
    rng = np.random.default_rng(0)
    edges = rng.integers(0, n, (400, 2))
    taken = torch.from_numpy(np.unique(edges[:, 0] * n + edges[:, 1]))
    a = sample_negatives(torch.Generator().manual_seed(7), n, 500, taken)
    b = sample_negatives(torch.Generator().manual_seed(7), n, 500, taken)
    assert torch.equal(a, b) and a.shape == (500, 2)
    assert not _member(a[:, 0] * n + a[:, 1], taken).any()
    assert 0 <= int(a.min()) and int(a.max()) < n


@pytest.mark.parametrize("world", [2, 3])
def test_sliced_embeddings_are_slices_of_one_matrix(world: int) -> None:
    whole = SlicedEmbedding(5000, 10, Partition(5000, 1, 0), seed=3).weight.detach()
    bound = (6.0 / 5010) ** 0.5
    assert float(whole.abs().max()) <= bound and float(whole.std()) > 0.5 * bound
    parts = [SlicedEmbedding(5000, 10, Partition(5000, world, r), seed=3).weight.detach() for r in range(world)]
    assert torch.equal(torch.cat(parts, dim=1), whole)
    assert not torch.equal(SlicedEmbedding(5000, 10, Partition(5000, 1, 0), seed=4).weight.detach(), whole)


def _reduce_scatter_worker(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    from ntp.engine.distributed.dist import distributed

    with distributed(30, "cpu") as env:
        comm = Comm(Partition(n, env.world, env.rank), torch.device("cpu"))
        x = (torch.arange(n * 2, dtype=torch.float32).view(n, 2) * (env.rank + 1)).requires_grad_()
        out = reduce_scatter_rows(x, comm, "link")
        (out * torch.arange(1, out.numel() + 1, dtype=torch.float32).view_as(out)).sum().backward()
        return out.detach(), x.grad


def test_reduce_scatter_rows_and_its_backward() -> None:
    n, world = 7, 3
    results = run_on_ranks(_reduce_scatter_worker, world, n)
    total = torch.arange(n * 2, dtype=torch.float32).view(n, 2) * sum(r + 1 for r in range(world))
    part = Partition(n, world, 0)
    grads = []
    for r, (out, _) in enumerate(results):
        r0, r1 = part.rows(r)
        assert torch.equal(out, total[r0:r1])
        grads.append(torch.arange(1, (r1 - r0) * 2 + 1, dtype=torch.float32).view(r1 - r0, 2))
    for _, grad in results:  # every rank's input fed every rank's sums: its gradient is all of them, gathered
        assert torch.equal(grad, torch.cat(grads))


@pytest.mark.parametrize("decoder", ["mlp", "dot"])
def test_chunked_loss_and_gradients_equal_whole_batch_autograd(decoder: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """train_pairs (chunks of 16 pairs, forward and backward per chunk, index_add_ for the embeddings' gradient)
    equals autograd over the whole batch at once: the loss, the decoder's gradients, the gradient w.r.t. h."""
    monkeypatch.setattr(link_pairs, "CPU_CHUNK", 16)
    cfg = TrainConfig(hidden=8, decoder=decoder, decoder_layers=3, dropout=0.5, seed=2)
    n, k = 30, 41
    model = LinkModel(cfg, n, 4, Partition(n, 1, 0)).train()
    comm = Comm(Partition(n, 1, 0), torch.device("cpu"))
    h = torch.randn(n, 8, generator=torch.Generator().manual_seed(0))
    pairs = torch.randint(0, n, (2 * k, 2), generator=torch.Generator().manual_seed(1))
    loss, h_grad = link_pairs.train_pairs(model, h, pairs, k, comm, stream=9)
    grads = {name: p.grad.clone() for name, p in model.decoder.named_parameters()}

    model.zero_grad()
    leaf = h.clone().requires_grad_()
    scores = model.decode(leaf[pairs[:, 0]] * leaf[pairs[:, 1]], link_pairs.pair_comm(len(pairs), comm), 0, 9)
    ref = (-torch.nn.functional.logsigmoid(scores[:k]).sum() - torch.nn.functional.logsigmoid(-scores[k:]).sum()) / k
    ref.backward()
    assert float(loss) == pytest.approx(float(ref.detach()), rel=1e-6)
    torch.testing.assert_close(h_grad, leaf.grad)
    for name, p in model.decoder.named_parameters():
        torch.testing.assert_close(grads[name], p.grad, msg=lambda m: f"{name}: {m}")
    assert float(h_grad.abs().sum()) > 0 and all(g.abs().sum() > 0 for g in grads.values())
    assert len(grads) == (6 if decoder == "mlp" else 0)


def test_mrr_scores_its_pairs_a_block_of_sources_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """An MRR split's negatives [E, K] are scored a block of positives at a time (E x K pairs never formed at once):
    the same scores as the whole pairs, and the split's metric from them, over blocks that do not divide E."""
    from ntp.engine.distributed.dist import DistEnv
    from ntp.engine.tasks.link.data import link_from_arrays
    from ntp.engine.tasks.link.task import _source_target_scores
    from ntp.engine.train.loop import evaluate_splits
    from ntp.engine.train.setup import setup
    from tests.ntp.link_worker import link_graph

    monkeypatch.setattr(link_pairs, "CPU_CHUNK", 16)  # 16 // 5: blocks of 3 sources
    graph, rng = link_graph(seed=3), np.random.default_rng(4)
    splits = {
        k: (p, rng.integers(0, graph["n"], (len(p), 5)) if q is not None else None)
        for k, (p, q) in graph["splits"].items()
    }
    data = lambda cfg, world, rank: link_from_arrays(
        graph["edge_index"],
        graph["n"],
        splits,
        graph["x"],  # noqa: E731
        metric="mrr",
    )
    env = DistEnv(0, 1, 0, 1, torch.device("cpu"), None)
    job = setup(TrainConfig(model="gcn", hidden=8, seed=1, mode="single"), env, data)
    job.model.eval()
    with torch.no_grad():
        h_cols = job.ctx.to_graph(job.model(job.x, job.ctx))
        pos, neg = job.task.eval_sets["valid"]
        whole = torch.stack([pos[:, :1].expand_as(neg).reshape(-1), neg.reshape(-1)], 1)
        expected = link_pairs.score_pairs(job.model, h_cols, whole, job.comm).view(neg.shape)
        scores = _source_target_scores(job, h_cols, pos[:, 0], neg)
        valid = link_metric("mrr", link_pairs.score_pairs(job.model, h_cols, pos, job.comm), expected)
    assert len(pos) % 3
    torch.testing.assert_close(scores, expected, rtol=1e-6, atol=1e-7)  # the MLP's products on other batch sizes
    assert evaluate_splits(job)["valid"] == pytest.approx(valid)
