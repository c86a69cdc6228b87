"""Dropout on row-layout activations whose masks are a function of (stream, global row, column) alone, so every
world size drops the same elements: drawn in one vectorised pass (Philox on a CPU, windows of a hashed table on
CUDA), and on a CPU drawn and applied in one pass by the C kernel where it is built (ntp.engine.native), inside the
product that follows the dropout where there is one (:meth:`RowDropout.linear`)."""
from __future__ import annotations

import queue
import threading
from concurrent.futures import Future
from typing import Protocol

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ntp.engine import native
from ntp.engine.linear import linear

_MASK64 = (1 << 64) - 1


def _splitmix64(x: int) -> int:
    z = (x + 0x9E3779B97F4A7C15) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def keep_mask(rows: tuple[int, int], width: int, p: float, stream: int, device: torch.device) -> torch.Tensor:
    """Bernoulli(1-p) keep-mask for the global rows ``rows`` of a ``width``-wide matrix. Element ``(r, c)`` is a
    function of ``(stream, r, c)`` alone, so every world size draws the same mask for the same element, in one
    vectorised pass: Philox at the element's counter on CPU, windows of a hashed table on CUDA (no per-tile
    kernels)."""
    if device.type == "cpu":
        return philox_keep_mask(rows, width, p, stream)
    return window_keep_mask(rows, width, p, stream, device)


#: elements per thread below which one thread draws the whole mask (a thread hand-off costs more than it saves)
_PHILOX_BLOCK = 1 << 20


