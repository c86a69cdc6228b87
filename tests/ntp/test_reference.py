"""The single-process models equal independent implementations: PyG layers (coupled) and dense matrix math
(decoupled), forward and backward, on a directed graph."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch_geometric.nn import GATConv, GCNConv, GINConv, SAGEConv

from ntp.config import TrainConfig
from ntp.engine.distributed.dist import DistEnv
from ntp.engine.infer.predict import embedding_layers
from ntp.engine.train.setup import setup
from tests.ntp.graphs import loader, random_graph

GRAPH = random_graph(n=60, d=11, classes=4, directed=True, seed=5)
SINGLE = DistEnv(0, 1, 0, 1, torch.device("cpu"), None)


def _job(**kw):
    cfg = TrainConfig(**{"hidden": 8, "heads": 2, "dropout": 0.0, "seed": 1, "mode": "single", **kw})
    job = setup(cfg, SINGLE, loader(GRAPH))
    job.model.eval()
    return job


def _dense_adjacency() -> torch.Tensor:
    """adj[v, u] = number of edges u -> v."""
    n = GRAPH["x"].shape[0]
    adj = torch.zeros(n, n)
    src, dst = (torch.from_numpy(a) for a in GRAPH["edge_index"])
    adj.index_put_((dst, src), torch.ones(len(src)), accumulate=True)
    return adj


def _with_loops(adj: torch.Tensor) -> torch.Tensor:
    a = adj.clone()
    a.fill_diagonal_(0)
    return a + torch.eye(len(a))


def _dense_operator(model: str) -> torch.Tensor:
    adj = _dense_adjacency()
    if model in ("gcn", "sgc", "appnp"):
        a = _with_loops(adj)
        dinv = a.sum(1).rsqrt()
        return dinv[:, None] * a * dinv[None, :]
    if model == "sage":
        a = _with_loops(adj)
        return a / a.sum(1, keepdim=True)
    return adj + torch.eye(len(adj))  # gin: existing self-loops kept, plus the root term


def _compare(job, reference_forward, params_ours, params_ref):
    x = job.x.clone()
    ours = job.model(x, job.ctx)
    ref = reference_forward(x)
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-5)
    weights = torch.randn_like(ours)
    (ours * weights).sum().backward()
    (ref * weights).sum().backward()
    for a, b in zip(params_ours, params_ref):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("model", ["gcn", "sgc", "appnp", "sage", "gin"])
def test_decoupled_equals_dense_math(model: str) -> None:
    job = _job(model=model, arch="decoupled", nn_layers=2, prop_steps=3)
    params = list(job.model.mlp.parameters())  # w0, b0, w1, b1
    leaves = [p.detach().clone().requires_grad_() for p in params]
    a_hat = _dense_operator(model)
    act = (lambda t: t) if model == "sgc" else F.relu

    def dense(x):
        z = F.linear(act(F.linear(x, leaves[0], leaves[1])), leaves[2], leaves[3])
        h = z
        for _ in range(3):
            h = (1 - 0.1) * a_hat @ h + 0.1 * z if model == "appnp" else a_hat @ h
        return h

    _compare(job, dense, params, leaves)


def test_decoupled_gat_equals_dense_attention() -> None:
    job = _job(model="gat", arch="decoupled", nn_layers=1, prop_steps=2)
    att = job.model.attention
    counts = _with_loops(_dense_adjacency())  # a duplicated edge is two messages, as in PyG

    def dense(x):
        z = job.model.mlp.linears[0](x)
        out = 0
        for h in range(att.heads):
            s_src, s_dst = z @ att.att_src[0, h], z @ att.att_dst[0, h]
            e = F.leaky_relu(s_dst[:, None] + s_src[None, :], 0.2)
            w = counts * torch.exp(e - e.max(dim=1, keepdim=True).values)
            a = w / w.sum(dim=1, keepdim=True)
            out = out + a @ (a @ z)
        return out / att.heads

    ours = job.model(job.x, job.ctx)
    ref = dense(job.x)
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-5)
    w = torch.randn_like(ours)
    g_ours = torch.autograd.grad((ours * w).sum(), [att.att_src, att.att_dst])
    g_ref = torch.autograd.grad((ref * w).sum(), [att.att_src, att.att_dst])
    for a, b in zip(g_ours, g_ref):
        assert b.abs().max() > 0  # the attention parameters really are trained
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def _copy_bias(theirs: torch.Tensor | None, ours: torch.Tensor | None) -> None:
    assert (theirs is None) == (ours is None)
    if ours is not None:
        theirs.data.copy_(ours.data)


def _pyg_pair(model: str, job):
    layers = job.model.layers
    if model == "gcn":
        convs = [
            GCNConv(layer.lin.in_features, layer.lin.out_features, bias=layer.bias is not None) for layer in layers
        ]
        for c, layer in zip(convs, layers):
            c.lin.weight.data.copy_(layer.lin.weight.data)
            _copy_bias(c.bias, layer.bias)
        return convs, [layer.lin.weight for layer in layers], [c.lin.weight for c in convs]
    if model == "sage":
        convs = [
            SAGEConv(layer.lin_l.in_features, layer.lin_l.out_features, bias=layer.lin_l.bias is not None)
            for layer in layers
        ]
        for c, layer in zip(convs, layers):
            c.lin_l.load_state_dict(layer.lin_l.state_dict())
            c.lin_r.load_state_dict(layer.lin_r.state_dict())
        return convs, [layer.lin_r.weight for layer in layers], [c.lin_r.weight for c in convs]
    if model == "gin":
        convs = []
        for layer in layers:
            conv = GINConv(
                torch.nn.Sequential(
                    torch.nn.Linear(layer.lin1.in_features, layer.lin1.out_features),
                    torch.nn.ReLU(),
                    torch.nn.Linear(layer.lin2.in_features, layer.lin2.out_features, bias=layer.lin2.bias is not None),
                )
            )
            conv.nn[0].load_state_dict(layer.lin1.state_dict())  # after construction: GINConv re-initialises its nn
            conv.nn[2].load_state_dict(layer.lin2.state_dict())
            convs.append(conv)
        return convs, [layer.lin1.weight for layer in layers], [c.nn[0].weight for c in convs]
    convs = [
        GATConv(
            layer.lin.in_features, layer.head_dim, heads=layer.heads, concat=layer.concat, bias=layer.bias is not None
        )
        for layer in layers
    ]
    for c, layer in zip(convs, layers):
        c.lin.weight.data.copy_(layer.lin.weight.data)
        c.att_src.data.copy_(layer.attention.att_src.data)
        c.att_dst.data.copy_(layer.attention.att_dst.data)
        _copy_bias(c.bias, layer.bias)
    return convs, [layer.attention.att_src for layer in layers], [c.att_src for c in convs]


@pytest.mark.parametrize("hidden", [8, 16], ids=["narrower-than-features", "wider-than-features"])
@pytest.mark.parametrize("model", ["gcn", "sage", "gin", "gat"])
def test_coupled_equals_pyg(model: str, hidden: int) -> None:
    """Against PyG's layers, which always multiply first: ours propagate the 11 features before the first Linear
    when the layer is wider (hidden 16), after it otherwise."""
    job = _job(model=model, arch="coupled", nn_layers=3, hidden=hidden)
    convs, ours_params, ref_params = _pyg_pair(model, job)
    edge_index = torch.from_numpy(GRAPH["edge_index"])
    act = F.elu if model == "gat" else F.relu

    def pyg(x):
        for i, conv in enumerate(convs):
            x = conv(x, edge_index)
            x = act(x) if i < len(convs) - 1 else x
        return x

    _compare(job, pyg, ours_params, ref_params)


def _copied(module: torch.nn.Module) -> torch.nn.Module:
    """A plain torch module with ``module``'s parameters (Linear, LayerNorm, BatchNorm1d, Identity)."""
    if isinstance(module, torch.nn.Identity):
        return torch.nn.Identity()
    if isinstance(module, torch.nn.LayerNorm):
        plain = torch.nn.LayerNorm(module.normalized_shape)
    elif hasattr(module, "running_mean"):
        plain = torch.nn.BatchNorm1d(module.weight.shape[0])
    else:
        plain = torch.nn.Linear(module.in_features, module.out_features, bias=module.bias is not None)
    plain.load_state_dict(module.state_dict(), strict=False)
    return plain


