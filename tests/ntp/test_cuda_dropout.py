"""CUDA's one-pass dropout (a Triton kernel) without a GPU: its logic run by Triton's interpreter on CPU tensors,
against the mask drawn then applied; its build for a GPU's architecture by Triton's own compiler. On a GPU,
tests/ntp/test_cuda.py runs it for real."""

from __future__ import annotations

import pytest
import torch

from ntp.engine.distributed.partition import Partition
from ntp.engine.kernels import cuda_dropout, gpu_kernels
from ntp.engine.kernels.dropout import dropped
from ntp.engine.kernels.masks import keep_mask
from tests.ntp import interpreter

triton = pytest.importorskip("triton", reason="Triton (pip install -e '.[test]' installs it) runs the kernel here")

pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # the interpreter's inf * 0
CPU = torch.device("cpu")
#: what the log says takes over where the kernel cannot run
FALLBACK = "CUDA dropout takes torch's ops"
#: drop rates whose masks take 1, 8 and 16 bits per element
RATES = [0.5, 0.25, 0.4]
#: (rows, columns, first row, first column, mask width): whole rows; a column slice of a wider mask (R-GCN's column
#: layout, through the kernel's division); rows that end inside a word; one element; no rows
LAYOUTS = [
    (1013, 37, 17, 0, None),
    (333, 20, 0, 5, 41),
    (64, 64, 3, 0, None),
    (1, 1, 2**33, 0, None),
    (0, 5, 0, 0, None),
]


@pytest.fixture
def interpreted(monkeypatch):
    """ntp.engine.kernels.cuda_dropout with its kernels built for Triton's interpreter."""
    with interpreter.interpreted(cuda_dropout, monkeypatch) as module:
        yield module


def _drop(module, x: torch.Tensor, p: float, stream: int, first: int, width: int, relu: bool, mask: bool = True):
    y = torch.empty(x.shape, dtype=x.dtype)
    keep = torch.empty(x.shape, dtype=torch.bool) if mask else None
    module.drop_into(x, y, keep, p, stream, first, width, relu)
    return y, keep


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda la: "x".join(map(str, la[:2])) + f"@{la[2]},{la[3]}")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("relu", [False, True])
@pytest.mark.parametrize("p", RATES)
@pytest.mark.parametrize("strided", [False, True], ids=["contiguous", "strided"])
def test_the_kernel_drops_what_the_mask_drawn_then_applied_drops(interpreted, layout, dtype, relu, p, strided) -> None:
    """The kernel reads the fields of the stream :func:`keep_mask` reads (every device's mask), from the element
    ``first + i * width + j``: the same mask, and the values of the mask applied by torch's ops (NaN, infinities and
    -0 included), rows read by their stride. The backward's mask is the nonzero results with ReLU. bfloat16 values
    within one step: the interpreter truncates to bfloat16 where a GPU rounds to nearest (test_cuda.py compares
    them exactly there)."""
    n, w, row, col, width = layout
    width = width or w
    generator = torch.Generator().manual_seed(n + w)
    base = torch.randn(n, w + 3, generator=generator)
    for at, value in ((0, float("nan")), (5, float("inf")), (9, -float("inf")), (14, -0.0)):
        if at < base.numel():
            base.view(-1)[at] = value
    x = base.to(dtype)[:, 2 : w + 2]  # a row stride wider than the rows: the kernel's general path
    x = x if strided else x.contiguous()  # whole rows where the mask is as wide: the path without a division
    stream = 2**70 + 5
    keep = keep_mask((row, row + n), width, p, stream, CPU)[:, col : col + w]
    expected = dropped(x, keep, p, relu)
    y, mask = _drop(interpreted, x, p, stream, row * width + col, width, relu)
    assert torch.equal(mask, expected.ne(0) if relu else keep)
    step = 0 if dtype == torch.float32 else 2**-7
    torch.testing.assert_close(y, expected, rtol=step, atol=0, equal_nan=True)
    y_alone, none = _drop(interpreted, x, p, stream, row * width + col, width, relu, mask=False)
    assert none is None and torch.equal(y_alone.nan_to_num(), y.nan_to_num()), "no mask asked, the same values"


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_every_world_size_drops_the_same_elements(interpreted, world: int) -> None:
    n, width, stream = 1013, 37, 12345
    x = torch.randn(n, width)
    whole, _ = _drop(interpreted, x, 0.4, stream, 0, width, True)
    parts = []
    for r in range(world):
        a, b = Partition(n, world, r).rows()
        parts.append(_drop(interpreted, x[a:b], 0.4, stream, a * width, width, True)[0])
    assert torch.equal(torch.cat(parts), whole)