def philox_keep_mask(rows: tuple[int, int], width: int, p: float, stream: int) -> torch.Tensor:
    """Element ``(r, c)`` keeps when its field of Philox4x64's output keyed by ``stream`` (the ``bits`` bits from
    bit ``(r * width + c) * bits``) is at least ``p * 2^bits`` (:func:`_philox_field`). Large masks are cut into up
    to one block per torch thread, drawn at once: the first here, the others by helper threads (each generator jumps
    straight to its block's first word: the mask does not depend on the cut)."""
    start, stop = rows
    bits, threshold = _philox_field(p)
    first, last = start * width, stop * width
    lo, hi = first - first % 8, -(-last // 8) * 8  # whole bytes of single bits: blocks start at multiples of 8
    flags = np.empty(hi - lo, dtype=bool)
    parts = _parts(hi - lo, _PHILOX_BLOCK)
    cuts = [lo + (hi - lo) * i // parts // 8 * 8 for i in range(parts)] + [hi]
    key = _splitmix64(stream)
    blocks = [(flags[a - lo : b - lo], a, b, key, bits, threshold) for a, b in zip(cuts, cuts[1:])]
    handed = [_helper(i).run(_philox_block, *block) for i, block in enumerate(blocks[1:])]
    _philox_block(*blocks[0])
    for done in handed:
        done.result()
    return torch.from_numpy(flags[first - lo : last - lo].reshape(stop - start, width))


def _philox_field(p: float) -> tuple[int, int]:
    """The bits of Philox's output one element's keep flag reads, and the least value that keeps: 1 bit for
    p = 0.5 (the default: a sixteenth of the draws of 16-bit fields), 8 when ``p * 256`` is whole, else 16 (exact
    to 2^-16)."""
    bits = next((bits for bits in (1, 8) if (p * 2**bits).is_integer()), 16)
    return bits, min(int(p * 2**bits), 2**bits - 1)


def _parts(elements: int, least: int) -> int:
    """Into how many parts ``elements`` are cut: up to one per torch thread, each at least ``least`` elements."""
    return max(1, min(torch.get_num_threads(), elements // least))


#: elements per OpenMP thread below which the C kernel runs on one (a parallel region costs microseconds)
_KERNEL_PART = 1 << 16


class _Helper:
    """A thread that runs what it is handed, one call at a time. Each block of a mask goes to its own helper, so
    the blocks really run at once (a ThreadPoolExecutor hands a task to any idle thread: in an epoch one of its
    threads drew every block)."""

    def __init__(self, name: str) -> None:
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=self._serve, name=name, daemon=True).start()

    def run(self, fn, *args) -> Future:
        done: Future = Future()
        self._inbox.put((fn, args, done))
        return done

    def _serve(self) -> None:
        while True:
            fn, args, done = self._inbox.get()
            try:
                done.set_result(fn(*args))
            except BaseException as e:  # handed to the caller by done.result()
                done.set_exception(e)


_helpers: list[_Helper] = []


def _helper(i: int) -> _Helper:
    while len(_helpers) <= i:
        _helpers.append(_Helper(f"ntp-dropout-{len(_helpers)}"))
    return _helpers[i]


def _philox_block(out: np.ndarray, first: int, last: int, key: int, bits: int, threshold: int) -> None:
    """The keep flags of elements ``first:last`` (multiples of 8) into ``out`` (numpy draws, unpacks and compares
    without the GIL). A Philox counter gives 256 bits."""
    b0, b1 = first * bits // 8, last * bits // 8
    counter = b0 // 32
    gen = np.random.Philox(key=key)
    gen.advance(counter)
    raw = gen.random_raw(-(-b1 // 8) - 4 * counter).view(np.uint8)[b0 - 32 * counter : b1 - 32 * counter]
    if bits == 1:
        raw = np.unpackbits(raw, bitorder="little")
    elif bits == 16:
        raw = raw.view("<u2")
    np.greater_equal(raw, threshold, out=out)


#: entries of the keep table whose windows a CUDA mask's rows are (a power of two; about 0.1 ms to draw on a GPU)
_TABLE_ENTRIES = 1 << 22


def window_keep_mask(rows: tuple[int, int], width: int, p: float, stream: int, device: torch.device) -> torch.Tensor:
    """Row ``r`` of the mask is the ``width`` entries of a keep table (drawn for ``stream`` by
    :func:`hash_keep_mask`, 4M entries whatever the graph) that start at a hash of ``(stream, r)``, rounded down to a
    multiple of 8: one gather of 8-entry words instead of a dozen hash passes over each element (entry by entry, the
    gather took 0.75 ms for 2.4M x 100 on an H200; as words it left the epoch profile's top 25). Two rows' windows
    overlap with probability about ``2 width / 4M``; everything else is as independent as the hash."""
    words = -(-width // 8)
    table = hash_keep_mask((0, -(-(_TABLE_ENTRIES + 8 * words) // 64)), 64, p, stream, device).flatten()
    salt = _splitmix64(stream) ^ 0xA5A5A5A5A5A5A5A5
    start = _row_hash(rows, salt, device).bitwise_and_(_TABLE_ENTRIES // 8 - 1)
    packed = table.view(torch.int64).unfold(0, words, 1)[start.long()]  # [rows, words]: 8 entries a word
    return packed.view(torch.bool)[:, :width]


def _row_hash(rows: tuple[int, int], stream: int, device: torch.device) -> torch.Tensor:
    """A well-mixed int32 per global row of ``rows``, a function of ``(stream, row)``."""
    s = _splitmix64(stream)
    r = torch.arange(rows[0], rows[1], device=device, dtype=torch.int64)
    return _fmix32(_to_int32((r * 0x9E3779B1 + (s & 0xFFFFFFFF)) & 0xFFFFFFFF)) ^ _to_int32(torch.tensor(s >> 32))


def hash_keep_mask(rows: tuple[int, int], width: int, p: float, stream: int, device: torch.device) -> torch.Tensor:
    """Element ``(r, c)`` keeps when 24 bits of ``fmix32(key(stream, r) ^ key(c))`` (MurmurHash3's finaliser, in
    wrapping int32 arithmetic) are at least ``p * 2^24``: a few elementwise kernels on any device."""
    row_key = _row_hash(rows, stream, device)
    col_key = _fmix32(torch.arange(width, device=device, dtype=torch.int32) * 0x27D4EB2F + 0x165667B1)
    bits = _fmix32(row_key[:, None] ^ col_key[None, :])
    return bits.bitwise_and_(0xFFFFFF) >= int(round(p * (1 << 24)))


def _to_int32(x: torch.Tensor) -> torch.Tensor:
    """The int32 with the same low 32 bits as the non-negative int64 ``x``."""
    return (x & 0xFFFFFFFF).sub_(x.ge(1 << 31).long() << 32).to(torch.int32)


def _fmix32(x: torch.Tensor) -> torch.Tensor:
    x = x ^ ((x >> 16) & 0xFFFF)  # masked: int32 shifts are arithmetic
    x = x * -2048144789  # 0x85EBCA6B as int32; products wrap
    x = x ^ ((x >> 13) & 0x7FFFF)
    x = x * -1028477387  # 0xC2B2AE35
    return x ^ ((x >> 16) & 0xFFFF)


class Position(Protocol):
    """What a mask depends on besides the layer: the run's seed, the step, and the rank's first global row (a
    ntp.engine.context.GraphContext, which this module does not import: the context's memory plan asks it)."""

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
            return F.relu(x) if relu else x
        return drop(x, self.p, self._stream(ctx), ctx.row_offset, relu)

    def linear(self, x: torch.Tensor, ctx: Position, weight: torch.Tensor, bias: torch.Tensor | None = None,
               module: nn.Module | None = None, relu: bool = False) -> torch.Tensor:
        """``linear(self(x, ctx, relu), weight, bias)``, or ``module(self(x, ctx, relu))`` for the Linear ``module``
        these are the parameters of (its hooks see the call: an embedding export hooks a decoupled model's Linears).
        Where :func:`drops_inside_product` and no hook waits on ``module``, block by block of rows
        (:class:`_DroppedLinear`): no dropped copy of ``x`` and no mask is made or kept."""
        hooked = module is not None and bool(module._forward_hooks or module._forward_pre_hooks)
        if (not self.training or self.p == 0.0 or torch.is_autocast_enabled("cpu") or hooked
                or not drops_inside_product(x.device.type, x.dtype, x.numel() * x.element_size())):
            x = self(x, ctx, relu)
            return module(x) if module is not None else linear(x, weight, bias)
        return _DroppedLinear.apply(x, weight, bias, self.p, self._stream(ctx), ctx.row_offset * x.shape[1], relu)

    def _stream(self, ctx: Position) -> int:
        return (ctx.seed * 1_000_003 + ctx.step) * 1_009 + self.layer_id


def drops_inside_product(device_type: str, dtype: torch.dtype, nbytes: int) -> bool:
    """Whether :meth:`RowDropout.linear` drops an input of ``nbytes`` inside the product (keeping no dropped copy,
    no mask): a CPU float32 input of ``_FUSED_LEAST_BYTES`` or more, where the C kernel is built."""
    return (device_type == "cpu" and dtype == torch.float32 and nbytes >= _FUSED_LEAST_BYTES
            and native.library() is not None)


def dropped_copy_bytes(device_type: str, dtype: torch.dtype, rows: int, width: int) -> int:
    """The most bytes :meth:`RowDropout.linear` holds for the dropped copy of a ``rows`` x ``width`` input (the
    memory plan's figure; ``rows``: the largest row block, the others have one fewer): the whole copy, or inside the
    product a block of rows and its mask."""
    item = dtype.itemsize
    if drops_inside_product(device_type, dtype, (rows - 1) * width * item):
        return min(rows, _block_rows(width, item)) * width * (item + 1)
    return rows * width * item


def one_pass(x: torch.Tensor) -> bool:
    """Whether the C kernel drops ``x``: a CPU float32 or bfloat16 tensor, where the kernel is built."""
    return x.device.type == "cpu" and x.dtype in native.DTYPE_CODES and native.library() is not None


def drop(x: torch.Tensor, p: float, stream: int, first_row: int, relu: bool = False, *, column: int = 0,
         width: int | None = None) -> torch.Tensor:
    """Dropout of ``x`` (with ``relu``, of ``relu(x)``), whose element ``(i, j)`` is element
    ``(first_row + i, column + j)`` of the ``stream``'s mask ``width`` wide (``x``'s own width by default). Where
    :func:`one_pass`, drawn and dropped in one pass by the C kernel; elsewhere the mask is drawn (:func:`keep_mask`),
    then applied (:func:`dropped`): the same values."""
    width = x.shape[1] if width is None else width
    if one_pass(x):
        return _NativeDropped.apply(x, p, stream, first_row * width + column, width, relu)
    keep = keep_mask((first_row, first_row + x.shape[0]), width, p, stream, x.device)
    return dropped(x, keep[:, column : column + x.shape[1]], p, relu)


def dropped(x: torch.Tensor, keep: torch.Tensor, p: float, relu: bool = False) -> torch.Tensor:
    """``x`` with the elements ``keep`` drops zeroed and the others scaled by ``1 / (1 - p)``. Autograd keeps only
    the boolean mask (a float copy of it would hold 4x the bytes). With ``relu`` it is ``relu(x)`` dropped, in the
    same autograd node: one mask kept, and no ReLU output."""
    return _Dropped.apply(x, keep.to(x.device), 1.0 / (1.0 - p), relu)


class _Dropped(torch.autograd.Function):
    """The forward and the backward are the same masked scale. ReLU, where asked, runs in place on the dropped values,
    and the backward's mask is then the nonzero entries of the result (those both masks kept): on a CPU casting the
    non-negative result to bool costs a third of the comparison ``x > 0``."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, keep: torch.Tensor, scale: float, relu: bool) -> torch.Tensor:  # type: ignore[override]
        y = _masked_scale(x, keep, scale)
        if relu:
            keep = y.relu_().bool()
        ctx.save_for_backward(keep)
        ctx.scale = scale
        return y

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        (keep,) = ctx.saved_tensors
        return _masked_scale(grad, keep, ctx.scale), None, None, None


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
    """:class:`_Dropped` with the mask drawn as it is applied, by the C kernel (``csrc/dropout.c``) on torch's
    threads: one pass reads ``x`` and writes the result and, only where a gradient is wanted, the backward's mask
    (the nonzero results with ``relu``)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, p: float, stream: int, first: int, width: int, relu: bool) -> torch.Tensor:  # type: ignore[override]
        y = torch.empty(x.shape, dtype=x.dtype)
        mask = torch.empty(x.shape, dtype=torch.bool) if ctx.needs_input_grad[0] else None
        _drop_rows(x, y, mask, p, stream, first, width, relu)
        ctx.save_for_backward(mask)
        ctx.scale = 1.0 / (1.0 - p)
        return y

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        (mask,) = ctx.saved_tensors
        grad = grad.contiguous()
        return _masked_scale_into(grad, mask, torch.empty_like(grad), ctx.scale), None, None, None, None, None


def _masked_scale_into(grad: torch.Tensor, mask: torch.Tensor, out: torch.Tensor, scale: float) -> torch.Tensor:
    """The C kernel's ``grad * mask * scale`` into ``out`` (contiguous, like ``grad`` and ``mask``; may be ``grad``)."""
    n = grad.numel()
    native.library().ntp_masked_scale(_parts(n, _KERNEL_PART), native.DTYPE_CODES[grad.dtype], grad.data_ptr(),
                                      mask.data_ptr(), out.data_ptr(), n, scale)
    return out


def _drop_rows(x: torch.Tensor, y: torch.Tensor, mask: torch.Tensor | None, p: float, stream: int, first: int,
               width: int, relu: bool) -> None:
    """The C kernel's dropout of ``x`` into the contiguous ``y`` (and the backward's mask into ``mask``, if given)."""
    if x.stride(1) != 1 or x.stride(0) < x.shape[1]:
        x = x.contiguous()
    bits, threshold = _philox_field(p)
    native.library().ntp_dropout(_parts(x.numel(), _KERNEL_PART), native.DTYPE_CODES[x.dtype], x.data_ptr(),
                                 x.stride(0), y.data_ptr(), None if mask is None else mask.data_ptr(), x.shape[0],
                                 x.shape[1], first, width, _splitmix64(stream), bits, threshold, 1.0 / (1.0 - p), relu)


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
    rows of the output. Autograd keeps ``x`` itself: the backward drops each block again for the weight's gradient
    and, where ``x`` wants one, draws the block's mask to scale ``x``'s gradient in place, block by block. Neither
    the dropped copy (written once, read twice in the plain order) nor its mask is ever made whole. Forward and
    backward at one thread (``bench/dropout.py``): the features, 100k x 128 -> 64, 62.8 ms with the dropped copy,
    51.9 this way, 52.0 without dropout; a hidden layer with its ReLU, 100k x 64 -> 16, 18.0, 17.2 and 17.3."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, p: float, stream: int,  # type: ignore[override]
                first: int, relu: bool) -> torch.Tensor:
        out = torch.empty(x.shape[0], weight.shape[0], dtype=x.dtype)
        for a, block, _ in _dropped_blocks(x, p, stream, first, relu, masks=False):
            rows = out[a : a + block.shape[0]]
            torch.mm(block, weight.t(), out=rows) if bias is None else torch.addmm(bias, block, weight.t(), out=rows)
        ctx.save_for_backward(x, weight)
        ctx.dropout, ctx.scale, ctx.has_bias = (p, stream, first, relu), 1.0 / (1.0 - p), bias is not None
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        x, weight = ctx.saved_tensors
        wants_x, wants_weight = ctx.needs_input_grad[:2]
        grad_x = torch.empty(x.shape, dtype=x.dtype) if wants_x else None
        grad_weight = torch.zeros_like(weight) if wants_weight else None
        if wants_x or wants_weight:
            for a, block, mask in _dropped_blocks(x, *ctx.dropout, masks=wants_x):
                rows = grad[a : a + block.shape[0]]
                if wants_weight:
                    grad_weight.addmm_(rows.t(), block)
                if wants_x:
                    into = grad_x[a : a + block.shape[0]]
                    _masked_scale_into(torch.mm(rows, weight, out=into), mask, into, ctx.scale)
        grad_bias = grad.sum(0) if ctx.has_bias and ctx.needs_input_grad[2] else None
        return grad_x, grad_weight, grad_bias, None, None, None, None


def _dropped_blocks(x: torch.Tensor, p: float, stream: int, first: int, relu: bool, masks: bool):
    """(first row, the rows from it dropped, their backward mask if ``masks``) for each block of ``_BLOCK_BYTES`` of
    ``x``'s rows, in one buffer (and one for the masks)."""
    step = _block_rows(x.shape[1], x.element_size())
    rows = min(x.shape[0], step)
    buffer = torch.empty(rows, x.shape[1], dtype=x.dtype)
    mask_buffer = torch.empty(rows, x.shape[1], dtype=torch.bool) if masks else None
    for a in range(0, x.shape[0], step):
        n = min(step, x.shape[0] - a)
        block, mask = buffer[:n], mask_buffer[:n] if masks else None
        _drop_rows(x[a : a + n], block, mask, p, stream, first + a * x.shape[1], x.shape[1], relu)
        yield a, block, mask


def _block_rows(width: int, item: int) -> int:
    return max(64, _BLOCK_BYTES // (width * item))


def layer_dropouts(input_p: float, p: float, layers: int) -> nn.ModuleList:
    """One :class:`RowDropout` before each of ``layers`` layers: ``input_p`` on the first one's input, ``p`` after."""
    return nn.ModuleList(RowDropout(rate, i) for i, rate in enumerate([input_p] + [p] * (layers - 1)))
