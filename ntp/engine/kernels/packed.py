"""Boolean tensors kept packed, a bit an element, for a backward: what a ReLU keeps of its input (its sign), and what
a dropout after a ReLU keeps of its result (ntp.engine.kernels.dropout). A float32 output kept instead holds 32x
the bytes, a bool mask 8x. Bit ``e % 8`` of byte ``e // 8`` is element ``e`` in row order, as ``csrc/dropout.c``
packs its keep flags, so the C kernel reads these bits as it reads its own."""

from __future__ import annotations

from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F


def packed_bytes(elements: int) -> int:
    """Bytes of ``elements`` flags packed (what the memory plan counts)."""
    return (elements + 7) // 8


def pack_bits(mask: torch.Tensor) -> torch.Tensor:
    """The flags of the bool tensor ``mask`` packed into ``packed_bytes(mask.numel())`` uint8 bytes, on its device."""
    flat = mask.reshape(-1)
    if flat.device.type == "cpu":  # numpy packs without the GIL and without a temporary
        return torch.from_numpy(np.packbits(flat.numpy(), bitorder="little"))
    return _pack_ops(flat)


def _pack_ops(flat: torch.Tensor) -> torch.Tensor:
    """:func:`pack_bits` of a flat bool tensor by torch's ops, on any device (a GPU's path)."""
    pad = -flat.numel() % 8
    if pad:
        flat = torch.cat([flat, flat.new_zeros(pad)])
    return (flat.view(-1, 8).to(torch.uint8) << _shifts(flat.device)).sum(1, dtype=torch.uint8)


#: elements a block of :func:`pack_where` tests at a time (a multiple of 8): its boolean temporary stays small
_PACK_BLOCK = 1 << 18


def pack_where(x: torch.Tensor, test: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """``pack_bits(test(x))`` for an element-wise ``test``, a block of elements at a time: no boolean tensor as large
    as ``x`` is made (it would be a step's largest temporary where ``x`` is a chunk of a link decoder's pairs)."""
    flat = x.reshape(-1)
    out = torch.empty(packed_bytes(flat.numel()), dtype=torch.uint8, device=x.device)
    for a in range(0, flat.numel(), _PACK_BLOCK):
        out[a // 8 : (a + _PACK_BLOCK) // 8] = pack_bits(test(flat[a : a + _PACK_BLOCK]))
    return out


def unpack_bits(bits: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """The bool tensor of ``shape`` that :func:`pack_bits` packed into ``bits``."""
    n = shape.numel()
    if bits.device.type == "cpu":
        flags = np.unpackbits(bits.numpy(), count=n, bitorder="little")
        return torch.from_numpy(flags).view(torch.bool).view(shape)
    return _unpack_ops(bits, n).view(shape)


def _unpack_ops(bits: torch.Tensor, n: int) -> torch.Tensor:
    """The ``n`` flags :func:`_pack_ops` packed into ``bits``, flat, by torch's ops (a GPU's path)."""
    flags = (bits[:, None] >> _shifts(bits.device)).bitwise_and_(1).view(torch.bool)
    return flags.reshape(-1)[:n]


def _shifts(device: torch.device) -> torch.Tensor:
    return torch.arange(8, dtype=torch.uint8, device=device)


def relu(x: torch.Tensor, inplace: bool = False) -> torch.Tensor:
    """``F.relu(x)``, whose backward keeps the result's sign packed (:class:`_SignedReLU`) where a gradient is
    wanted: the result itself is then free once its consumer is done with it (a bfloat16 product under autocast keeps
    a cast copy, a sum keeps nothing). ``inplace``: into ``x``, a temporary that nothing else reads (the backward
    needs neither it nor its values)."""
    if not (torch.is_grad_enabled() and x.requires_grad):
        return F.relu(x, inplace=inplace)
    return _SignedReLU.apply(x, inplace)


def _passes(y: torch.Tensor) -> torch.Tensor:
    """Where ReLU's backward passes the gradient: a result not at most 0 (positive, or NaN as in torch)."""
    return y.le(0).logical_not_()


def nonzero(y: torch.Tensor) -> torch.Tensor:
    return y != 0


class _SignedReLU(torch.autograd.Function):
    """ReLU whose backward passes the gradient where the result is not at most 0 (positive or NaN), as torch's
    (``threshold_backward``: the same values), read from its packed sign bits."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, inplace: bool) -> torch.Tensor:  # type: ignore[override]
        y = torch.relu_(x) if inplace else torch.relu(x)
        if inplace:
            ctx.mark_dirty(y)
        ctx.save_for_backward(pack_where(y, _passes))
        ctx.shape = y.shape
        return y

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        (bits,) = ctx.saved_tensors
        zero = torch.zeros((), dtype=grad.dtype, device=grad.device)
        return torch.where(unpack_bits(bits, ctx.shape), grad, zero), None