#: (dtype, bits, ReLU, whole rows, mask): each of the kernel's paths at least once
VARIANTS = [
    ("fp32", 1, False, True, False),
    ("fp32", 16, True, False, True),
    ("bf16", 8, True, True, True),
    ("bf16", 16, False, False, True),
]


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: "-".join(map(str, v)))
def test_the_kernel_builds_for_hopper_gpus(variant) -> None:
    """Triton compiles the kernel for sm_90 (H100, H200) down to a binary here, without a GPU: its types and
    operations hold where the interpreter does not check them (uint64 constants, the gather of each word's
    fields). Each word is hashed once, not once per element (a layout that replicates the hash would show)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    dtype, bits, relu, whole, mask = variant
    ints = dict.fromkeys(["first", "word0", "count", "rows", "cols", "width", "ldx", "threshold"], "i64")
    signature = {"x": f"*{dtype}", "y": f"*{dtype}", "keep": "*i1", **ints, "key": "u64", "scale": "fp32"}
    constants = {"BITS": bits, "RELU": relu, "WHOLE_ROWS": whole, "MASK": mask, "ELEMENTS": cuda_dropout._ELEMENTS}
    signature = {name: signature.get(name, "constexpr") for name in cuda_dropout._drop_kernel.arg_names}
    kernel = triton.compile(
        ASTSource(cuda_dropout._drop_kernel, signature, constants),
        target=GPUTarget("cuda", 90, 32),
        options={"enable_fp_fusion": False},
    )
    assert kernel.asm["cubin"]
    threads = kernel.metadata.num_warps * 32
    hashes = kernel.asm["ptx"].count(str(0xBF58476D1CE4E5B9 - 2**64))  # one multiply by it per word hashed
    assert hashes <= max(1, cuda_dropout._ELEMENTS * bits // 64 // threads)


def test_the_first_result_is_checked_against_torchs_ops(interpreted, monkeypatch, caplog) -> None:
    """What :func:`works` runs once per GPU, here in the interpreter: the kernel agrees with the mask torch's ops
    draw; a kernel that drops other elements does not, and takes torch's ops (with a warning in the log)."""
    check = gpu_kernels.checked.__wrapped__  # not cached
    assert check(CPU, interpreted._check, FALLBACK)
    key = interpreted.stream_key
    monkeypatch.setattr(interpreted, "stream_key", lambda stream: key(stream) ^ 1 << 62)  # the kernel's, not the mask's
    assert not check(CPU, interpreted._check, FALLBACK)
    assert FALLBACK in caplog.text and "differs" in caplog.text


def test_without_triton_the_log_says_why(monkeypatch, caplog) -> None:
    monkeypatch.setattr(gpu_kernels, "triton", None)
    monkeypatch.setattr(gpu_kernels, "_missing", "ModuleNotFoundError: No module named 'triton'")
    assert not gpu_kernels.checked.__wrapped__(CPU, cuda_dropout._check, FALLBACK)
    assert "takes torch's ops" in caplog.text and "No module named 'triton'" in caplog.text


def test_the_kernel_runs_only_on_a_gpu_that_checked_it(monkeypatch) -> None:
    """Not on a CPU tensor, and not with the project's kernels switched off (``NTP_NATIVE=0``)."""
    assert not cuda_dropout.works(CPU)
    monkeypatch.setattr(gpu_kernels, "checked", lambda device, check, what: True)
    assert cuda_dropout.works(torch.device("cuda", 0))
    monkeypatch.setenv("NTP_NATIVE", "0")
    assert not cuda_dropout.works(torch.device("cuda", 0))
