"""Transposing copies on CUDA by a tiled Triton kernel: ``--offload all`` keeps the column slice in host memory column
by column and the products work row by row, so every slab that crosses the bus is transposed on the device. torch's
copy between the two layouts reads or writes across rows element by element: on an H100 it moved about 150 GB/s, 70
of a 232 ms epoch (docs/benchmarks.md, section 8). The kernel reads and writes whole rows of a tile each way. Where
Triton cannot run, or its first result differs from torch's copy (checked once per GPU), torch's copy does it."""
from __future__ import annotations

import contextlib
import functools
import logging

import torch

from ntp.engine import native

log = logging.getLogger(__name__)

#: rows and columns of the tile one program copies
_TILE = 64

try:
    import triton
    import triton.language as tl
except Exception:  # no Triton, or one that does not import: torch's copy (cuda_dropout's log says why)
    triton = None


if triton is not None:
    @triton.jit
    def _transpose_kernel(src, dst, rows, cols, src_col_stride, dst_row_stride, TILE: tl.constexpr):
        """``dst[r, c] = src[r, c]`` for a tile, where ``src`` is unit-strided along rows (column-major) and ``dst``
        along columns (row-major): loaded down its columns, stored along its rows."""
        r = tl.program_id(0).to(tl.int64) * TILE + tl.arange(0, TILE)
        c = tl.program_id(1).to(tl.int64) * TILE + tl.arange(0, TILE)
        inside = (r[:, None] < rows) & (c[None, :] < cols)
        tile = tl.load(src + r[:, None] + c[None, :] * src_col_stride, mask=inside)
        tl.store(dst + r[:, None] * dst_row_stride + c[None, :], tile, mask=inside)


def transpose_copy(dst: torch.Tensor, src: torch.Tensor) -> None:
    """``dst.copy_(src)`` for 2-D tensors of one shape and dtype on one GPU, ``src`` column-major and ``dst``
    row-major (views of wider tensors allowed), by the kernel where :func:`works`; else, and for any other layout,
    by torch's copy."""
    if not (src.stride(0) == 1 and dst.stride(1) == 1 and src.dtype == dst.dtype and works(dst.device)):
        dst.copy_(src)
        return
    _launch(dst, src)


def _launch(dst: torch.Tensor, src: torch.Tensor) -> None:
    rows, cols = src.shape
    if rows == 0 or cols == 0:
        return
    grid = (triton.cdiv(rows, _TILE), triton.cdiv(cols, _TILE))
    with torch.cuda.device(dst.device) if dst.is_cuda else contextlib.nullcontext():  # the interpreter's CPU
        _transpose_kernel[grid](src, dst, rows, cols, src.stride(1), dst.stride(0), TILE=_TILE,
                                enable_fp_fusion=False)  # no arithmetic: nothing to fuse, and no warning


def works(device: torch.device) -> bool:
    """Whether the kernel copies on ``device``: a GPU, Triton there, the project's kernels not switched off
    (``NTP_NATIVE=0``), and its first result, checked once, torch's copy."""
    if device.type != "cuda" or triton is None or not native.enabled():
        return False
    return _checked(torch.device("cuda", torch.cuda.current_device() if device.index is None else device.index))


@functools.cache
def _checked(device: torch.device) -> bool:
    """Whether the kernel builds and runs on ``device`` and copies as torch does (the tests run this on the CPU,
    in Triton's interpreter)."""
    try:
        src = torch.arange(150 * 70, dtype=torch.float32, device=device).view(70, 150).t()[3:140]  # column-major
        dst = torch.zeros(137, 90, device=device)[:, 5:75]  # a row-major view of a wider tensor
        _launch(dst, src)
        if not torch.equal(dst, src):
            raise RuntimeError("its copy differs from torch's")
    except Exception as e:  # Triton's build or launch, or a wrong result: torch's copy is still right
        log.warning("CUDA transposes take torch's copy: its Triton kernel failed: %s: %s", type(e).__name__, e)
        return False
    return True

