"""Dropout on CUDA in one pass: a Triton kernel draws each keep flag from the stream of words the CPU reads
(ntp.engine.kernels.masks: the same mask on every device and world size), applies it, and writes the backward's mask only
where one is wanted. Each word is hashed once for the 4 to 64 elements whose fields it holds. Where Triton is missing,
its kernel fails to build, or its first result differs from the mask drawn by torch's ops (checked once per GPU),
:func:`works` is False and dropout takes torch's ops: the same values, more passes over memory."""

from __future__ import annotations

import torch

from ntp.engine.kernels import gpu_kernels
from ntp.engine.kernels.gpu_kernels import tl, triton
from ntp.engine.kernels.masks import field, keep_mask, stream_key

#: the element types the kernel drops, those of ``--precision`` (it scales in float32 and rounds once, like torch)
DTYPES = (torch.float32, torch.bfloat16)

#: elements one program drops: the fields of its ``_ELEMENTS * bits / 64`` words
_ELEMENTS = 2048

if triton is not None:

    @triton.jit(do_not_specialize=["first", "word0", "key", "threshold"])
    def _drop_kernel(
        x,
        y,
        keep,
        first,
        word0,
        count,
        rows,
        cols,
        width,
        ldx,
        key,
        threshold,
        scale,
        BITS: tl.constexpr,
        RELU: tl.constexpr,
        WHOLE_ROWS: tl.constexpr,
        MASK: tl.constexpr,
        ELEMENTS: tl.constexpr,
    ):
        """Words ``word0 + [pid * WORDS, (pid + 1) * WORDS)`` of the stream keyed ``key`` and the elements whose
        fields they hold: global element ``e`` is local element ``(i, j)`` of ``x`` where ``e = first + i * width +
        j``; with ``WHOLE_ROWS`` (``cols == width == ldx``) the local element is ``e - first`` without a division."""
        PER: tl.constexpr = 64 // BITS
        WORDS: tl.constexpr = ELEMENTS // PER
        w = word0 + tl.program_id(0).to(tl.int64) * WORDS + tl.arange(0, WORDS)
        z = (w + 1).to(tl.uint64) * 0x9E3779B97F4A7C15 + key.to(tl.uint64, bitcast=True)  # SplitMix64 at w + 1
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
        z = (z ^ (z >> 27)) * 0x94D049BB133111EB
        z = z ^ (z >> 31)
        local = tl.arange(0, ELEMENTS)  # each word hashed once, then handed to the elements whose fields it holds
        words = tl.gather(z, local // PER, 0)
        fields = ((words >> ((local % PER) * BITS).to(tl.uint64)) & ((1 << BITS) - 1)).to(tl.int32)
        rel = (word0 + tl.program_id(0).to(tl.int64) * WORDS) * PER + local - first
        if WHOLE_ROWS:
            inside = (rel >= 0) & (rel < count)
            src, dst = rel, rel
        else:
            i = rel // width
            j = rel - i * width
            inside = (rel >= 0) & (i < rows) & (j < cols)
            src, dst = i * ldx + j, i * cols + j
        kept = fields >= threshold
        v = tl.load(x + src, mask=inside, other=0.0).to(tl.float32)
        out = v * tl.where(kept, scale, 0.0)
        if RELU:  # before the rounding, which keeps signs: the same result; NaN stays, as in torch's ReLU
            out = tl.where(out < 0, 0.0, out)
        out = out.to(y.dtype.element_ty)
        tl.store(y + dst, out, mask=inside)
        if MASK:
            tl.store(keep + dst, (out.to(tl.float32) != 0) if RELU else kept, mask=inside)


def drop_into(
    x: torch.Tensor,
    y: torch.Tensor,
    mask: torch.Tensor | None,
    p: float,
    stream: int,
    first: int,
    width: int,
    relu: bool,
) -> None:
    """Dropout of ``x`` (rows with unit column stride; with ``relu``, of ``relu(x)``) into the contiguous ``y``, and
    the backward's mask (``keep``, or with ``relu`` the nonzero results) into ``mask`` if given. Element ``(i, j)``
    is element ``first + i * width + j`` of the ``stream``'s mask, as in ``csrc/dropout.c``."""
    rows, cols = x.shape
    if rows == 0 or cols == 0:
        return
    bits, threshold = field(p)
    word0 = first * bits // 64
    last = first + (rows - 1) * width + cols
    programs = triton.cdiv(-(-last * bits // 64) - word0, _ELEMENTS * bits // 64)
    ldx = x.stride(0)
    whole = cols == width and ldx == cols
    with gpu_kernels.on_gpu_of(x):
        _drop_kernel[(programs,)](
            x,
            y,
            y if mask is None else mask,
            first,
            word0,
            rows * cols,
            rows,
            cols,
            width,
            ldx,
            stream_key(stream),
            threshold,
            1.0 / (1.0 - p),
            BITS=bits,
            RELU=relu,
            WHOLE_ROWS=whole,
            MASK=mask is not None,
            ELEMENTS=_ELEMENTS,
            enable_fp_fusion=False,
        )  # one product an element: nothing to fuse, and no warning


def works(device: torch.device) -> bool:
    """Whether the kernel drops on ``device`` (:func:`gpu_kernels.works`: its first result there, checked once, the
    mask torch's ops draw)."""
    return gpu_kernels.works(device, _check, "CUDA dropout takes torch's ops")


def _check(device: torch.device) -> None:
    """Raises unless the kernel draws on ``device`` the mask torch's ops draw, and drops by it (the tests run this on
    the CPU, in Triton's interpreter)."""
    x = torch.linspace(-3, 3, 97 * 45, device=device).view(97, 45)[:, 3:40]  # rows with a stride; no RNG used
    for p in (0.5, 0.25, 0.4):  # fields of 1, 8 and 16 bits
        y = torch.empty(x.shape, device=device)
        mask = torch.empty(x.shape, dtype=torch.bool, device=device)
        drop_into(x, y, mask, p, 11, 5 * 61 + 7, 61, relu=False)
        keep = keep_mask((5, 5 + x.shape[0]), 61, p, 11, device)[:, 7:44]
        if not (torch.equal(mask, keep) and torch.equal(y, x * keep * (1.0 / (1.0 - p)))):
            raise RuntimeError(f"its mask at p={p} differs from torch's ops'")
