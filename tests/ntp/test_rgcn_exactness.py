"""R-GCN tensor parallel == one process (world sizes 1-4): losses over epochs, every gradient (embedding tables: each
rank's column slice of the single-process gradient), the target type's predictions, the saved embeddings. Coupled
(full, basis, block-diagonal weights; mean, total and plain-sum normalisation; chunked), decoupled, and with no
features at all (R-GCN's one-hot first layer)."""

from __future__ import annotations

import pytest
import torch

from tests.ntp.hetero_worker import hetero_graph, trace_all
from tests.ntp.spawn import run_on_ranks
from tests.ntp.test_exactness import assert_close_to_scale

EPOCHS = 3
BASE = dict(hidden=10, nn_layers=2, prop_steps=3, dropout=0.5, lr=0.05, seed=3)
CONFIGS = [
    dict(BASE, arch="coupled"),
    dict(BASE, arch="coupled", decomposition="basis", num_bases=3, rel_norm="total"),
    dict(BASE, arch="coupled", decomposition="block", num_bases=2, rel_norm="sum", nn_layers=3),
    dict(BASE, arch="decoupled"),
    dict(BASE, arch="coupled", chunk_rows=4),
    dict(BASE, arch="decoupled", prop_steps=1),
    dict(BASE, arch="coupled", featureless=True, sparse_embeddings=True),  # one-hot first layer: stacked tables
    dict(BASE, arch="coupled", featureless=True, decomposition="basis", num_bases=2, nn_layers=1),
]
GRAPH = hetero_graph(seed=1)


@pytest.fixture(scope="module")
def reference() -> list[dict]:
    return run_on_ranks(trace_all, 1, [dict(c, mode="single") for c in CONFIGS], GRAPH, EPOCHS)[0]


def _cols(total: int, world: int, rank: int) -> slice:
    base, extra = divmod(total, world)
    start = rank * base + min(rank, extra)
    return slice(start, start + base + (1 if rank < extra else 0))


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 3, 4])
def test_rgcn_tensor_parallel_equals_single(world: int, reference: list[dict]) -> None:
    per_rank = run_on_ranks(trace_all, world, [dict(c, mode="tp") for c in CONFIGS], GRAPH, EPOCHS)
    for i, cfg in enumerate(CONFIGS):
        ref, ranks = reference[i], [r[i] for r in per_rank]
        where = f"{cfg} world {world}"
        for rank, res in enumerate(ranks):
            torch.testing.assert_close(
                torch.tensor(res["losses"]),
                torch.tensor(ref["losses"]),
                rtol=1e-5,
                atol=1e-6,
                msg=lambda m: f"losses differ: {where}\n{m}",
            )
            for name, g in ref["grads"].items():
                expected = g[:, _cols(g.shape[1], world, rank)] if name in res["sliced"] else g
                assert_close_to_scale(res["grads"][name], expected, f"gradient of {name} (rank {rank}): {where}")
            for name, w in ref["state"].items():  # the state dict holds whole embedding tables on every rank
                assert_close_to_scale(res["state"][name], w, f"saved {name} (rank {rank}): {where}")
        assert_close_to_scale(torch.cat([r["logits"] for r in ranks]), ref["logits"], f"predictions: {where}")


def test_rgcn_embeddings_learn_and_decoupled_traffic_is_independent_of_depth(reference: list[dict]) -> None:
    """Featureless types learn (their embedding gradient is not zero); the decoupled form moves the same bytes for 1
    and 3 propagation steps (the split and the gather only), on every rank."""
    assert any(n.endswith("topic.weight") and float(g.abs().sum()) > 0 for n, g in reference[0]["grads"].items())
    per_rank = run_on_ranks(trace_all, 2, [dict(CONFIGS[3], mode="tp"), dict(CONFIGS[5], mode="tp")], GRAPH, 1)
    (deep, shallow), other = per_rank
    assert deep["bytes"] == shallow["bytes"] == other[0]["bytes"] and sum(deep["bytes"].values()) > 0
