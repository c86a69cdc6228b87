"""GAT's edge weights (ntp.engine.graph.attention): the written-out backward is autograd's, the weights are a
softmax over each row's edges of LeakyReLU(s_src[u] + s_row[v]), rows without edges included."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ntp.engine.graph.attention import edge_attention


def _graph(rows: int, sources: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    degrees = torch.randint(0, 7, (rows,), generator=g)
    degrees[3] = 0  # a row without edges
    indptr = torch.zeros(rows + 1, dtype=torch.int64)
    indptr[1:] = degrees.cumsum(0)
    src = torch.randint(0, sources, (int(indptr[-1]),), generator=g)
    return src, indptr, torch.repeat_interleave(torch.arange(rows), degrees)


def _reference(src_scores, row_scores, src, indptr, rows, slope):
    logits = F.leaky_relu(src_scores.float()[src] + row_scores.float()[rows], slope)
    return torch.cat([torch.softmax(logits[a:b], 0) for a, b in zip(indptr[:-1].tolist(), indptr[1:].tolist())])


def test_the_backward_is_autograds_and_the_weights_a_softmax_per_row() -> None:
    src, indptr, rows = _graph(rows=25, sources=40)
    a = torch.randn(40, 2, dtype=torch.float64, requires_grad=True)
    b = torch.randn(25, 2, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, y: edge_attention(x, y, src, indptr, 0.2), (a, b))
    weights = edge_attention(a, b, src, indptr, 0.2)
    torch.testing.assert_close(weights, _reference(a, b, src, indptr, rows, 0.2).double(), rtol=1e-6, atol=1e-7)
    sums = torch.segment_reduce(weights, "sum", offsets=indptr, axis=0)
    torch.testing.assert_close(sums[indptr[1:] > indptr[:-1]], torch.ones_like(sums[indptr[1:] > indptr[:-1]]))


def test_bf16_scores_give_float32_weights_and_bf16_gradients() -> None:
    src, indptr, rows = _graph(rows=30, sources=30, seed=1)
    a = torch.randn(30, 3).bfloat16().requires_grad_()
    b = torch.randn(30, 3).bfloat16().requires_grad_()
    g = torch.randn(len(src), 3)
    weights = edge_attention(a, b, src, indptr, 0.2)
    assert weights.dtype == torch.float32
    (weights * g).sum().backward()
    ours = a.grad, b.grad
    a.grad = b.grad = None
    (_reference(a, b, src, indptr, rows, 0.2) * g).sum().backward()
    assert ours[0].dtype == ours[1].dtype == torch.bfloat16
    torch.testing.assert_close(ours[0], a.grad)
    torch.testing.assert_close(ours[1], b.grad)
