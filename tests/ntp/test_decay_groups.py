"""--weight-decay-layers first (Kipf & Welling's GCN, PyG's gcn.py example): the optimizer decays the layer that
reads the features and no other; the default decays every parameter; tasks whose models have no such layer refuse
the option with its fix."""

from __future__ import annotations

import pytest
import torch

from ntp.config import TrainConfig
from ntp.engine.distributed.dist import DistEnv
from ntp.engine.train.setup import setup
from ntp.errors import ConfigError
from tests.ntp.graphs import loader, random_graph

SINGLE = DistEnv(0, 1, 0, 1, torch.device("cpu"), None)
GRAPH = random_graph(n=60, d=9, classes=3, seed=5)


def _groups(**options) -> tuple[list[tuple[set[int], float]], torch.nn.Module]:
    job = setup(TrainConfig(model="gcn", hidden=8, weight_decay=5e-4, **options), SINGLE, loader(GRAPH))
    groups = [({id(p) for p in g["params"]}, g["weight_decay"]) for g in job.optimizer.param_groups]
    return groups, job.model


@pytest.mark.parametrize(
    "options, first",
    [
        (dict(arch="coupled"), lambda m: m.layers[0]),
        (dict(arch="coupled", input_proj=True, residual=True), lambda m: m.project),
        (dict(arch="decoupled", nn_layers=3), lambda m: m.mlp.linears[0]),
    ],
    ids=["coupled", "input-projection", "decoupled"],
)
def test_only_the_first_layer_is_decayed(options: dict, first) -> None:
    groups, model = _groups(weight_decay_layers="first", **options)
    decayed = {id(p) for p in first(model).parameters()}
    rest = {id(p) for p in model.parameters()} - decayed
    assert decayed and rest
    assert groups == [(decayed, 5e-4), (rest, 0.0)]


def test_every_parameter_is_decayed_by_default() -> None:
    groups, model = _groups(arch="coupled")
    assert groups == [({id(p) for p in model.parameters()}, 5e-4)]


def test_link_and_heterogeneous_stores_refuse_it() -> None:
    from ntp.engine.tasks.hetero.task import HeteroTask
    from ntp.engine.tasks.link.task import LinkTask

    for task, options in ((LinkTask(), {}), (HeteroTask(), {"model": "rgcn"})):
        with pytest.raises(ConfigError, match="--weight-decay-layers first: node classifiers only.*drop it"):
            task.check(TrainConfig(weight_decay_layers="first", **options))
