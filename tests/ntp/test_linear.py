"""The models' dense products (ntp.engine.kernels.linear) compute what ``F.linear`` does, value and gradients, on oneDNN where
it pays and on torch's product elsewhere."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from ntp.engine.kernels.linear import MIN_ONEDNN_WORK, Linear, linear, matmul, uses_onednn

ONEDNN = uses_onednn(torch.zeros(MIN_ONEDNN_WORK, 1), 1)
needs_onednn = pytest.mark.skipif(not ONEDNN, reason="this torch has no oneDNN linear")


def _value_and_grads(f, x, w, b, grad):
    leaves = [t for t in (x, w, b) if t is not None and t.requires_grad]
    y = f(x, w, b)
    return [y, *torch.autograd.grad(y, leaves, grad)]


@needs_onednn
@pytest.mark.parametrize(
    "rows, in_dim, out_dim, bias, input_grad, strided",
    [
        (5000, 64, 32, True, True, False),  # a hidden layer
        (4000, 128, 7, False, False, True),  # input features (no gradient), a column slice of a wider block
        (3000, 16, 200, True, True, True),  # widening
    ],
)
def test_onednn_linear_equals_torch_value_and_gradients(rows, in_dim, out_dim, bias, input_grad, strided) -> None:
    g = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, 2 * in_dim, generator=g)[:, ::2] if strided else torch.randn(rows, in_dim, generator=g)
    x.requires_grad_(input_grad)
    w = torch.randn(out_dim, in_dim, generator=g, requires_grad=True)
    b = torch.randn(out_dim, generator=g, requires_grad=True) if bias else None
    grad = torch.randn(2 * rows, out_dim, generator=g)[::2]  # gradients arrive strided too
    assert uses_onednn(x, out_dim)
    ours, theirs = _value_and_grads(linear, x, w, b, grad), _value_and_grads(F.linear, x, w, b, grad)
    assert len(ours) == len(theirs) == 1 + input_grad + 1 + bias
    for a, c in zip(ours, theirs):
        assert torch.allclose(a, c, rtol=1e-5, atol=1e-5 * float(c.detach().abs().max()))


def test_torch_product_where_onednn_does_not_pay() -> None:
    """Small, float64, autocast and switched-off products are torch's own (bit for bit)."""
    x, w = torch.randn(10, 4), torch.randn(3, 4)
    assert not uses_onednn(x, 3)
    assert torch.equal(linear(x, w), F.linear(x, w))
    big = torch.randn(4096, 64, dtype=torch.float64)
    assert not uses_onednn(big, 256)
    assert torch.equal(linear(big, big[:256]), F.linear(big, big[:256]))
    x32 = big.float()
    torch.backends.mkldnn.enabled = False
    try:
        assert not uses_onednn(x32, 256)
    finally:
        torch.backends.mkldnn.enabled = True
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert linear(x32, x32[:256]).dtype == torch.bfloat16


@needs_onednn
def test_matmul_and_the_module() -> None:
    a, b = torch.randn(3000, 48, requires_grad=True), torch.randn(48, 40, requires_grad=True)
    grad = torch.randn(3000, 40)
    ours, theirs = (
        _value_and_grads(lambda a, b, _: matmul(a, b), a, b, None, grad),
        _value_and_grads(lambda a, b, _: a @ b, a, b, None, grad),
    )
    for u, v in zip(ours, theirs):
        assert torch.allclose(u, v, rtol=1e-5, atol=1e-5 * float(v.detach().abs().max()))
    layer = Linear(48, 40)
    assert list(layer.state_dict()) == ["weight", "bias"]  # checkpoints of nn.Linear load unchanged
    assert torch.allclose(layer(a), F.linear(a, layer.weight, layer.bias), atol=1e-5)
