"""Link prediction, tensor parallel == one process (world sizes 1-4): losses of every epoch, every gradient (the
sliced embeddings' slices put side by side), the scores of validation pairs, metrics and the saved state."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.ntp.link_worker import link_graph, trace_all
from tests.ntp.spawn import run_on_ranks
from tests.ntp.test_exactness import assert_close_to_scale

EPOCHS = 2
BASE = dict(
    hidden=10, heads=2, nn_layers=2, prop_steps=2, dropout=0.5, lr=0.02, seed=5, link_batch=37, weight_decay=0.0
)
CONFIGS = [  # (config, with node features)
    (dict(BASE, model="gcn", arch="decoupled", decoder="mlp"), False),
    (dict(BASE, model="gcn", arch="coupled", decoder="dot", clip_grad=0.5, input_dropout=0.0), False),
    (dict(BASE, model="sage", arch="coupled", decoder="mlp", decoder_layers=3, clip_grad=1.0), True),
    (dict(BASE, model="appnp", arch="decoupled", decoder="dot"), True),
    (dict(BASE, model="gat", arch="coupled", decoder="mlp"), False),
    (dict(BASE, model="gin", arch="decoupled", decoder="mlp", input_dropout=0.2), False),
    # the classic options of coupled encoders (docs/training.md): projection, residuals, norms, jumping knowledge
    (
        dict(BASE, model="sage", arch="coupled", decoder="dot", input_proj=True, residual=True, norm="layer", jk="cat"),
        True,
    ),
    (dict(BASE, model="gcn", arch="coupled", decoder="mlp", residual=True, norm="batch", jk="max"), False),
]
GRAPH = link_graph()


def _name(c: dict, features: bool) -> str:
    classic = "-".join(f"{k}={c[k]}" for k in ("residual", "norm", "jk") if k in c)
    return f"{c['arch']}-{c['model']}-{c['decoder']}-{classic}-" + ("features" if features else "embeddings")


@pytest.fixture(scope="module")
def reference() -> list[dict]:
    return trace_all([(dict(c, mode="single"), f) for c, f in CONFIGS], GRAPH, EPOCHS)


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_link_prediction_tp_equals_single(world: int, reference: list[dict]) -> None:
    per_rank = run_on_ranks(trace_all, world, [(dict(c, mode="tp"), f) for c, f in CONFIGS], GRAPH, EPOCHS)
    for i, (cfg, features) in enumerate(CONFIGS):
        ref, ranks = reference[i], [r[i] for r in per_rank]
        where = f"{_name(cfg, features)}, world {world}"
        for r in ranks:
            torch.testing.assert_close(
                torch.tensor(r["losses"]),
                torch.tensor(ref["losses"]),
                rtol=1e-5,
                atol=1e-6,
                msg=lambda m: f"losses differ: {where}\n{m}",
            )
            assert_close_to_scale(r["scores"], ref["scores"], f"validation scores: {where}")
            # Hits@K jumps where a positive and the K-th negative are (nearly) tied: summation-order noise in the
            # scores (checked tightly above) may flip one of the 20 positives of a split, no more
            assert r["metrics"] == pytest.approx(ref["metrics"], abs=1.01 / 20), f"metrics differ: {where}"
            for name, value in ref["state"].items():  # the whole embedding matrix; after ~12 Adam steps, whose
                # normalisation turns summation-order noise of near-zero gradients into ~1e-5 relative differences
                assert_close_to_scale(r["state"][name], value, f"saved {name}: {where}", rtol=1e-4)
            if world > 1:
                assert r["bytes"].get("link", 0) > 0, f"no pair exchange counted: {where}"
        for name, g in ref["grads"].items():
            if name == "embedding.weight":  # column slices, side by side
                slices = torch.cat([r["grads"][name] for r in ranks], dim=1)
                assert_close_to_scale(slices, g, f"gradient of {name}: {where}")
            else:
                for r in ranks:
                    assert_close_to_scale(r["grads"][name], g, f"gradient of {name}: {where}")
        assert features or "embedding.weight" in ref["grads"], "no learned embeddings in a featureless run"


def test_training_learns() -> None:
    """On a graph with structure (4 communities: edges within, negatives mostly across) the loss falls and the
    validation edges outrank the negatives: the equal numbers above are also right ones."""
    rng = np.random.default_rng(1)
    n, group = 80, np.arange(80) % 4
    pairs = np.array([(u, v) for u in range(n) for v in range(u + 1, n) if group[u] == group[v] and rng.random() < 0.4])
    pairs = pairs[rng.permutation(len(pairs))]
    neg = rng.integers(0, n, (200, 2))
    neg = neg[group[neg[:, 0]] != group[neg[:, 1]]][:60]
    splits = {"train": (pairs[:-60], None), "valid": (pairs[-60:-30], neg[:30]), "test": (pairs[-30:], neg[30:])}
    graph = {
        "n": n,
        "edge_index": np.concatenate([pairs[:-60], pairs[:-60, ::-1]]).T,
        "splits": splits,
        "x": np.zeros((n, 1), np.float32),
    }
    cfg = dict(BASE, model="gcn", arch="coupled", decoder="mlp", dropout=0.0, lr=0.01, link_batch=64, mode="single")
    res = trace_all([(cfg, False)], graph, 30)[0]
    assert res["losses"][-1] < 0.7 * res["losses"][0], res["losses"]
    assert res["metrics"]["valid"] > 0.8 and res["metrics"]["test"] > 0.8, res["metrics"]
