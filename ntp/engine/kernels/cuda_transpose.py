"""Transposing copies on CUDA by a tiled Triton kernel: ``--offload all`` keeps the column slice in host memory column
by column and the products work row by row, so every slab that crosses the bus is transposed on the device. torch's
copy between the two layouts reads or writes across rows element by element: on an H100 it moved about 150 GB/s, 70
of a 232 ms epoch (docs/benchmarks.md, section 8). The kernel reads and writes whole rows of a tile each way. Where
Triton cannot run, or its first result differs from torch's copy (checked once per GPU), torch's copy does it."""

from __future__ import annotations

import torch

from ntp.engine.kernels import gpu_kernels
from ntp.engine.kernels.gpu_kernels import tl, triton

#: rows and columns of the tile one program copies
_TILE = 64

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
    with gpu_kernels.on_gpu_of(dst):
        _transpose_kernel[grid](
            src, dst, rows, cols, src.stride(1), dst.stride(0), TILE=_TILE, enable_fp_fusion=False
        )  # no arithmetic: nothing to fuse, and no warning


def works(device: torch.device) -> bool:
    """Whether the kernel copies on ``device`` (:func:`gpu_kernels.works`: its first result there, checked once,
    torch's copy)."""
    return gpu_kernels.works(device, _check, "CUDA transposes take torch's copy")


def _check(device: torch.device) -> None:
    """Raises unless the kernel copies on ``device`` as torch does (the tests run this on the CPU, in Triton's
    interpreter)."""
    src = torch.arange(150 * 70, dtype=torch.float32, device=device).view(70, 150).t()[3:140]  # column-major
    dst = torch.zeros(137, 90, device=device)[:, 5:75]  # a row-major view of a wider tensor
    _launch(dst, src)
    if not torch.equal(dst, src):
        raise RuntimeError("its copy differs from torch's")
