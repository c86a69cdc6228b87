"""Building blocks that run in the row layout: dropout with world-size-independent masks, normalisation, MLPs."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ntp.engine.collectives import all_reduce_sum
from ntp.engine.context import GraphContext
from ntp.engine.metrics import ALLREDUCE

#: Dropout masks are drawn per tile of this many global rows, each tile from its own seed: a row's mask depends on
#: (stream, row, column) only, never on which rank owns the row.
MASK_TILE_ROWS = 2048
_MASK64 = (1 << 64) - 1


def _splitmix64(x: int) -> int:
    z = (x + 0x9E3779B97F4A7C15) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return (z ^ (z >> 31)) & ((1 << 63) - 1)


def keep_mask(rows: tuple[int, int], width: int, p: float, stream: int, device: torch.device) -> torch.Tensor:
    """Bernoulli(1-p) keep-mask for the global rows ``rows`` of a ``width``-wide matrix: every world size draws
    the same mask for the same element."""
    start, stop = rows
    mask = torch.empty(stop - start, width, dtype=torch.bool, device=device)
    gen = torch.Generator(device=device)
    for tile in range(start // MASK_TILE_ROWS, (stop - 1) // MASK_TILE_ROWS + 1 if stop > start else 0):
        t0 = tile * MASK_TILE_ROWS
        gen.manual_seed(_splitmix64(_splitmix64(stream) ^ tile))
        draw = torch.rand(MASK_TILE_ROWS, width, generator=gen, device=device) >= p
        a, b = max(start, t0), min(stop, t0 + MASK_TILE_ROWS)
        mask[a - start : b - start] = draw[a - t0 : b - t0]
    return mask


class RowDropout(nn.Module):
    """Dropout on row-layout activations whose mask depends on (seed, step, layer, global row, column) only."""

    def __init__(self, p: float, layer_id: int) -> None:
        super().__init__()
        self.p = p
        self.layer_id = layer_id

    def forward(self, x: torch.Tensor, ctx: GraphContext) -> torch.Tensor:
        if not self.training or self.p == 0.0:
            return x
        stream = (ctx.seed * 1_000_003 + ctx.step) * 1_009 + self.layer_id
        rows = (ctx.row_offset, ctx.row_offset + x.shape[0])
        mask = keep_mask(rows, x.shape[1], self.p, stream, x.device)
        return x * mask.to(x.dtype) / (1.0 - self.p)


class DistBatchNorm(nn.Module):
    """BatchNorm over all vertex rows of all ranks (statistics summed across ranks)."""

    def __init__(self, width: int, eps: float = 1e-5, momentum: float = 0.1) -> None:
        super().__init__()
        self.eps, self.momentum = eps, momentum
        self.weight = nn.Parameter(torch.ones(width))
        self.bias = nn.Parameter(torch.zeros(width))
        self.register_buffer("running_mean", torch.zeros(width))
        self.register_buffer("running_var", torch.ones(width))

    def forward(self, x: torch.Tensor, ctx: GraphContext) -> torch.Tensor:
        if self.training:
            count = torch.tensor([float(x.shape[0])], device=x.device, dtype=x.dtype)
            sums = all_reduce_sum(torch.cat([x.sum(0), (x * x).sum(0), count]), ctx.comm, ALLREDUCE)
            width = x.shape[1]
            n = sums[-1]
            mean = sums[:width] / n
            var = sums[width : 2 * width] / n - mean * mean
            with torch.no_grad():
                self.running_mean.lerp_(mean.detach(), self.momentum)
                self.running_var.lerp_(var.detach() * n / (n - 1).clamp(min=1), self.momentum)
        else:
            mean, var = self.running_mean, self.running_var
        return (x - mean) * torch.rsqrt(var + self.eps) * self.weight + self.bias


class RowLayerNorm(nn.LayerNorm):
    def forward(self, x: torch.Tensor, ctx: GraphContext) -> torch.Tensor:  # type: ignore[override]
        return super().forward(x)


def make_norm(kind: str, width: int) -> nn.Module | None:
    return {"batch": DistBatchNorm, "layer": RowLayerNorm}.get(kind, lambda w: None)(width)


class MLP(nn.Module):
    """dropout -> Linear -> [norm] -> act, repeated; the last Linear has no norm or activation."""

    def __init__(self, in_dim: int, hidden: int, out_dim: int, layers: int, *, dropout: float, norm: str = "none",
                 activation: bool = True, first_layer_id: int = 0) -> None:
        super().__init__()
        dims = [in_dim] + [hidden] * (layers - 1) + [out_dim]
        self.linears = nn.ModuleList(nn.Linear(a, b) for a, b in zip(dims[:-1], dims[1:]))
        self.dropouts = nn.ModuleList(RowDropout(dropout, first_layer_id + i) for i in range(layers))
        self.norms = nn.ModuleList(make_norm(norm, hidden) or nn.Identity() for _ in range(layers - 1))
        self.activation = activation

    def forward(self, x: torch.Tensor, ctx: GraphContext) -> torch.Tensor:
        last = len(self.linears) - 1
        for i, linear in enumerate(self.linears):
            x = linear(self.dropouts[i](x, ctx))
            if i < last:
                norm = self.norms[i]
                x = x if isinstance(norm, nn.Identity) else norm(x, ctx)
                x = F.relu(x) if self.activation else x
        return x
