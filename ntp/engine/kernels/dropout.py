"""Dropout on row-layout activations with masks every world size and every device draws alike (ntp.engine.kernels.masks). A
kernel draws and applies a mask in one pass where one is built: on a CPU the C kernel (ntp.engine.kernels.native), inside the
product that follows the dropout where there is one (:meth:`RowDropout.linear`); on CUDA a Triton kernel
(ntp.engine.kernels.cuda_dropout). Elsewhere the mask is drawn, then applied."""

from __future__ import annotations

from typing import Callable, Protocol

import torch
from torch import nn

from ntp.engine.kernels import cuda_dropout, native, packed, streams
from ntp.engine.kernels.linear import linear
from ntp.engine.kernels.masks import field, keep_mask, stream_key, thread_parts
from ntp.engine.kernels.packed import pack_bits, pack_where, packed_bytes, unpack_bits

#: elements per OpenMP thread below which the C kernel runs on one (a parallel region costs microseconds)
_KERNEL_PART = 1 << 16


class Position(Protocol):
    """What a mask depends on besides the layer: the run's seed, the step, and the rank's first global row (a
    ntp.engine.parallel.context.GraphContext, which this module does not import: the context's memory plan asks it)."""

    seed: int
    step: int
    row_offset: int


class RowDropout(nn.Module):
    """Dropout on row-layout activations whose mask depends on (seed, step, layer, global row, column) only."""

    def __init__(self, p: float, layer_id: int) -> None:
        super().__init__()
        self.p = p
        self.layer_id = layer_id

    def forward(self, x: torch.Tensor, ctx: Position, relu: bool = False) -> torch.Tensor:
        """Dropout of ``x``, or with ``relu`` of ``relu(x)`` (see :func:`drop`)."""
        if not self.training or self.p == 0.0:
            return packed.relu(x) if relu else x
        return drop(x, self.p, self._stream(ctx), ctx.row_offset, relu)

    def linear(
        self,
        x: torch.Tensor,
        ctx: Position,
        weight: torch.Tensor,
        bias: torch.Tensor | None = None,
        module: nn.Module | None = None,
        relu: bool = False,
    ) -> torch.Tensor:
        """``linear(self(x, ctx, relu), weight, bias)``, or ``module(self(x, ctx, relu))`` for the Linear ``module``
        these are the parameters of (its hooks see the call: an embedding export hooks a decoupled model's Linears).
        Where :func:`drops_inside_product` and no hook waits on ``module``, block by block of rows
        (:class:`_DroppedLinear`): no dropped copy of ``x`` and no mask is made or kept."""
        hooked = module is not None and bool(module._forward_hooks or module._forward_pre_hooks)
        if (
            not self.training
            or self.p == 0.0
            or torch.is_autocast_enabled("cpu")
            or hooked
            or not drops_inside_product(x.device.type, x.dtype, x.numel() * x.element_size())
        ):
            x = self(x, ctx, relu)
            return module(x) if module is not None else linear(x, weight, bias)
        return _DroppedLinear.apply(x, weight, bias, self.p, self._stream(ctx), ctx.row_offset * x.shape[1], relu)

    def _stream(self, ctx: Position) -> int:
        return streams.stream(streams.Purpose.ENCODER, ctx.seed, ctx.step, self.layer_id)


def drops_inside_product(device_type: str, dtype: torch.dtype, nbytes: int) -> bool:
    """Whether :meth:`RowDropout.linear` drops an input of ``nbytes`` inside the product (keeping no dropped copy,
    no mask): a CPU float32 input of ``_FUSED_LEAST_BYTES`` or more, where the C kernel is built."""
    return (
        device_type == "cpu"
        and dtype == torch.float32
        and nbytes >= _FUSED_LEAST_BYTES
        and native.library() is not None
    )


def dropped_copy_bytes(device_type: str, dtype: torch.dtype, rows: int, width: int, p: float) -> int:
    """The most bytes :meth:`RowDropout.linear` holds for the dropped copy of a ``rows`` x ``width`` input that wants
    no gradient, at rate ``p`` (the memory plan's figure; ``rows``: the largest row block, the others have one fewer):
    nothing at rate 0, the whole copy, or inside the product a block of rows and the packed keep flags."""
    item = dtype.itemsize
    if p == 0.0:
        return 0
    if drops_inside_product(device_type, dtype, (rows - 1) * width * item):
        return min(rows, _block_rows(width, item)) * width * item + packed_bytes(rows * width)
    return rows * width * item


