"""One R-GCN layer against PyTorch Geometric's RGCNConv (forward and backward; full, basis and block-diagonal
weights) and against dense matrix math for the normalisations PyG does not have; the graph is directed and its types
have different sizes."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ntp.engine.distributed.collectives import Comm
from ntp.engine.distributed.partition import Partition
from ntp.engine.tasks.hetero.data import hetero_from_arrays
from ntp.engine.tasks.hetero.relations import HeteroContext
from ntp.engine.tasks.hetero.rgcn import RGCNLayer
from tests.ntp.hetero_worker import hetero_graph

IN, OUT = 8, 6


def _setup(norm: str):
    g = hetero_graph(seed=4)
    data = hetero_from_arrays(g["counts"], g["edges"], {}, g["target"], g["labels"], g["splits"], num_classes=4)
    comm = Comm(Partition(data.counts["paper"], 1, 0), torch.device("cpu"))
    hc = HeteroContext(data, comm, norm=norm, chunk_rows=5, seed=0)
    offsets = dict(zip(hc.types, np.cumsum([0] + [data.counts[t] for t in hc.types]).tolist()))
    torch.manual_seed(0)
    x = torch.randn(data.num_nodes, IN, dtype=torch.float64)
    return data, hc, offsets, x


def _ours(layer: RGCNLayer, hc: HeteroContext, offsets: dict, x: torch.Tensor) -> torch.Tensor:
    feats = {t: x[offsets[t] : offsets[t] + hc.counts[t]] for t in hc.types}
    out = layer(feats, feats, hc, hc.types)
    return torch.cat([out[t] for t in hc.types])


@pytest.mark.parametrize("stacked", [True, False], ids=["stacked-relations", "per-pair"])
@pytest.mark.parametrize("decomposition,num_bases", [("none", 0), ("basis", 2), ("block", 2)])
def test_layer_equals_pyg_rgcnconv(decomposition: str, num_bases: int, stacked: bool, monkeypatch) -> None:
    """Both ways of applying the relation weights (ntp.engine.tasks.hetero.rgcn.stacks_relations picks one by size)."""
    from torch_geometric.nn import RGCNConv

    import ntp.engine.tasks.hetero.rgcn as rgcn

    monkeypatch.setattr(rgcn, "stacks_relations", lambda *sizes: stacked)
    data, hc, offsets, x = _setup("mean")
    layer = RGCNLayer(hc.num_relations, IN, OUT, decomposition, num_bases).double()
    dst_local = [np.repeat(np.arange(len(r.indptr) - 1), np.diff(r.indptr)) for r in data.relations]
    edge_index = torch.from_numpy(
        np.stack(
            [
                np.concatenate([np.asarray(r.indices, np.int64) + offsets[r.src] for r in data.relations]),
                np.concatenate([d + offsets[r.dst] for d, r in zip(dst_local, data.relations)]),
            ]
        )
    )
    edge_type = torch.from_numpy(np.concatenate([np.full(len(r.indices), i) for i, r in enumerate(data.relations)]))
    conv = RGCNConv(
        IN,
        OUT,
        len(data.relations),
        num_bases=num_bases if decomposition == "basis" else None,
        num_blocks=num_bases if decomposition == "block" else None,
        aggr="mean",
    ).double()
    with torch.no_grad():
        if decomposition == "basis":
            conv.weight.copy_(layer.rel.bases)
            conv.comp.copy_(layer.rel.comp)
        else:
            conv.weight.copy_(layer.rel.blocks if decomposition == "block" else layer.rel.weight)
        conv.root.copy_(layer.root.weight.T)
        conv.bias.copy_(layer.root.bias)
    x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
    ours, theirs = _ours(layer, hc, offsets, x1), conv(x2, edge_index, edge_type)
    torch.testing.assert_close(ours, theirs)
    grad = torch.randn_like(ours)
    ours.backward(grad)
    theirs.backward(grad)
    torch.testing.assert_close(x1.grad, x2.grad)
    torch.testing.assert_close(layer.root.weight.grad, conv.root.grad.T)
    if decomposition == "basis":
        torch.testing.assert_close(layer.rel.bases.grad, conv.weight.grad)
        torch.testing.assert_close(layer.rel.comp.grad, conv.comp.grad)
    else:
        torch.testing.assert_close(
            (layer.rel.blocks if decomposition == "block" else layer.rel.weight).grad, conv.weight.grad
        )


@pytest.mark.parametrize("norm", ["total", "sum"])
def test_layer_equals_dense_math(norm: str) -> None:
    data, hc, offsets, x = _setup(norm)
    layer = RGCNLayer(hc.num_relations, IN, OUT, "none", 0).double()
    n = data.num_nodes
    adj = torch.zeros(len(data.relations), n, n, dtype=torch.float64)  # adj[r, v, u]: edges u -> v of relation r
    for i, r in enumerate(data.relations):
        for v in range(len(r.indptr) - 1):
            for u in r.indices[r.indptr[v] : r.indptr[v + 1]]:
                adj[i, offsets[r.dst] + v, offsets[r.src] + int(u)] += 1
    if norm == "total":
        adj = adj / adj.sum(dim=(0, 2)).clamp(min=1)[None, :, None]
    x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
    dense = x2 @ layer.root.weight.T + layer.root.bias + torch.einsum("rvu,ui,rio->vo", adj, x2, layer.rel.weight)
    ours = _ours(layer, hc, offsets, x1)
    torch.testing.assert_close(ours, dense)
    grad = torch.randn_like(ours)
    ours.backward(grad)
    dense.backward(grad)
    torch.testing.assert_close(x1.grad, x2.grad)  # the transpose, not A, in the backward: relations are directed


def test_wrong_model_or_options_say_the_fix() -> None:
    from ntp.config import TrainConfig
    from ntp.engine.distributed.dist import DistEnv
    from ntp.engine.train.setup import setup
    from ntp.errors import ConfigError
    from tests.ntp.graphs import loader, random_graph
    from tests.ntp.hetero_worker import hetero_loader

    env = DistEnv(0, 1, 0, 1, torch.device("cpu"), None)
    with pytest.raises(ConfigError, match="heterogeneous .*use --model rgcn"):
        setup(TrainConfig(model="gcn", mode="single"), env, hetero_loader(hetero_graph()))
    with pytest.raises(ConfigError, match="--model rgcn needs a heterogeneous store"):
        setup(TrainConfig(model="rgcn", mode="single"), env, loader(random_graph()))
    with pytest.raises(ConfigError, match="--decomposition basis needs --num-bases"):
        TrainConfig(model="rgcn", arch="coupled", decomposition="basis")
    with pytest.raises(ConfigError, match="use --model rgcn --arch coupled"):
        TrainConfig(model="gcn", decomposition="block", num_bases=2)
    for option in (dict(offload="topology"), dict(overlap=True), dict(nn_device="cpu")):  # it ignored the last
        with pytest.raises(ConfigError, match="--nn-device cpu apply to homogeneous models.*--memory-budget"):
            TrainConfig(model="rgcn", **option)
    assert TrainConfig(model="rgcn", memory_budget="1GB").memory_budget_bytes == 1_000_000_000
    with pytest.raises(ValueError, match="not divisible by --num-bases 3"):
        RGCNLayer(2, 8, 6, "block", 3)


def test_rowwise_adam_updates_only_rows_with_a_gradient_and_is_adam_there() -> None:
    from ntp.engine.nn.rowwise_adam import RowwiseAdam

    torch.manual_seed(0)
    table, dense = torch.nn.Parameter(torch.randn(5, 3)), torch.nn.Parameter(torch.randn(4))
    ref_table, ref_dense = torch.nn.Parameter(table.detach().clone()), torch.nn.Parameter(dense.detach().clone())
    opt = RowwiseAdam(
        [{"params": [dense]}, {"params": [table], "rowwise": True, "weight_decay": 0.0}], lr=0.1, weight_decay=0.01
    )
    ref = torch.optim.Adam(
        [{"params": [ref_dense]}, {"params": [ref_table], "weight_decay": 0.0}], lr=0.1, weight_decay=0.01
    )
    for step in range(3):
        g = torch.randn(5, 3)
        g[1] = 0  # row 1 never gets a gradient; row 3 only from step 1 on
        if step == 0:
            g[3] = 0
        before = table.detach().clone()
        table.grad, ref_table.grad = g.clone(), g.clone()
        dense.grad = ref_dense.grad = torch.randn(4)
        opt.step()
        ref.step()
        torch.testing.assert_close(table[1], before[1], rtol=0, atol=0)
        torch.testing.assert_close(dense, ref_dense)  # ordinary Adam with weight decay
        if step == 0:
            torch.testing.assert_close(table[3], before[3], rtol=0, atol=0)
        else:  # rows with a gradient every step are exactly Adam's
            torch.testing.assert_close(table[[0, 2, 4]], ref_table[[0, 2, 4]])
