"""CUDA's transposing copy (a Triton kernel, for ``--offload all``'s slabs) without a GPU: run by Triton's interpreter
on CPU tensors, and built for sm_90 by Triton's compiler. On a GPU, tests/ntp/test_cuda.py's offload cases run it."""

from __future__ import annotations

import pytest
import torch

from ntp.engine.kernels import cuda_transpose, gpu_kernels
from tests.ntp import interpreter

triton = pytest.importorskip("triton", reason="Triton (pip install -e '.[test]' installs it) runs the kernel here")

CPU = torch.device("cpu")


@pytest.fixture
def interpreted(monkeypatch):
    """ntp.engine.kernels.cuda_transpose with its kernels built for Triton's interpreter."""
    with interpreter.interpreted(cuda_transpose, monkeypatch) as module:
        yield module


@pytest.mark.parametrize("rows, cols", [(1, 1), (64, 64), (1000, 37), (70, 200), (0, 5)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_column_major_block_is_copied_into_rows(interpreted, rows: int, cols: int, dtype: torch.dtype) -> None:
    """A column-major view (a block of a wider column-major tensor) into a row-major view of a wider tensor, tiles
    cut anywhere: the same values, nothing written beside the view."""
    whole = torch.randn(cols + 3, rows + 5).to(dtype)
    src = whole[2 : cols + 2, 1 : rows + 1].t()  # unit stride along its rows
    out = torch.zeros(rows, cols + 9, dtype=dtype)
    dst = out[:, 4 : cols + 4]
    interpreted._launch(dst, src)
    assert torch.equal(dst, src)
    assert not out[:, :4].any() and not out[:, cols + 4 :].any()


def test_the_first_result_is_checked_against_torchs_copy(interpreted) -> None:
    assert gpu_kernels.checked.__wrapped__(CPU, interpreted._check, "CUDA transposes take torch's copy")


def test_the_kernel_builds_for_hopper_gpus() -> None:
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    for dtype in ("fp32", "bf16"):
        signature = {
            "src": f"*{dtype}",
            "dst": f"*{dtype}",
            "rows": "i64",
            "cols": "i64",
            "src_col_stride": "i64",
            "dst_row_stride": "i64",
            "TILE": "constexpr",
        }
        kernel = triton.compile(
            ASTSource(cuda_transpose._transpose_kernel, signature, {"TILE": cuda_transpose._TILE}),
            target=GPUTarget("cuda", 90, 32),
            options={"enable_fp_fusion": False},
        )
        assert kernel.asm["cubin"]


def test_torchs_copy_takes_other_layouts_and_devices() -> None:
    """On a CPU, and for layouts the kernel does not take, :func:`transpose_copy` is torch's copy."""
    assert not cuda_transpose.works(CPU)
    src, dst = torch.randn(30, 20), torch.empty(30, 20)
    cuda_transpose.transpose_copy(dst, src)
    assert torch.equal(dst, src)
    column_major = torch.randn(20, 30).t()
    cuda_transpose.transpose_copy(dst, column_major)
    assert torch.equal(dst, column_major)
