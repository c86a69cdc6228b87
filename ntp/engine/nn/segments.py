"""The row-wise segments that a model streamed in row blocks (``--nn-device stream``; ntp.engine.parallel.row_stream)
runs between its propagations: each a function of whole rows, ``fn(position, *rows)``, that computes the same values
as the layers' in-memory forward. ``model``: a CoupledGNN (ntp.engine.nn.models), whose parts they read."""

from __future__ import annotations

import torch
from torch import nn

from ntp.engine.kernels.dropout import RowDropout
from ntp.engine.nn.layers import jumping_knowledge
from ntp.engine.parallel.context import GraphContext


def as_gathered(ctx: GraphContext, rows: torch.Tensor) -> torch.Tensor:
    """The rows of a segment's gathered input, as they are (a segment that only feeds its tail)."""
    return rows


#: a layer's dropout where its input was dropped already (CoupledGNN's materialised inputs)
NO_DROPOUT = RowDropout(0.0, -1)


def classic_first(model: nn.Module, ctx: GraphContext, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The input projection, the first layer's dropped input and its part before propagation."""
    drops = model.dropouts
    if model.project is not None:
        x = drops[0].linear(x, ctx, model.project.weight, model.project.bias)
    a = model._dropped(drops[model.project is not None], x, ctx, False)
    return a, model.layers[0].before(ctx, a, NO_DROPOUT, False)


def classic_segment(model: nn.Module, i: int, ctx: GraphContext, p: torch.Tensor, a: torch.Tensor):
    """Layer ``i``'s part after its propagation ``p`` (``a``: its dropped input) with its residual and norm; then the
    next layer's dropped input and its part before propagation (the output itself after the last layer, dropped
    where a head follows)."""
    layer, last = model.layers[i], i == len(model.layers) - 1
    h = layer.after(ctx, p, a, NO_DROPOUT, False)
    h = model._normed(i, h + model.skips[i](a) if model.skips is not None else h, ctx)
    if last and model.head is None:
        return h
    a = model._dropped(model.dropouts[i + 1 + (model.project is not None)], h, ctx, True)
    return a if last else (a, model.layers[i + 1].before(ctx, a, NO_DROPOUT, False))


def jk_head(model: nn.Module, ctx: GraphContext, *outputs: torch.Tensor) -> torch.Tensor:
    return model.head(jumping_knowledge(model.jk, list(outputs)))


def first_before(layer: nn.Module, dropout: RowDropout, ctx: GraphContext, x: torch.Tensor) -> torch.Tensor:
    return layer.before(ctx, x, dropout, False)


def after_then_before(
    layer: nn.Module,
    dropout: RowDropout,
    relu: bool,
    following: nn.Module | None,
    following_dropout: RowDropout | None,
    ctx: GraphContext,
    p: torch.Tensor,
    x: torch.Tensor | None = None,
):
    """``layer``'s part after its propagation ``p`` (its input ``x`` where it reads it), then ``following``'s part
    before its own: its input as well where its part after reads it."""
    h = layer.after(ctx, p, x, dropout, relu)
    if following is None:
        return h
    z = following.before(ctx, h, following_dropout, True)
    return (h, z) if following.reads_input_after else z
