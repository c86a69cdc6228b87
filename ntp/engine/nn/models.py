"""GNN models in two architectures, each runnable single-process or tensor parallel.

Every model maps row-layout features ``x`` [rows of this rank, in_dim] to row-layout logits [rows, out_dim].
NN operations run on rows; graph propagation runs on column slices between a ``split`` and a ``gather``. With one
rank the collectives are identities, so ``--mode single`` is the same code with no communication.

- Decoupled (predict, then propagate): ``Z = MLP(X)``; split once; K propagation steps on the slice; gather once.
- Coupled (classic layers): every layer transforms rows, splits, aggregates the slice, gathers: the paper's
  "naive" tensor parallelism. Aggregation and the layer's first Linear commute, so it runs at the narrower of the
  two widths (:func:`propagated_linear`), as DGL's GraphConv does. Each layer's split-aggregate-gather is one
  ``propagate_rows`` call, so the context may pipeline it like the decoupled propagation. Streamed
  (``--nn-device stream``), the layers' row-wise parts are segments that split their output and gather their input
  themselves, a block of rows at a time (``GraphContext.rows``), with the propagation between them.
"""

from __future__ import annotations

from functools import partial

import torch
import torch.nn.functional as F
from torch import nn

from ntp.config import TrainConfig
from ntp.engine.device.precision import autocast
from ntp.engine.distributed.collectives import all_gather_rows
from ntp.engine.distributed.traffic import ATTENTION
from ntp.engine.kernels import packed
from ntp.engine.kernels.dropout import RowDropout, layer_dropouts
from ntp.engine.kernels.linear import Linear, linear
from ntp.engine.nn.layers import MLP, jk_width, jumping_knowledge, make_norm, skip_connection
from ntp.engine.nn.segments import (
    NO_DROPOUT,
    after_then_before,
    as_gathered,
    classic_first,
    classic_segment,
    first_before,
    jk_head,
)
from ntp.engine.parallel.context import GraphContext, Graphed
from ntp.engine.parallel.row_stream import Tail

#: Decoupled propagation operator of each model (see ntp.engine.graph.operators).


# -- attention (GAT) ----------------------------------------------------------------------------------------------
class EdgeAttention(nn.Module):
    """GAT scores split into per-vertex scalars: e(u->v) = LeakyReLU(a_src . z_u + a_dst . z_v), per head.

    The scalars are computed on owned rows and all-gathered (n x heads values); every rank then forms the same edge
    softmax. Their gradient is the sum of every rank's partial gradient (the all-gather's backward)."""

    def __init__(self, heads: int, head_dim: int, negative_slope: float = 0.2) -> None:
        super().__init__()
        self.heads, self.head_dim, self.negative_slope = heads, head_dim, negative_slope
        self.att_src = nn.Parameter(torch.empty(1, heads, head_dim))
        self.att_dst = nn.Parameter(torch.empty(1, heads, head_dim))
        nn.init.xavier_uniform_(self.att_src)
        nn.init.xavier_uniform_(self.att_dst)

    def forward(self, z_rows: torch.Tensor, ctx: GraphContext, shared_heads: bool = False) -> torch.Tensor:
        """Edge softmax weights [E, heads]. ``shared_heads``: every head scores the same ``z`` (decoupled)."""
        z = z_rows.unsqueeze(1) if shared_heads else z_rows.view(-1, self.heads, self.head_dim)
        scores = torch.cat([(z * self.att_src).sum(-1), (z * self.att_dst).sum(-1)], dim=1)
        scores = all_gather_rows(scores.to(ctx.device), ctx.comm, ATTENTION)  # edges live on the rank's device
        return ctx.attention_topology.attention(scores[:, : self.heads], scores[:, self.heads :], self.negative_slope)