@pytest.mark.parametrize(
    "model, options",
    [
        ("gcn", dict(residual=True, jk="cat", norm="layer", input_proj=True)),
        ("sage", dict(residual=True, jk="max", norm="batch")),
        ("gat", dict(residual=True, jk="sum", norm="layer")),
        ("gin", dict(residual=True, norm="batch", input_proj=True)),
    ],
)
def test_classic_options_equal_pyg_layers_composed_as_basic_gnn(model: str, options: dict) -> None:
    """Residual, jumping knowledge, input projection and norms as PyG's BasicGNN (and tunedGNN) compose them around
    PyG's layers: projection; per layer conv + skip (identity, or a projection where widths differ), then norm and
    activation where one follows; the head on the combined outputs. In training mode: batch norm's batch
    statistics (dropout is 0)."""
    job = _job(model=model, arch="coupled", nn_layers=3, **options)
    ours = job.model
    ours.train()
    convs, ours_params, ref_params = _pyg_pair(model, job)
    project = _copied(ours.project) if ours.project is not None else None
    skips = [_copied(s) for s in ours.skips]
    norms = [_copied(n) for n in ours.norms]
    head = _copied(ours.head) if ours.head is not None else None
    edge_index = torch.from_numpy(GRAPH["edge_index"])
    act = F.elu if model == "gat" else F.relu
    combine = {"cat": lambda xs: torch.cat(xs, 1), "max": lambda xs: torch.stack(xs).amax(0)}
    combine["sum"] = lambda xs: sum(xs)

    embeddings = []  # each layer's output after residual and norm, before the activation: what exports take

    def reference(x):
        x = project(x) if project is not None else x
        outputs = []
        for i, conv in enumerate(convs):
            h = conv(x, edge_index) + skips[i](x)
            if i < len(norms):
                embeddings.append(norms[i](h))
                h = act(embeddings[-1])
                outputs.append(h)
            x = h
        return head(combine[options["jk"]](outputs)) if head is not None else x

    pairs = [(ours.norms[1].weight, norms[1].weight)]
    pairs += [(a.weight, b.weight) for a, b in zip(ours.skips, skips) if not isinstance(b, torch.nn.Identity)]
    if head is not None:
        pairs.append((ours.head.weight, head.weight))
    if project is not None:
        pairs.append((ours.project.weight, project.weight))
    layers = embedding_layers(ours)
    assert len(layers) == 3 + (head is not None) and (head is None or layers[-1] is ours.head)
    taken = []
    hooks = [layer.register_forward_hook(lambda m, i, out: taken.append(out.detach())) for layer in layers[:2]]
    _compare(job, reference, [*ours_params, *(a for a, _ in pairs)], [*ref_params, *(b for _, b in pairs)])
    for hook in hooks:
        hook.remove()
    for ours_embedding, ref_embedding in zip(taken, embeddings[:2]):
        torch.testing.assert_close(ours_embedding, ref_embedding, rtol=1e-5, atol=1e-5)
