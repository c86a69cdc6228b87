"""GAT's edge weights over a CSR: ``softmax_row(LeakyReLU(s_src[u] + s_row[v]))`` for each edge ``u -> v`` of row
``v``, per head, in one autograd function.

The edges of a CSR are grouped by row, so the row's score is repeated along its segment and the softmax's maximum
and sums are segment reductions over ``indptr``. The backward is written out (softmax: ``alpha * (g - sum_row(g *
alpha))``; LeakyReLU: the kept sign; the row scores: a segment sum; the source scores: one ``index_add``), so it keeps
only the weights and the signs (packed bits), and never runs the indexed accumulates that autograd makes of per-edge gathers (those
were most of a GAT epoch on a CPU)."""

from __future__ import annotations

import torch

from ntp.engine.device.precision import accumulation_dtype
from ntp.engine.kernels.packed import pack_bits, unpack_bits


def edge_attention(
    src_scores: torch.Tensor, row_scores: torch.Tensor, src: torch.Tensor, indptr: torch.Tensor, slope: float
) -> torch.Tensor:
    """Edge weights [E, heads] (float32 for bfloat16 scores). ``src_scores`` [N, heads] are indexed by ``src`` [E];
    ``row_scores`` [R, heads] belong to the CSR's R rows, whose edges ``indptr`` [R + 1] (int64) delimits."""
    return _EdgeAttention.apply(src_scores, row_scores, src, indptr, slope)


def _segment_sum(x: torch.Tensor, indptr: torch.Tensor) -> torch.Tensor:
    return torch.segment_reduce(x, "sum", offsets=indptr, axis=0)


def _per_edge(rows: torch.Tensor, degrees: torch.Tensor, edges: int) -> torch.Tensor:
    return rows.repeat_interleave(degrees, dim=0, output_size=edges)


class _EdgeAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, src_scores, row_scores, src, indptr, slope):  # noqa: ANN001, ANN205 (torch's signature)
        acc = accumulation_dtype(src_scores.dtype)
        edges, degrees = src.shape[0], indptr.diff()
        logits = src_scores.to(acc).index_select(0, src)
        logits += _per_edge(row_scores.to(acc), degrees, edges)
        positive = logits > 0
        logits = torch.where(positive, logits, logits * slope)
        peak = torch.segment_reduce(logits, "max", offsets=indptr, axis=0)  # shifting rows leaves softmax unchanged
        alpha = logits.sub_(_per_edge(peak, degrees, edges)).exp_()
        alpha /= _per_edge(_segment_sum(alpha, indptr), degrees, edges)
        ctx.save_for_backward(alpha, pack_bits(positive), src, indptr)
        ctx.slope, ctx.dtypes, ctx.sources = slope, (src_scores.dtype, row_scores.dtype), src_scores.shape[0]
        return alpha

    @staticmethod
    def backward(ctx, grad):  # noqa: ANN001, ANN205
        alpha, signs, src, indptr = ctx.saved_tensors
        positive = unpack_bits(signs, alpha.shape)
        degrees = indptr.diff()
        g = grad.to(alpha.dtype) * alpha
        g -= alpha * _per_edge(_segment_sum(g, indptr), degrees, alpha.shape[0])  # the softmax's Jacobian
        g = torch.where(positive, g, g * ctx.slope)
        grad_src = g.new_zeros(ctx.sources, g.shape[1]).index_add_(0, src, g)
        grad_row = _segment_sum(g, indptr)
        return grad_src.to(ctx.dtypes[0]), grad_row.to(ctx.dtypes[1]), None, None, None