def propagate_heads(
    ctx: GraphContext, alpha: torch.Tensor, h_cols: torch.Tensor, width: int, head_dim: int
) -> torch.Tensor:
    """Aggregate this rank's column slice of a ``width``-wide, head-major matrix with each column's head weights."""
    c0, c1 = ctx.graph_cols(width)
    parts = []
    heads_here = range(c0 // head_dim, (c1 - 1) // head_dim + 1) if c1 > c0 else range(0)
    for head in heads_here:
        a, b = max(c0, head * head_dim) - c0, min(c1, (head + 1) * head_dim) - c0
        parts.append(ctx.propagate_weighted(alpha[:, head].contiguous(), h_cols[:, a:b]))
    return torch.cat(parts, dim=1) if parts else h_cols


class GraphModel(nn.Module):
    """A model of the context's graph, run in the context's precision (ntp.engine.device.precision); outputs are float32."""

    def forward(self, x: torch.Tensor, ctx: GraphContext, tail: Tail | None = None) -> torch.Tensor:
        """The output rows, or, given ``tail`` (a value a row: training's loss), the sum of ``tail(ctx, output
        rows)`` over the rank's rows: a model whose last step streams fuses the tail into it (:meth:`compute_tail`),
        so that the output's rows never exist whole (in training, the logits and their gradient: 8 bytes a class a
        row), and takes its gradients in the forward (ntp.engine.parallel.row_stream: summed)."""
        with autocast(ctx.precision, x.device):
            return self.compute(x, ctx).float() if tail is None else self.compute_tail(x, ctx, tail)

    def compute(self, x: torch.Tensor, ctx: GraphContext) -> torch.Tensor:
        raise NotImplementedError

    def compute_tail(self, x: torch.Tensor, ctx: GraphContext, tail: Tail) -> torch.Tensor:
        return tail(ctx, self.compute(x, ctx).float()).sum()

    def first_layer(self) -> nn.Module:
        """The layer that reads the features (what ``--weight-decay-layers first`` decays)."""
        raise NotImplementedError


# -- decoupled architecture ----------------------------------------------------------------------------------------
class DecoupledGNN(GraphModel):
    """``gather(P^K(split(MLP(X))))`` with a model-specific propagation ``P``."""

    def __init__(self, cfg: TrainConfig, in_dim: int, out_dim: int) -> None:
        super().__init__()
        spec = cfg.model_spec
        self.operator, self.steps, self.out_dim = spec.operator, cfg.prop_steps, out_dim
        self.alpha = cfg.alpha if spec.teleport else None
        self.mlp = MLP(
            in_dim,
            cfg.hidden,
            out_dim,
            cfg.nn_layers,
            dropout=cfg.dropout,
            input_dropout=cfg.first_dropout,
            norm=cfg.norm,
            activation=spec.mlp_activation,
        )
        self.attention = EdgeAttention(cfg.heads, out_dim) if spec.attention else None

    def compute(self, x: torch.Tensor, ctx: GraphContext) -> torch.Tensor:
        if ctx.streams_rows:
            return ctx.from_graph(*self._streamed(x, ctx))
        z = ctx.rows(self._mlp, x, params=self.mlp.parameters())
        if self.attention is None:  # split, K steps, gather: one call, so the context may pipeline it
            return ctx.propagate_rows(self.operator, z, self.steps, self.alpha)
        z_cols = ctx.to_graph(z)
        h = self._attend(z, z_cols, ctx)
        return ctx.from_graph(h, self.out_dim)

    def compute_tail(self, x: torch.Tensor, ctx: GraphContext, tail: Tail) -> torch.Tensor:
        """Streamed, the tail runs on the propagated rows a block at a time as they are gathered."""
        if not ctx.streams_rows:
            return super().compute_tail(x, ctx, tail)
        return ctx.rows(as_gathered, self._streamed(x, ctx), tail=tail)

    def first_layer(self) -> nn.Module:
        return self.mlp.linears[0]

    def _streamed(self, x: torch.Tensor, ctx: GraphContext) -> Graphed:
        """The MLP streamed in row blocks, its output split in its own passes, then the K steps in the graph layout
        (not GAT's: the config refuses to stream it)."""
        z = ctx.rows(self._mlp, x, params=self.mlp.parameters(), to_graph=True)
        return ctx.propagated(self.operator, z, self.steps, self.alpha)

    def _mlp(self, ctx: GraphContext, x: torch.Tensor) -> torch.Tensor:
        return self.mlp(x, ctx)

    def _attend(self, z_rows: torch.Tensor, z_cols: torch.Tensor, ctx: GraphContext) -> torch.Tensor:
        alpha = self.attention(z_rows, ctx, shared_heads=True)
        heads = alpha.shape[1]
        out = 0
        for head in range(heads):
            h = z_cols
            for _ in range(self.steps):
                h = ctx.propagate_weighted(alpha[:, head].contiguous(), h)
            out = out + h
        return out / heads


# -- coupled architecture (naive tensor parallelism) ---------------------------------------------------------------
def propagated_linear(
    ctx: GraphContext,
    name: str,
    x: torch.Tensor,
    weight: torch.Tensor,
    dropout: RowDropout | None = None,
    relu: bool = False,
) -> torch.Tensor:
    """``P (dropout(x) W^T)`` (with ``relu``, of ``relu(x)`` dropped) for the propagation ``name``, propagated at the
    narrower of the input and output widths (exact by linearity): fewer columns to split, aggregate and gather; and
    on the input features, which need no gradient, no backward product at all. Multiplied first, the dropout runs
    inside the product (:meth:`RowDropout.linear`)."""
    if weight.shape[1] < weight.shape[0]:
        x = dropout(x, ctx, relu) if dropout is not None else x
        return linear(ctx.propagate_rows(name, x, 1), weight)
    z = dropout.linear(x, ctx, weight, relu=relu) if dropout is not None else linear(x, weight)
    return ctx.propagate_rows(name, z, 1)


def widens(weight: torch.Tensor) -> bool:
    """Whether a product with ``weight`` widens its input: :func:`propagated_linear` then propagates first."""
    return weight.shape[1] < weight.shape[0]


class GCNLayer(nn.Module):
    """PyG GCNConv: ``A_gcn @ (x W) + b``."""

    operator = "gcn"
    reads_input_after = False  #: whether :meth:`after` reads the layer's input

    def __init__(self, in_dim: int, out_dim: int, bias: bool = True) -> None:
        super().__init__()
        self.lin = Linear(in_dim, out_dim, bias=False)
        self.bias = nn.Parameter(torch.zeros(out_dim)) if bias else None

    def forward(self, x: torch.Tensor, ctx: GraphContext, dropout: RowDropout, relu: bool = False) -> torch.Tensor:
        return biased(propagated_linear(ctx, "gcn", x, self.lin.weight, dropout, relu), self.bias)

    # the same layer as two row-wise parts around its propagation (CoupledGNN's streamed form)
    def before(self, ctx: GraphContext, x: torch.Tensor, dropout: RowDropout, relu: bool) -> torch.Tensor:
        return dropped_product(ctx, x, self.lin.weight, dropout, relu)

    def after(
        self, ctx: GraphContext, p: torch.Tensor, x: torch.Tensor | None, dropout: RowDropout, relu: bool
    ) -> torch.Tensor:
        return biased(product_after(p, self.lin.weight), self.bias)


def biased(x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``x + bias``; a layer followed by batch norm has none (it would cancel, and Adam would amplify its
    rounding-level gradient into steps that differ between layouts)."""
    return x if bias is None else x + bias


def dropped_product(
    ctx: GraphContext, x: torch.Tensor, weight: torch.Tensor, dropout: RowDropout | None, relu: bool
) -> torch.Tensor:
    """The row-wise part of :func:`propagated_linear` before its propagation: the dropout, and the product where it
    narrows."""
    if widens(weight):
        return dropout(x, ctx, relu) if dropout is not None else x
    return dropout.linear(x, ctx, weight, relu=relu) if dropout is not None else linear(x, weight)


def product_after(p: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """The row-wise part of :func:`propagated_linear` after its propagation: the product where it widens."""
    return linear(p, weight) if widens(weight) else p


class SAGELayer(nn.Module):
    """PyG SAGEConv (mean): ``mean_{u in N(v)} x_u W_l + b_l + x_v W_r``."""

    operator = "mean"
    reads_input_after = True

    def __init__(self, in_dim: int, out_dim: int, bias: bool = True) -> None:
        super().__init__()
        self.lin_l = Linear(in_dim, out_dim, bias=bias)
        self.lin_r = Linear(in_dim, out_dim, bias=False)

    def forward(self, x: torch.Tensor, ctx: GraphContext, dropout: RowDropout, relu: bool = False) -> torch.Tensor:
        x = dropout(x, ctx, relu)  # two products read it
        agg = biased(propagated_linear(ctx, "mean", x, self.lin_l.weight), self.lin_l.bias)  # the unbiased one dies
        return agg + self.lin_r(x)

    def before(self, ctx: GraphContext, x: torch.Tensor, dropout: RowDropout, relu: bool) -> torch.Tensor:
        return dropped_product(ctx, dropout(x, ctx, relu), self.lin_l.weight, None, False)

    def after(
        self, ctx: GraphContext, p: torch.Tensor, x: torch.Tensor | None, dropout: RowDropout, relu: bool
    ) -> torch.Tensor:  # the root term drops the input again: the same mask
        return biased(product_after(p, self.lin_l.weight), self.lin_l.bias) + self.lin_r(dropout(x, ctx, relu))


class GINLayer(nn.Module):
    """PyG GINConv (eps = 0) with nn = Linear-ReLU-Linear: ``nn(x_v + sum_{u in N(v)} x_u)``."""

    operator = "sum_root"
    reads_input_after = False

    def __init__(self, in_dim: int, out_dim: int, hidden: int, bias: bool = True) -> None:
        super().__init__()
        self.lin1 = Linear(in_dim, hidden)
        self.lin2 = Linear(hidden, out_dim, bias=bias)

    def forward(self, x: torch.Tensor, ctx: GraphContext, dropout: RowDropout, relu: bool = False) -> torch.Tensor:
        agg = propagated_linear(ctx, "sum_root", x, self.lin1.weight, dropout, relu) + self.lin1.bias
        return self.lin2(packed.relu(agg, inplace=True))  # the biased sum is the ReLU's alone

    def before(self, ctx: GraphContext, x: torch.Tensor, dropout: RowDropout, relu: bool) -> torch.Tensor:
        return dropped_product(ctx, x, self.lin1.weight, dropout, relu)

    def after(
        self, ctx: GraphContext, p: torch.Tensor, x: torch.Tensor | None, dropout: RowDropout, relu: bool
    ) -> torch.Tensor:
        return self.lin2(packed.relu(product_after(p, self.lin1.weight) + self.lin1.bias, inplace=True))


class GATLayer(nn.Module):
    """PyG GATConv (self-loops added, LeakyReLU 0.2, no attention dropout); heads concatenated or averaged."""

    def __init__(self, in_dim: int, head_dim: int, heads: int, concat: bool, bias: bool = True) -> None:
        super().__init__()
        self.heads, self.head_dim, self.concat = heads, head_dim, concat
        self.lin = Linear(in_dim, heads * head_dim, bias=False)
        self.attention = EdgeAttention(heads, head_dim)
        self.bias = nn.Parameter(torch.zeros(heads * head_dim if concat else head_dim)) if bias else None

    def forward(self, x: torch.Tensor, ctx: GraphContext, dropout: RowDropout, relu: bool = False) -> torch.Tensor:
        z = dropout.linear(x, ctx, self.lin.weight, module=self.lin, relu=relu)
        alpha = self.attention(z, ctx)
        width = self.heads * self.head_dim
        h = propagate_heads(ctx, alpha, ctx.to_graph(z), width, self.head_dim)
        out = ctx.from_graph(h, width)
        if not self.concat:
            out = out.view(-1, self.heads, self.head_dim).mean(dim=1)
        return biased(out, self.bias)


class CoupledGNN(GraphModel):
    """``nn_layers`` GNN layers: dropout -> layer -> activation (none after the last); the first layer's input
    dropout is ``cfg.first_dropout``. Each layer applies its input's dropout, with the ReLU before it in the same
    mask, inside its product where that comes first (:func:`propagated_linear`).

    The classic options (tunedGNN's recipe, PyG's BasicGNN): ``--input-proj`` a Linear from the features to
    ``hidden`` first (its input dropped at ``first_dropout``, its output at ``dropout``); ``--residual`` adds each
    layer's dropped input to its output (:func:`skip_connection`); ``--norm`` after each layer an activation follows;
    ``--jk`` makes every layer hidden-wide with norm, activation and dropout, combines their outputs
    (:func:`jumping_knowledge`) and predicts with a Linear head. All of them are row-wise: they run in the row layout
    on every rank's own rows (batch norm's statistics all-reduced), so tensor parallelism needs no other exchange."""

    def __init__(self, cfg: TrainConfig, in_dim: int, out_dim: int) -> None:
        super().__init__()
        self.attention = cfg.model_spec.attention
        hidden = max(1, cfg.hidden // cfg.heads) * cfg.heads if self.attention else cfg.hidden
        n, self.jk = cfg.nn_layers, cfg.jk
        head = cfg.jk != "none"
        self.project = Linear(in_dim, hidden) if cfg.input_proj else None
        first = hidden if cfg.input_proj else in_dim
        dims = [first] + [hidden] * (n - 1) + [hidden if head else out_dim]
        activated = n if head else n - 1  # the layers an activation follows
        self.layers = nn.ModuleList(
            self._layer(cfg, a, b, last=i == n - 1 and not head, bias=not (cfg.norm == "batch" and i < activated))
            for i, (a, b) in enumerate(zip(dims[:-1], dims[1:]))
        )
        self.skips = nn.ModuleList(skip_connection(a, b) for a, b in zip(dims[:-1], dims[1:])) if cfg.residual else None
        self.norms = nn.ModuleList(make_norm(cfg.norm, hidden) or nn.Identity() for _ in range(activated))
        self.head = Linear(jk_width(cfg.jk, hidden, n), out_dim) if head else None
        sites = n + bool(self.project) + bool(self.head)  # the dropouts: projection's input, layers' inputs, head's
        self.dropouts = layer_dropouts(cfg.first_dropout, cfg.dropout, sites)
        self.materialized = cfg.residual or head  # each layer's dropped input is a tensor of its own
        #: each layer's output after its residual and norm, before the activation: what embedding exports hook
        self.taps = nn.ModuleList(nn.Identity() for _ in range(n))
        self.classic = bool(cfg.classic_options)

    @staticmethod
    def _layer(cfg: TrainConfig, in_dim: int, out_dim: int, last: bool, bias: bool) -> nn.Module:
        if cfg.model not in COUPLED_LAYERS:
            raise ValueError(f"model {cfg.model} has no coupled form")
        return COUPLED_LAYERS[cfg.model](cfg, in_dim, out_dim, last, bias)

    def first_layer(self) -> nn.Module:
        return self.project if self.project is not None else self.layers[0]

    def compute_tail(self, x: torch.Tensor, ctx: GraphContext, tail: Tail) -> torch.Tensor:
        """Streamed, the tail runs in the last segment, on each block of output rows on the device."""
        if not ctx.streams_rows:
            return super().compute_tail(x, ctx, tail)
        return self._streamed_classic(x, ctx, tail) if self.classic else self._streamed(x, ctx, tail)

    def compute(self, x: torch.Tensor, ctx: GraphContext) -> torch.Tensor:
        if ctx.streams_rows:
            return self._streamed_classic(x, ctx) if self.classic else self._streamed(x, ctx)
        drops = list(self.dropouts)
        if self.project is not None:
            p = self.project
            x = drops.pop(0).linear(x, ctx, p.weight, p.bias, p)
        outputs, activate = [], False  # whether x awaits its activation (folded into the next dropout)
        for i, (layer, dropout) in enumerate(zip(self.layers, drops)):
            if self.materialized:
                x = self._dropped(dropout, x, ctx, activate)
                if i > 0:
                    outputs.append(x)
                h = layer(x, ctx, NO_DROPOUT)
                h = h + self.skips[i](x) if self.skips is not None else h
            else:
                x = F.elu(x) if self.attention and activate else x
                h = layer(x, ctx, dropout, relu=activate and not self.attention)
            x = self._normed(i, h, ctx)
            activate = i < len(self.norms)
        if self.head is None:
            return x
        outputs.append(self._dropped(drops[-1], x, ctx, True))
        return self.head(jumping_knowledge(self.jk, outputs))

    def _normed(self, i: int, h: torch.Tensor, ctx: GraphContext) -> torch.Tensor:
        """Layer ``i``'s output ``h`` normalised where a norm follows it (through its tap)."""
        return self.taps[i](self.norms[i](h, ctx) if i < len(self.norms) and not _identity(self.norms[i]) else h)

    def _streamed_classic(self, x: torch.Tensor, ctx: GraphContext, tail: Tail | None = None) -> torch.Tensor:
        """The classic options' layers as row-wise segments between propagations, as :meth:`_streamed` (not batch
        norm: the config refuses it): each layer's dropped input is an output of the segment before it, kept with the
        rows for its layer's part after propagation (the residual, GraphSAGE's root term) and for jumping knowledge;
        the head is a segment of its own. The same values as :meth:`compute`'s."""
        n = len(self.layers)
        params = lambda *modules: [p for m in modules if m is not None for p in m.parameters()]  # noqa: E731
        a, z = ctx.rows(partial(classic_first, self), x, params=params(self.project, self.layers[0]), to_graph=True)
        outputs = []
        for i, layer in enumerate(self.layers):
            p = ctx.propagated(layer.operator, z)
            z = None  # the product's input: free before the segment, which holds only its own input and output
            following = self.layers[i + 1] if i + 1 < n else None
            skip = self.skips[i] if self.skips is not None else None
            norm = self.norms[i] if i < len(self.norms) else None
            segment = partial(classic_segment, self, i)
            if following is None and self.head is None:
                return ctx.rows(segment, p, a, params=params(layer, skip, norm), tail=tail)
            out = ctx.rows(segment, p, a, params=params(layer, skip, norm, following), to_graph=following is not None)
            del p  # free before the next product: beside it only its input and output are planned
            if following is None:
                break
            a, z = out
            out = None  # else it keeps z alive past its product
            outputs.append(a)
        return ctx.rows(partial(jk_head, self), *outputs, out, params=params(self.head), tail=tail)

    def _dropped(self, dropout: RowDropout, x: torch.Tensor, ctx: GraphContext, activate: bool) -> torch.Tensor:
        """``dropout(activation(x))`` (``activate``), as a tensor: GAT's ELU, the others' ReLU (in the mask)."""
        if self.attention:
            return dropout(F.elu(x) if activate else x, ctx)
        return dropout(x, ctx, relu=activate)

    def _streamed(self, x: torch.Tensor, ctx: GraphContext, tail: Tail | None = None) -> torch.Tensor:
        """The layers regrouped into row-wise segments between propagations, each streamed through the device
        (ntp.engine.parallel.row_stream): the first layer's part before its propagation; then each layer's part after it
        with the next layer's part before its own (one trip of the rows, not two); the last layer's part after.
        The same values as :meth:`compute`'s in-memory form. A layer whose part after reads its input (GraphSAGE's
        root term) gets it from the segment that made it."""
        layers, drops = self.layers, self.dropouts
        z = ctx.rows(partial(first_before, layers[0], drops[0]), x, params=layers[0].parameters(), to_graph=True)
        for i, layer in enumerate(layers):
            p = ctx.propagated(layer.operator, z)
            z = None  # the product's input: free before the segment, which holds only its own input and output
            inputs = (p, x) if layer.reads_input_after else (p,)
            following = layers[i + 1] if i + 1 < len(layers) else None
            params = [*layer.parameters(), *(following.parameters() if following is not None else ())]
            segment = partial(after_then_before, layer, drops[i], i > 0, following, drops[i + 1] if following else None)
            if following is None:
                return ctx.rows(segment, *inputs, params=params, tail=tail)
            out = ctx.rows(segment, *inputs, params=params, to_graph=True)
            del p, inputs  # free before the next product: beside it only its input and output are planned
            x, z = out if following.reads_input_after else (None, out)
            del out  # else it keeps z alive past its product
        return x


def _identity(module: nn.Module) -> bool:
    return isinstance(module, nn.Identity)


#: A coupled layer of each homogeneous model: (config, in width, out width, last layer, with a bias) -> layer.
COUPLED_LAYERS = {
    "gcn": lambda cfg, a, b, last, bias: GCNLayer(a, b, bias),
    "sage": lambda cfg, a, b, last, bias: SAGELayer(a, b, bias),
    "gin": lambda cfg, a, b, last, bias: GINLayer(a, b, cfg.hidden, bias),
    "gat": lambda cfg, a, b, last, bias: (
        GATLayer(a, b, heads=1, concat=False, bias=bias)
        if last
        else GATLayer(a, b // cfg.heads, cfg.heads, concat=True, bias=bias)
    ),
}


def build_model(cfg: TrainConfig, in_dim: int, out_dim: int) -> nn.Module:
    """The model of ``cfg``, initialised from ``cfg.seed`` (identical on every rank)."""
    torch.manual_seed(cfg.seed)
    if cfg.arch == "decoupled":
        return DecoupledGNN(cfg, in_dim, out_dim)
    return CoupledGNN(cfg, in_dim, out_dim)