def one_pass(x: torch.Tensor) -> bool:
    """Whether a kernel drops ``x`` in one pass: the C kernel a CPU float32 or bfloat16 tensor, where it is built;
    the Triton kernel a CUDA floating-point tensor, where it works (:func:`cuda_dropout.works`)."""
    return _kernel_takes(x.device, x.dtype)


def _kernel_takes(device: torch.device, dtype: torch.dtype) -> bool:
    if device.type == "cpu":
        return dtype in native.DTYPE_CODES and native.library() is not None
    return dtype in cuda_dropout.DTYPES and cuda_dropout.works(device)


def drop(
    x: torch.Tensor,
    p: float,
    stream: int,
    first_row: int,
    relu: bool = False,
    *,
    column: int = 0,
    width: int | None = None,
) -> torch.Tensor:
    """Dropout of ``x`` (with ``relu``, of ``relu(x)``), whose element ``(i, j)`` is element
    ``(first_row + i, column + j)`` of the ``stream``'s mask ``width`` wide (``x``'s own width by default). Where
    :func:`one_pass`, drawn and dropped in one pass by a kernel; elsewhere the mask is drawn (:func:`keep_mask`),
    then applied (:func:`dropped`): the same values."""
    width = x.shape[1] if width is None else width
    if one_pass(x):
        return _NativeDropped.apply(x, p, stream, first_row * width + column, width, relu)
    rows, cols, device = (first_row, first_row + x.shape[0]), slice(column, column + x.shape[1]), x.device
    cut = lambda: keep_mask(rows, width, p, stream, device)[:, cols]  # noqa: E731 (holds no tensor)
    return dropped(x, cut(), p, relu, redraw=cut)


def dropped(
    x: torch.Tensor, keep: torch.Tensor, p: float, relu: bool = False, redraw: Callable[[], torch.Tensor] | None = None
) -> torch.Tensor:
    """``x`` with the elements ``keep`` drops zeroed and the others scaled by ``1 / (1 - p)``. With ``relu`` it is
    ``relu(x)`` dropped, in the same autograd node. What autograd keeps is the smallest form (:func:`kept_bytes`):
    with ``relu``, the result's nonzero flags packed (ntp.engine.kernels.packed); without, nothing where ``redraw``
    draws ``keep`` again (a counter-based mask), else ``keep`` packed."""
    return _Dropped.apply(x, keep.to(x.device), 1.0 / (1.0 - p), relu, redraw)


def kept_bytes(elements: int, relu: bool) -> int:
    """Bytes a dropout of ``elements`` elements (of a ReLU's result with ``relu``) keeps for its backward: the
    result's nonzero flags packed, or nothing where the counter-based mask is drawn again (:func:`drop`)."""
    return packed_bytes(elements) if relu else 0


