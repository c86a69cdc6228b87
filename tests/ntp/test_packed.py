"""What a backward keeps packed, a bit an element (ntp.engine.kernels.packed): flags packed as the C kernel packs its
keep flags (numpy on a CPU, torch's ops elsewhere, checked here on a CPU), unpacked unchanged, and a ReLU whose
backward reads its sign bits: torch's values, forward and backward."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from ntp.engine.kernels import native, packed
from ntp.engine.kernels.dropout import _drop_rows
from ntp.engine.kernels.packed import pack_bits, packed_bytes, relu, unpack_bits


@pytest.mark.parametrize("shape", [(0, 3), (1, 1), (7, 3), (64, 9), (33, 17)])
def test_flags_come_back_unchanged_and_in_the_kernels_bit_order(shape: tuple[int, int]) -> None:
    mask = torch.rand(shape, generator=torch.Generator().manual_seed(shape[0])) < 0.4
    bits = pack_bits(mask)
    assert bits.dtype == torch.uint8 and bits.numel() == packed_bytes(mask.numel())
    assert torch.equal(unpack_bits(bits, mask.shape), mask)
    flat = mask.flatten().numpy()
    for e in range(flat.size):  # bit e % 8 of byte e // 8 is element e (csrc/dropout.c's order)
        assert bool(bits[e // 8] >> (e % 8) & 1) == flat[e]
    assert torch.equal(packed._pack_ops(mask.flatten()), bits), "a GPU's path packs as numpy does"
    assert torch.equal(packed._unpack_ops(bits, mask.numel()), mask.flatten())


@pytest.mark.skipif(native.library() is None, reason="the C kernel is not built")
def test_the_kernel_reads_packed_flags_as_its_own() -> None:
    """The C kernel scales a gradient by flags :func:`pack_bits` packed (the backward of a dropout after a ReLU)."""
    grad, mask = torch.randn(37, 21), torch.rand(37, 21) < 0.5
    out = torch.empty_like(grad)
    _drop_rows(grad, out, None, 0.5, 1, 0, 21, False, flags_in=pack_bits(mask))
    assert torch.equal(out, torch.where(mask, grad * 2.0, torch.zeros(())))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_relu_is_torchs_and_keeps_its_sign_as_bits(dtype: torch.dtype) -> None:
    x = torch.randn(45, 13).to(dtype)
    x[::5, ::2] = 0.0
    x[1, 1], x[2, 2], x[3, 3] = float("nan"), float("inf"), -float("inf")
    grad = torch.randn(45, 13).to(dtype)
    results = []
    for fn in (F.relu, relu):
        leaf = x.clone().requires_grad_()
        saved = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append((t.dtype, t.nbytes)) or t, lambda t: t):
            y = fn(leaf)
        y.backward(grad)
        results.append((y.detach(), leaf.grad, saved))
    (y1, g1, _), (y2, g2, saved) = results
    torch.testing.assert_close(y2, y1, rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(g2, g1, rtol=0, atol=0, equal_nan=True)
    assert saved == [(torch.uint8, packed_bytes(45 * 13))]


def test_flags_tested_a_block_at_a_time_are_packed_whole(monkeypatch) -> None:
    monkeypatch.setattr(packed, "_PACK_BLOCK", 16)  # 33 x 17 elements: 36 blocks, the last ragged
    x = torch.randn(33, 17)
    x[::4] = 0.0
    assert torch.equal(packed.pack_where(x, packed.nonzero), pack_bits(x != 0))
