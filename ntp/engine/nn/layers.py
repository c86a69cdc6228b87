"""Building blocks that run in the row layout: normalisation, MLPs, the summed class loss."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ntp.engine.device.precision import accumulation_dtype
from ntp.engine.distributed.collectives import all_reduce_sum
from ntp.engine.distributed.traffic import ALLREDUCE
from ntp.engine.kernels.dropout import layer_dropouts
from ntp.engine.kernels.linear import Linear
from ntp.engine.parallel.context import GraphContext


def class_loss_sum(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """``cross_entropy(logits, y, reduction="sum")`` in ordinary kernels: torch's own summed NLL is one CUDA thread
    block (2.4 ms an epoch at products scale on an H200)."""
    return class_losses(logits, y).sum()


def class_losses(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Each row's cross-entropy (:func:`class_loss_sum`'s terms)."""
    return -F.log_softmax(logits, dim=1).gather(1, y[:, None]).squeeze(1)


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
        x = x.to(accumulation_dtype(x.dtype))  # statistics of bfloat16 activations are summed in float32
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


def skip_connection(in_dim: int, out_dim: int) -> nn.Module:
    """A residual branch from ``in_dim`` to ``out_dim`` columns: the input itself, or a Linear projection (no bias:
    the layer it skips has one) where the widths differ."""
    return nn.Identity() if in_dim == out_dim else Linear(in_dim, out_dim, bias=False)


def jumping_knowledge(mode: str, outputs: list[torch.Tensor]) -> torch.Tensor:
    """Combine the layers' row-layout outputs (all as wide): the last one, their sum, concatenation or element-wise
    max (PyG's JumpingKnowledge; tunedGNN sums)."""
    if mode == "last":
        return outputs[-1]
    if mode == "sum":
        return torch.stack(outputs).sum(0)
    if mode == "cat":
        return torch.cat(outputs, dim=1)
    if mode == "max":
        return torch.stack(outputs).amax(0)
    raise ValueError(f"unknown jumping knowledge {mode!r}")


def jk_width(mode: str, width: int, layers: int) -> int:
    """Columns of :func:`jumping_knowledge`'s output for ``layers`` outputs of ``width`` columns."""
    return width * layers if mode == "cat" else width


class MLP(nn.Module):
    """dropout -> Linear -> [norm] -> act, repeated; the last Linear has no norm or activation. The input's dropout
    is ``input_dropout``, the others' ``dropout``."""

    def __init__(
        self,
        in_dim: int,
        hidden: int,
        out_dim: int,
        layers: int,
        *,
        dropout: float,
        input_dropout: float,
        norm: str = "none",
        activation: bool = True,
    ) -> None:
        super().__init__()
        dims = [in_dim] + [hidden] * (layers - 1) + [out_dim]
        self.linears = nn.ModuleList(Linear(a, b) for a, b in zip(dims[:-1], dims[1:]))
        self.dropouts = layer_dropouts(input_dropout, dropout, layers)
        self.norms = nn.ModuleList(make_norm(norm, hidden) or nn.Identity() for _ in range(layers - 1))
        self.activation = activation

    def forward(self, x: torch.Tensor, ctx: GraphContext) -> torch.Tensor:
        last = len(self.linears) - 1
        for i, (linear, dropout) in enumerate(zip(self.linears, self.dropouts)):
            # the activation before a dropout is in its mask, and both run inside the product (RowDropout.linear)
            x = dropout.linear(x, ctx, linear.weight, linear.bias, linear, relu=i > 0 and self.activation)
            if i < last and not isinstance(self.norms[i], nn.Identity):
                x = self.norms[i](x, ctx)
        return x