class _Dropped(torch.autograd.Function):
    """The forward and the backward are the same masked scale. ReLU, where asked, runs in place on the dropped values,
    and the backward's mask is then the nonzero entries of the result (those both masks kept), packed; without it the
    backward draws the mask again."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, keep: torch.Tensor, scale: float, relu: bool, redraw) -> torch.Tensor:  # type: ignore[override]
        y = _masked_scale(x, keep, scale)
        if relu:
            y.relu_()
        wants = ctx.needs_input_grad[0]
        packs = wants and (relu or redraw is None)
        ctx.save_for_backward((pack_where(y, packed.nonzero) if relu else pack_bits(keep)) if packs else None)
        ctx.scale, ctx.redraw, ctx.shape = scale, None if relu else redraw, y.shape
        return y

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        (bits,) = ctx.saved_tensors
        keep = ctx.redraw() if bits is None else unpack_bits(bits, ctx.shape)
        return _masked_scale(grad, keep.to(grad.device), ctx.scale), None, None, None, None


def _masked_scale(x: torch.Tensor, keep: torch.Tensor, scale: float) -> torch.Tensor:
    """``x * keep * scale``. On a CPU the mask's bytes become floats first (one vectorised conversion), then one
    pass writes ``0 + scale * mask * x`` over them: a product with a uint8 or bool operand converts element by
    element and took 1.5-2x as long. On CUDA it is one pass: the kernel of torch's own dropout backward, which
    computes exactly this."""
    if x.device.type == "cpu":
        mask = keep.view(torch.uint8).to(x.dtype)
        return torch.addcmul(torch.zeros((), dtype=x.dtype), mask, x, value=scale, out=mask)
    return torch.ops.aten.native_dropout_backward(x, keep, scale)


class _NativeDropped(torch.autograd.Function):
    """:class:`_Dropped` with the mask drawn as it is applied, by a kernel (``csrc/dropout.c`` on torch's CPU
    threads, ntp.engine.kernels.cuda_dropout on CUDA): one pass reads ``x`` and writes the result and, only where a
    gradient is wanted after a ReLU, the result's nonzero flags, kept packed. The backward drops the gradient by them,
    or without a ReLU draws the same mask again (the kernels' pass over the gradient, keeping nothing)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, p: float, stream: int, first: int, width: int, relu: bool) -> torch.Tensor:  # type: ignore[override]
        y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        if x.device.type == "cpu":
            _drop_rows(x, y, None, p, stream, first, width, relu)
        else:
            cuda_dropout.drop_into(_rows(x), y, None, p, stream, first, width, relu)
        wants = ctx.needs_input_grad[0] and relu  # the kernels' mask: the nonzero results, here packed from them
        ctx.save_for_backward(pack_where(y, packed.nonzero) if wants else None)
        ctx.dropout = (p, stream, first, width)
        return y

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        (bits,) = ctx.saved_tensors
        p, stream, first, width = ctx.dropout
        out = torch.empty(grad.shape, dtype=grad.dtype, device=grad.device)
        if grad.device.type == "cpu":  # the kernel reads the packed flags, or draws the mask
            _drop_rows(grad, out, None, p, stream, first, width, False, flags_in=bits)
        elif bits is None:
            cuda_dropout.drop_into(_rows(grad), out, None, p, stream, first, width, False)
        else:
            out = _masked_scale(grad, unpack_bits(bits, grad.shape), 1.0 / (1.0 - p))
        return out, None, None, None, None, None


def _masked_scale_into(grad: torch.Tensor, mask: torch.Tensor, out: torch.Tensor, scale: float) -> torch.Tensor:
    """The C kernel's ``grad * mask * scale`` into ``out`` (contiguous, like ``grad`` and ``mask``; may be ``grad``)."""
    n = grad.numel()
    native.library().ntp_masked_scale(
        thread_parts(n, _KERNEL_PART),
        native.DTYPE_CODES[grad.dtype],
        grad.data_ptr(),
        mask.data_ptr(),
        out.data_ptr(),
        n,
        scale,
    )
    return out


def _drop_rows(
    x: torch.Tensor,
    y: torch.Tensor,
    mask: torch.Tensor | None,
    p: float,
    stream: int,
    first: int,
    width: int,
    relu: bool,
    flags_out: torch.Tensor | None = None,
    flags_in: torch.Tensor | None = None,
) -> None:
    """The C kernel's dropout of ``x`` into the contiguous ``y`` (and the backward's mask into ``mask``, if given).
    ``flags_out`` keeps the keep flags packed, a bit an element of ``x`` in row order; from ``flags_in`` they are read
    instead of drawn (:class:`_DroppedLinear`'s backward)."""
    x = _rows(x)
    bits, threshold = field(p)
    address = lambda t: None if t is None else t.data_ptr()  # noqa: E731
    native.library().ntp_dropout(
        thread_parts(x.numel(), _KERNEL_PART),
        native.DTYPE_CODES[x.dtype],
        x.data_ptr(),
        x.stride(0),
        y.data_ptr(),
        address(mask),
        address(flags_out),
        address(flags_in),
        x.shape[0],
        x.shape[1],
        first,
        width,
        stream_key(stream),
        bits,
        threshold,
        1.0 / (1.0 - p),
        relu,
    )


def _rows(x: torch.Tensor) -> torch.Tensor:
    """``x``, or a contiguous copy where its rows are not runs of elements the kernels read by a row stride."""
    return x if x.stride(1) == 1 and x.stride(0) >= x.shape[1] else x.contiguous()


#: bytes of ``x`` from which :class:`_DroppedLinear` pays: a smaller dropped copy stays in cache for the product, and
#: the second pass over ``x`` in the backward costs more than the copy (tolokers' hidden layer, 3 MB, 64 -> 2 columns:
#: 2.0 ms against 1.8 at one thread; cornell5's, 4.8 MB, and its 19 MB of features: even; 26 MB and more: faster)
_FUSED_LEAST_BYTES = 8 << 20

#: bytes of the block of rows :class:`_DroppedLinear` drops and multiplies at a time: it stays in cache (8 MB
#: blocks of cornell5's 249 features took up to twice as long; 2 MB blocks of 128 or 249 columns were the fastest)
_BLOCK_BYTES = 2 << 20


class _DroppedLinear(torch.autograd.Function):
    """``linear(x dropped, weight, bias)`` (with ``relu``, of ``relu(x)`` dropped; whole rows, from the global element
    ``first``) in blocks of rows: each block is dropped into one buffer that the product reads from cache, into its
    rows of the output. Autograd keeps ``x`` itself and the keep flags, packed (a bit an element: a 32nd of the
    dropped copy): the backward drops each block again from them for the weight's gradient and, where ``x`` wants
    one, scales ``x``'s gradient in place with the block's mask. Neither the dropped copy (written once, read twice in
    the plain order) nor its mask is ever made whole. Forward and backward at rate 0.5, one thread
    (``bench/dropout.py``; docs/benchmarks.md, section 2, has later runs and rate 0.3): the
    features, 100k x 128 -> 64, 62.8 ms with the dropped copy, 51.9 this way, 52.0 without dropout; a hidden layer
    with its ReLU, 100k x 64 -> 16, 18.0, 17.2 and 17.3."""

    @staticmethod
    def forward(
        ctx,
        x: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        p: float,
        stream: int,  # type: ignore[override]
        first: int,
        relu: bool,
    ) -> torch.Tensor:
        out = torch.empty(x.shape[0], weight.shape[0], dtype=x.dtype)
        flags = torch.empty(packed_bytes(x.numel()), dtype=torch.uint8) if any(ctx.needs_input_grad[:2]) else None
        for a, block, _ in _dropped_blocks(x, p, stream, first, relu, masks=False, flags_out=flags):
            rows = out[a : a + block.shape[0]]
            torch.mm(block, weight.t(), out=rows) if bias is None else torch.addmm(bias, block, weight.t(), out=rows)
        ctx.save_for_backward(x, weight, flags)
        ctx.dropout, ctx.scale, ctx.has_bias = (p, stream, first, relu), 1.0 / (1.0 - p), bias is not None
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        x, weight, flags = ctx.saved_tensors
        wants_x, wants_weight = ctx.needs_input_grad[:2]
        grad_x = torch.empty(x.shape, dtype=x.dtype) if wants_x else None
        grad_weight = torch.zeros_like(weight) if wants_weight else None
        if wants_x or wants_weight:
            for a, block, mask in _dropped_blocks(x, *ctx.dropout, masks=wants_x, flags_in=flags):
                rows = grad[a : a + block.shape[0]]
                if wants_weight:
                    grad_weight.addmm_(rows.t(), block)
                if wants_x:
                    into = grad_x[a : a + block.shape[0]]
                    _masked_scale_into(torch.mm(rows, weight, out=into), mask, into, ctx.scale)
        grad_bias = grad.sum(0) if ctx.has_bias and ctx.needs_input_grad[2] else None
        return grad_x, grad_weight, grad_bias, None, None, None, None


def _dropped_blocks(
    x: torch.Tensor,
    p: float,
    stream: int,
    first: int,
    relu: bool,
    masks: bool,
    flags_out: torch.Tensor | None = None,
    flags_in: torch.Tensor | None = None,
):
    """(first row, the rows from it dropped, their backward mask if ``masks``) for each block of ``_BLOCK_BYTES`` of
    ``x``'s rows, in one buffer (and one for the masks); the packed keep flags of all of ``x`` into ``flags_out`` or
    from ``flags_in`` (a block is a multiple of 8 rows, so the next one's flags start at a whole byte)."""
    step, width = _block_rows(x.shape[1], x.element_size()), x.shape[1]
    rows = min(x.shape[0], step)
    buffer = torch.empty(rows, width, dtype=x.dtype)
    mask_buffer = torch.empty(rows, width, dtype=torch.bool) if masks else None
    for a in range(0, x.shape[0], step):
        n = min(step, x.shape[0] - a)
        block, mask = buffer[:n], mask_buffer[:n] if masks else None
        flags = [None if f is None else f[a * width // 8 :] for f in (flags_out, flags_in)]
        _drop_rows(x[a : a + n], block, mask, p, stream, first + a * width, width, relu, *flags)
        yield a, block, mask


def _block_rows(width: int, item: int) -> int:
    return max(64, _BLOCK_BYTES // (width * item) // 8 * 8)


def layer_dropouts(input_p: float, p: float, layers: int) -> nn.ModuleList:
    """One :class:`RowDropout` before each of ``layers`` layers: ``input_p`` on the first one's input, ``p`` after."""
    return nn.ModuleList(RowDropout(rate, i) for i, rate in enumerate([input_p] + [p] * (layers - 1)))
