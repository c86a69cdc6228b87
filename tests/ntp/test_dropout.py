"""Dropout masks are a function of (stream, global row, column) alone: the same for every world size, in one
vectorised pass, with the right keep rate and no visible structure."""
from __future__ import annotations

import pytest
import torch

from ntp.config import TrainConfig
from ntp.engine.dist import DistEnv
from ntp.engine.layers import hash_keep_mask, philox_keep_mask
from ntp.engine.partition import Partition
from ntp.engine.setup import setup
from tests.ntp.graphs import loader, random_graph

CPU = torch.device("cpu")
SINGLE = DistEnv(0, 1, 0, 1, CPU, None)
GRAPH = random_graph(n=40, d=7, classes=3, seed=2)
GENERATORS = {"philox (CPU)": lambda rows, w, p, s: philox_keep_mask(rows, w, p, s),
              "hash (CUDA; run here on CPU)": lambda rows, w, p, s: hash_keep_mask(rows, w, p, s, CPU)}


@pytest.mark.parametrize("gen", GENERATORS.values(), ids=GENERATORS.keys())
@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_every_world_size_draws_the_same_mask(gen, world: int) -> None:
    n, width, p, stream = 1013, 37, 0.4, 2**70 + 5  # sizes that divide nothing; a stream past 64 bits
    whole = gen((0, n), width, p, stream)
    parts = [gen(Partition(n, world, r).rows(), width, p, stream) for r in range(world)]
    assert torch.equal(torch.cat(parts), whole)


@pytest.mark.parametrize("gen", GENERATORS.values(), ids=GENERATORS.keys())
@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_keep_rate_and_independence(gen, p: float) -> None:
    mask = gen((5_000, 25_000), 64, p, 11).float()
    assert abs(mask.mean().item() - (1 - p)) < 0.005
    assert (mask.mean(0) - (1 - p)).abs().max() < 0.03, "every column keeps at the same rate"
    assert (mask.mean(1) - (1 - p)).abs().mean() < 0.1, "every row keeps at about the same rate"
    other = gen((5_000, 25_000), 64, p, 12).float()
    agree = (mask == other).float().mean().item()
    assert abs(agree - ((1 - p) ** 2 + p**2)) < 0.005, "another stream (step, layer) is an independent mask"
    neighbours = (mask[:, 1:] == mask[:, :-1]).float().mean().item()
    assert abs(neighbours - ((1 - p) ** 2 + p**2)) < 0.005, "adjacent columns are independent"


@pytest.mark.parametrize("arch, model", [("coupled", "sage"), ("decoupled", "gcn")])
def test_input_dropout_is_its_own_rate(arch: str, model: str) -> None:
    """One layer: its input is all that is dropped. With --input-dropout 0 training computes what evaluation does
    (PyG's and OGB's models drop only between layers); left out, the input's rate is --dropout's."""
    for input_dropout, dropped in ((0.0, False), (None, True)):
        cfg = TrainConfig(model=model, arch=arch, nn_layers=1, hidden=8, dropout=0.5, input_dropout=input_dropout,
                          mode="single")
        job = setup(cfg, SINGLE, loader(GRAPH))
        train, evaluate = job.model.train()(job.x, job.ctx), job.model.eval()(job.x, job.ctx)
        assert torch.allclose(train, evaluate) != dropped
