"""Dense products of the models (Linear layers, typed weight products): oneDNN's kernels on a CPU.

torch's CPU ``linear`` and ``mm`` call MKL's sgemm, which on this project's AMD EPYC ran the products of a GCN
epoch in up to 2.8x the time of oneDNN's (also in torch, and what torch's compiler emits for CPU linears): a
100k x 128 input times a 128 x 64 weight took 20 ms against 7.7 ms at one thread (docs/benchmarks.md, section 2).
Every model's dense product goes through :func:`linear`, which picks oneDNN for float32 CPU products large enough
to repay its set-up (about 10 us) and torch's own product everywhere else: CUDA, bfloat16 under autocast, float64.
The gradients are the same products, so they take the same path.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

#: multiply-adds below which a product stays on torch's kernel (oneDNN's set-up costs more than it saves)
MIN_ONEDNN_WORK = 1 << 20

_ONEDNN = getattr(torch.ops.mkldnn, "_linear_pointwise", None) if torch.backends.mkldnn.is_available() else None


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ weight^T + bias``, what ``F.linear`` computes, through oneDNN where :func:`uses_onednn` says so."""
    if (
        x.dim() == 2
        and uses_onednn(x, weight.shape[0])
        and weight.dtype == x.dtype
        and not torch.is_autocast_enabled("cpu")
    ):
        return _OneDNNLinear.apply(x, weight, bias)
    return F.linear(x, weight, bias)


def matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a @ b`` for 2-D ``a`` and ``b``: :func:`linear` with ``b^T`` as the weight."""
    return linear(a, b.t())


def uses_onednn(x: torch.Tensor, out_width: int) -> bool:
    """Whether ``x @ W^T`` with ``out_width`` columns runs on oneDNN: a float32 CPU product of enough work, with
    oneDNN in this torch and not switched off (``torch.backends.mkldnn.enabled = False``)."""
    return (
        _ONEDNN is not None
        and x.device.type == "cpu"
        and x.dtype == torch.float32
        and x.numel() * out_width >= MIN_ONEDNN_WORK
        and torch.backends.mkldnn.enabled
    )


def _product(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a @ b`` (2-D, float32, CPU), on oneDNN when it pays."""
    if uses_onednn(a, b.shape[1]):
        return _ONEDNN(a, b.t(), None, "none", [], "")
    return a @ b


class _OneDNNLinear(torch.autograd.Function):
    """``x @ W^T + b`` forward, and its three gradients, each a product of its own size."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:  # type: ignore[override]
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        return _ONEDNN(x, weight, bias, "none", [], "")

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        x, weight = ctx.saved_tensors
        grad_x = _product(grad, weight) if ctx.needs_input_grad[0] else None
        grad_w = _product(grad.t(), x) if ctx.needs_input_grad[1] else None
        grad_b = grad.sum(0) if ctx.has_bias and ctx.needs_input_grad[2] else None
        return grad_x, grad_w, grad_b


class Linear(nn.Linear):
    """``nn.Linear`` (same parameters and state dict) whose product is :func:`linear`."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias)
